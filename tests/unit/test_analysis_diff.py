"""``policy diff --symbolic`` (crossaudit/analysis/symdiff.py): a threshold change gives exactly
the region between the thresholds; a reordered, reformatted policy is equivalent; each region's
witness is decided by the engine as claimed."""

from __future__ import annotations

from crossaudit.analysis import SolverLimits, symbolic_diff
from tests.unit.analysis_helpers import agrees, live_decision, policy

V1 = """\
  - {name: safety, evaluator: a, threshold: 0.5, action: block, priority: 10}
  - name: free_tier
    evaluator: b
    threshold: 0.6
    action: flag
    conditions: [{field: user.tier, operator: equals, value: free}]
"""


def test_a_threshold_change_gives_exactly_the_region_between_the_thresholds() -> None:
    old, new = policy(V1), policy(V1.replace("threshold: 0.5", "threshold: 0.72"))
    report = symbolic_diff(old, new)
    assert report.equivalent is False and report.bugs == [] and not report.truncated
    assert report.regions
    for region in report.regions:
        assert region.scores["a"] == {"min": 0.5, "min_included": True, "max": 0.72, "max_included": False}
        assert "a's score in [0.5, 0.72)" in region.when
        assert region.new == {"passed": False, "action": "block", "modified": False}
        assert region.witness is not None and region.engine is not None
        agrees(old, region.witness, region.engine["old"])
        agrees(new, region.witness, region.engine["new"])
    # old passes, or flags a free-tier request: two pairs of outcomes, no other
    assert sorted((r.old["passed"], r.old["action"]) for r in report.regions) == [(False, "flag"), (True, "allow")]
    # and outside the region nothing differs (the engine, on scores either side of it)
    for score in (0.0, 0.3, 0.4999, 0.72, 0.8, 1.0):
        for tier in ("free", "pro"):
            w = {
                "stage": None,
                "context": {"user": {"tier": tier}},
                "evaluators": {"a": {"score": score}, "b": {"score": 0.1}},
            }
            a, b = live_decision(old, w), live_decision(new, w)
            assert (a.passed, a.action) == (b.passed, b.action)


def test_a_reordered_and_reformatted_policy_is_equivalent() -> None:
    reordered = """\
  - name: free_tier
    conditions:
      - {value: "free", operator: equals, field: user.tier}
    action: flag
    threshold: 0.60
    evaluator: b
    enabled: true
  - {priority: 10, name: safety, action: block, threshold: 0.5, evaluator: a, stage: both}
"""
    report = symbolic_diff(policy(V1), policy(reordered, evaluators=("c", "b", "a")))
    assert report.equivalent is True
    assert report.regions == [] and report.rules == [] and report.bugs == []


def test_a_condition_change_names_the_context_it_needs() -> None:
    new = policy(V1.replace("value: free", "value: pro"))
    report = symbolic_diff(policy(V1), new)
    assert report.equivalent is False and report.bugs == []
    words = [w for r in report.regions for w in r.when]
    assert any("user.tier equals 'free'" in w or "user.tier equals 'pro'" in w for w in words)


def test_rule_outcomes_are_compared_too() -> None:
    report = symbolic_diff(policy(V1), policy(V1.replace("threshold: 0.6", "threshold: 0.7")))
    changed = {c.rule: c for c in report.rules}
    assert set(changed) == {"free_tier"}
    region = changed["free_tier"].region
    assert region is not None and region.scores["b"]["min"] == 0.6 and region.scores["b"]["max"] == 0.7


def test_an_unsettled_diff_is_unknown() -> None:
    report = symbolic_diff(policy(V1), policy(V1.replace("0.5", "0.7")), limits=SolverLimits(rlimit=1))
    assert report.equivalent is None and report.regions == []
