"""``policy analyze`` (crossaudit/analysis): a planted defect of each kind is found, with a witness
the engine reproduces where one exists; the guide's examples and the shipped policies give no
false finding; a query the solver does not settle is ``unknown``."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit.analysis import SolverLimits, analyze
from crossaudit.kernel.dsl import WeightedEvaluator
from orchestrator.policy import load_policy_file
from tests.unit.analysis_helpers import agrees, policy

ROOT = Path(__file__).resolve().parents[2]

# kind, rules, the rule named, whether the finding carries a witness
PLANTED = [
    (
        "never-decides",
        """\
  - {name: strict_first, evaluator: a, threshold: 0.5, action: block, priority: 100}
  - {name: dead_second, evaluator: a, threshold: 0.3, action: block, priority: 50}
""",
        "dead_second",
        True,
    ),
    (
        "never-decides",  # its action is never the most severe: a stricter rule on the same score fails with it
        """\
  - {name: review, evaluator: a, threshold: 0.6, action: require_review}
  - {name: flag_too, evaluator: a, threshold: 0.4, action: flag}
  - {name: other, evaluator: b, threshold: 0.5, action: warn}
""",
        "flag_too",
        True,
    ),
    (
        "conditions-never-hold",  # across operators: validation's per-field check does not see it
        """\
  - name: never_applies
    evaluator: a
    conditions: [{field: content.length, operator: greater_than, value: 100},
                 {field: content.length, operator: in, value: [10, 20]}]
""",
        "never_applies",
        False,
    ),
    (
        "regex-never-matches",  # days of the week are lower case
        """\
  - name: mondays
    evaluator: a
    conditions: [{field: time.day_of_week, operator: regex_match, value: "^Mon"}]
""",
        "mondays",
        False,
    ),
    (
        "condition-always-holds",
        """\
  - name: long_enough
    evaluator: a
    conditions: [{field: content.length, operator: greater_than, value: -1},
                 {field: user.tier, operator: equals, value: free}]
""",
        "long_enough",
        False,
    ),
    (
        "inert-threshold",
        """\
  - {name: never_fails, evaluator: a, threshold: 0.0, action: flag}
""",
        "never_fails",
        True,
    ),
    (
        "inert-threshold",  # after dynamic modifiers: 0.2 - 0.5 x sensitivity, clamped, never above 0 when ...
        """\
  - name: dynamic_zero
    evaluator: a
    threshold: dynamic
    threshold_config: {base_threshold: 0.0, user_trust_modifier: -0.5}
    action: flag
""",
        "dynamic_zero",
        True,
    ),
    (
        "threshold-zero-sometimes",
        """\
  - name: sometimes_zero
    evaluator: a
    threshold: dynamic
    threshold_config: {base_threshold: 0.3, content_sensitivity_modifier: -0.5}
    action: flag
""",
        "sometimes_zero",
        True,
    ),
    (
        "consensus-cannot-fail",
        """\
  - name: lenient
    evaluators: [{name: a}, {name: b}]
    consensus_strategy: weighted_average
    threshold: 0.0
    action: flag
""",
        "lenient",
        False,
    ),
    (
        "fallback-never-used",  # validation only warns of it
        """\
  - {name: same_fallback, evaluator: a, action: warn, fallback: {evaluator: a}}
""",
        "same_fallback",
        False,
    ),
    (
        "on-error-never-used",  # modify with no verdict is escalated to block anyway
        """\
  - {name: redundant, evaluator: a, action: modify, fallback: {on_error: block}}
""",
        "redundant",
        False,
    ),
    (
        "previous-rule-never-set",  # whenever gate's action is set (it blocked), gate stopped processing
        """\
  - {name: gate, evaluator: a, threshold: 0.5, action: block, priority: 100, fallback: {on_error: allow}}
  - name: reads_gate
    evaluator: b
    action: flag
    conditions: [{field: previous_rule.gate.action, operator: equals, value: block}]
""",
        "reads_gate",
        False,
    ),
    (
        "never-runs",  # gate's passed is false only when it failed, and then it stopped processing
        """\
  - {name: gate, evaluator: a, threshold: 0.5, action: block, priority: 100, fallback: {on_error: allow}}
  - name: after_gate_failed
    evaluator: b
    action: flag
    conditions: [{field: previous_rule.gate.passed, operator: equals, value: false}]
""",
        "after_gate_failed",
        True,
    ),
    (
        "records-only",
        """\
  - {name: logs, evaluator: a, action: continue}
  - {name: decides, evaluator: b, action: block}
""",
        "logs",
        False,
    ),
]


@pytest.mark.parametrize(("kind", "rules", "rule", "witnessed"), PLANTED, ids=[f"{k}-{r}" for k, _, r, _ in PLANTED])
def test_a_planted_defect_is_found_with_a_witness_the_engine_reproduces(
    kind: str, rules: str, rule: str, witnessed: bool
) -> None:
    p = policy(rules)
    report = analyze(p)
    assert report.bugs == []
    found = [f for f in report.findings if f.kind == kind and rule in f.rules]
    assert found, [(f.kind, f.rules) for f in report.findings]
    f = found[0]
    assert f.proved and rule in f.message
    if witnessed:
        assert f.witness is not None and f.engine is not None, f.message
        agrees(p, f.witness, f.engine)  # the live engine (scripted evaluators) decides it so too
        assert f.engine["rules"][rule] in {"skipped", "pass", "fail", "error", "timeout"}


def test_the_issue_example_gives_each_of_its_three_findings() -> None:
    p = policy("""\
  - {name: strict_first, evaluator: a, threshold: 0.5, action: block, priority: 100}
  - {name: dead_second, evaluator: a, threshold: 0.3, action: block, priority: 50}
  - name: never_applies
    evaluator: a
    conditions: [{field: content.length, operator: greater_than, value: 100},
                 {field: content.length, operator: in, value: [10, 20]}]
  - {name: never_fails, evaluator: a, threshold: 0.0, action: flag}
""")
    kinds = {(f.kind, tuple(f.rules)) for f in analyze(p).findings}
    assert ("never-decides", ("dead_second",)) in kinds
    assert ("conditions-never-hold", ("never_applies",)) in kinds
    assert ("inert-threshold", ("never_fails",)) in kinds


def test_the_witness_of_a_shadowed_rule_shows_it_would_fail_and_changes_nothing() -> None:
    p = policy("""\
  - {name: strict_first, evaluator: a, threshold: 0.5, action: block, priority: 100}
  - {name: dead_second, evaluator: a, threshold: 0.3, action: block, priority: 50}
""")
    f = next(f for f in analyze(p).findings if f.kind == "never-decides")
    assert f.witness is not None and f.witness["evaluators"]["a"]["score"] < 0.3  # it would fail ...
    assert f.engine is not None and f.engine["rules"] == {"strict_first": "fail", "dead_second": "skipped"}


def test_a_disagreement_that_cannot_occur() -> None:
    """A consensus of one evaluator with itself never splits (validation refuses the duplicate in a
    file; a policy built otherwise is analysed all the same)."""
    p = policy("""\
  - name: split
    evaluators: [{name: a}, {name: b}]
    consensus_strategy: majority
    on_disagreement: require_review
    action: flag
""")
    p.rules[0].evaluators = [WeightedEvaluator(name="a"), WeightedEvaluator(name="a")]
    report = analyze(p)
    assert any(f.kind == "disagreement-impossible" for f in report.findings)
    assert report.bugs == []


def test_a_possible_disagreement_is_not_reported() -> None:
    p = policy("""\
  - name: split
    evaluators: [{name: a}, {name: b}]
    consensus_strategy: majority
    on_disagreement: {action: require_review, min_spread: 0.9}
    action: flag
""")
    assert not any(f.kind == "disagreement-impossible" for f in analyze(p).findings)


SHIPPED = sorted([*ROOT.glob("policies/*.yaml"), *ROOT.glob("policies/guide/*.yaml")])
# What the shipped policies produce (docs/analysis.md explains each): none today.
EXPECTED_SHIPPED: dict[str, list[str]] = {}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_guide_examples_and_shipped_policies_give_no_false_finding(path: Path) -> None:
    report = analyze(load_policy_file(str(path), env={}))
    assert report.bugs == []
    assert not [f for f in report.findings if f.severity == "error"]
    assert [f.kind for f in report.findings if f.severity == "warning"] == EXPECTED_SHIPPED.get(path.name, [])


def test_a_query_the_solver_does_not_settle_is_unknown_never_proved() -> None:
    p = policy("""\
  - {name: strict_first, evaluator: a, threshold: 0.5, action: block, priority: 100}
  - {name: dead_second, evaluator: a, threshold: 0.3, action: block, priority: 50}
  - {name: never_fails, evaluator: b, threshold: dynamic, threshold_config: {base_threshold: 0.0}, action: flag}
""")
    report = analyze(p, SolverLimits(rlimit=1))  # z3 gives up after one step: what a timeout does
    assert report.findings, "nothing reported"
    assert all(f.kind == "unknown" and not f.proved and f.severity == "info" for f in report.findings)
    assert report.at_least("warning") == []
    assert "within the solver's limit" in report.findings[0].message


def test_the_json_report_has_its_documented_keys() -> None:
    doc = analyze(policy("  - {name: r, evaluator: a}\n")).to_json()
    assert set(doc) == {"policy", "version", "findings", "counts", "not_modelled", "analysis_bugs", "seconds", "solver"}
    assert set(doc["counts"]) == {"info", "warning", "error"}
    assert any("free in [0, 1]" in n for n in doc["not_modelled"])
