"""``on_disagreement``: its validation, its schema, the disagreement test itself, and a split
vote through CrossAuditService (real engine, real SQLite store) becoming a stored review item.
The engine's behaviour is pinned as data in ``tests/cases/disagreement/``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jsonschema
import pytest

from crossaudit.kernel.dsl import DisagreementConfig
from crossaudit.kernel.errors import PolicyValidationError
from crossaudit.kernel.results import Verdict
from crossaudit.service.core import CrossAuditService
from crossaudit.service.tenants import TenantFeedback, UploadedEvaluators
from crossaudit.store import SQLiteStore
from orchestrator.engine.consensus import Ballot, disagreement
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy
from orchestrator.reviews import ReviewState
from tests.conftest import ROOT

HEAD = """\
name: p
description: d
version: "1.0"
evaluators:
  - {name: a, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
  - {name: b, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
rules:
"""
TWO = "  - {name: r, evaluators: [{name: a}, {name: b}], on_disagreement: %s}\n"


def issues_of(text: str) -> list[str]:
    with pytest.raises(PolicyValidationError) as info:
        load_policy(text, "p.yaml")
    return [str(i) for i in info.value.issues]


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule",
    [
        "  - {name: r, evaluator: a, on_disagreement: require_review}\n",
        "  - {name: r, evaluator: a, on_disagreement: decide}\n",
        "  - {name: r, evaluator: a, on_disagreement: {min_spread: 0.5}}\n",
        "  - {name: r, evaluators: [{name: a}], on_disagreement: require_review}\n",
    ],
)
def test_a_single_evaluator_rule_cannot_have_on_disagreement(rule: str) -> None:
    [msg] = issues_of(HEAD + rule)
    assert msg.startswith("p.yaml:8:")
    assert "rules[0].on_disagreement: on_disagreement needs 'evaluators' (two or more)" in msg
    assert "one evaluator cannot disagree with itself" in msg


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{min_spread: 1.5}", "rules[0].on_disagreement.min_spread: Input should be less than or equal to 1"),
        ("{min_spread: -0.1}", "rules[0].on_disagreement.min_spread: Input should be greater than or equal to 0"),
        ("{min_spread: high}", "rules[0].on_disagreement.min_spread: Input should be a valid number"),
        ("{min_spread: true}", "rules[0].on_disagreement.min_spread: Input should be a valid number"),
        ("escalate", "rules[0].on_disagreement.action: Input should be 'require_review' or 'decide'"),
        ("{action: block}", "rules[0].on_disagreement.action: Input should be 'require_review' or 'decide'"),
        ("3", "rules[0].on_disagreement: on_disagreement is 'require_review', 'decide' or a mapping, got 3"),
        ("{max_review_time: soon}", "rules[0].on_disagreement.max_review_time: String should match pattern"),
        (
            "{auto_approve_after: 4000d}",
            "rules[0].on_disagreement.auto_approve_after: duration '4000d' is longer than the maximum",
        ),
        (
            "{reviewer: x}",
            "rules[0].on_disagreement.reviewer: unknown field 'reviewer' (did you mean 'reviewer_role'?)",
        ),
    ],
)
def test_bad_on_disagreement_values_are_located(value: str, expected: str) -> None:
    msgs = issues_of(HEAD + TWO % value)
    assert any(expected in m for m in msgs), msgs
    assert all(m.startswith("p.yaml:8:") for m in msgs)


def test_review_settings_are_validated_like_a_require_review_action_config() -> None:
    """The same durations, bounds and fields: ``on_disagreement`` reuses RequireReviewConfig."""
    bad = "{max_review_time: 4000d, auto_approve_after: soon, reviewer: x}"
    as_action = issues_of(HEAD + f"  - {{name: r, evaluator: a, action: require_review, action_config: {bad}}}\n")
    as_disagreement = issues_of(HEAD + TWO % bad)
    assert len(as_action) == len(as_disagreement) == 3

    def fields_and_messages(msgs: list[str], prefix: str) -> list[str]:
        return sorted(m.split(prefix, 1)[1] for m in msgs)

    assert fields_and_messages(as_action, "rules[0].action_config.") == fields_and_messages(
        as_disagreement, "rules[0].on_disagreement."
    )


def test_string_and_object_forms_normalise_to_one_model() -> None:
    short = load_policy(HEAD + TWO % "require_review", "p.yaml").rules[0].on_disagreement
    assert short == DisagreementConfig(action="require_review", min_spread=0.3)
    assert short is not None and short.reviews
    off = load_policy(HEAD + TWO % "decide", "p.yaml").rules[0].on_disagreement
    assert off is not None and not off.reviews
    full = load_policy(
        HEAD + TWO % "{min_spread: 0.5, reviewer_role: panel, max_review_time: 2h, auto_approve_after: 24h}",
        "p.yaml",
    ).rules[0]
    assert full.on_disagreement is not None
    assert (full.on_disagreement.action, full.on_disagreement.min_spread) == ("require_review", 0.5)
    assert (full.on_disagreement.reviewer_role, full.on_disagreement.max_review_time) == ("panel", "2h")
    unset = load_policy(HEAD + "  - {name: r, evaluators: [{name: a}, {name: b}]}\n", "p.yaml").rules[0]
    assert unset.on_disagreement is None


def test_the_committed_schema_accepts_both_forms_and_describes_the_field() -> None:
    schema = json.loads((ROOT / "policies" / "policy.schema.json").read_text())
    field = schema["$defs"]["Rule"]["properties"]["on_disagreement"]
    assert "split vote" in field["description"]
    assert "min_spread" in schema["$defs"]["DisagreementConfig"]["properties"]
    assert schema["$defs"]["DisagreementConfig"]["properties"]["min_spread"]["description"]

    def check(value: object) -> None:
        doc = {
            "name": "p",
            "description": "d",
            "version": "1.0",
            "evaluators": [{"name": "a", "type": "custom", "config": {"code": "x"}}],
            "rules": [{"name": "r", "evaluators": [{"name": "a"}, {"name": "a"}], "on_disagreement": value}],
        }
        jsonschema.validate(doc, schema)

    for ok in ("require_review", "decide", {"min_spread": 0.3, "reviewer_role": "x", "max_review_time": "2h"}):
        check(ok)
    for bad in ("escalate", {"min_spread": 2}, {"reviewer": "x"}, 3):
        with pytest.raises(jsonschema.ValidationError):
            check(bad)


# --- the disagreement test ----------------------------------------------------------------------


def ballot(score: float | None, threshold: float = 0.5) -> Ballot:
    return Ballot(score=score, weight=1.0, vote=score is not None and score >= threshold)


def test_split_votes_far_apart_disagree() -> None:
    got = disagreement([ballot(0.9), ballot(0.8), ballot(0.2)], 0.3)
    assert got == "evaluators disagree: 2 pass / 1 fail, spread 0.70 >= 0.30; sent to review"


def test_agreement_or_a_small_spread_is_not_a_disagreement() -> None:
    assert disagreement([ballot(0.9), ballot(0.6)], 0.0) is None  # all pass
    assert disagreement([ballot(0.1), ballot(0.45)], 0.0) is None  # all fail
    assert disagreement([ballot(0.58), ballot(0.42)], 0.3) is None  # split, spread 0.16


def test_a_spread_equal_to_min_spread_counts_despite_float_rounding() -> None:
    assert 0.7 - 0.4 < 0.3  # what the tolerance is for
    assert disagreement([ballot(0.7), ballot(0.4)], 0.3) is not None


def test_evaluators_without_a_verdict_are_not_votes() -> None:
    assert disagreement([ballot(0.9), ballot(None)], 0.3) is None  # the fail-closed vote decides
    assert disagreement([ballot(None), ballot(None)], 0.0) is None
    got = disagreement([ballot(0.9), ballot(0.1), ballot(None)], 0.3)
    assert got is not None and "1 pass / 1 fail, spread 0.80" in got


def test_an_explicit_passed_false_is_a_fail_vote() -> None:
    no = Ballot(score=0.9, weight=1.0, vote=False)  # score clears, evaluator said passed: false
    assert disagreement([ballot(0.3), no], 0.3) is None  # both fail
    assert disagreement([ballot(0.95), no], 0.3) is None  # split, but spread 0.05


# --- through the service: a split vote becomes a stored review item ----------------------------

POLICY = textwrap.dedent(
    """\
    name: judges
    description: three judges; a split vote goes to a person
    version: "1.0"
    evaluators:
      - {name: strict, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
      - {name: lenient, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
      - {name: middle, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
    rules:
      - name: panel
        evaluators: [{name: strict}, {name: lenient}, {name: middle}]
        consensus_strategy: majority
        threshold: 0.5
        action: block
        action_config: {message: "blocked by the panel"}
        on_disagreement:
          min_spread: 0.3
          reviewer_role: safety_panel
          max_review_time: 2h
          auto_approve_after: 24h
    """
)


class Judge(Evaluator):
    """``strict`` fails responses that hedge; the others pass everything."""

    kind = "custom"

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        if self.name == "strict" and "maybe" in inp.response:
            return Verdict(score=0.1)
        return Verdict(score=0.9 if self.name == "lenient" else 0.8)


class Judges:
    def build(self, spec: object, policy: object) -> Evaluator:
        return Judge(spec.name)  # type: ignore[attr-defined]


@pytest.fixture
async def store(tmp_path: Path):
    s = SQLiteStore(tmp_path / "db.sqlite")
    yield s
    await s.aclose()


async def test_a_split_vote_is_stored_as_a_require_review_item(store: SQLiteStore) -> None:
    engine = Engine(Judges())

    def provider(tenant: str, uploads: UploadedEvaluators, feedback: TenantFeedback) -> Engine:
        return engine

    svc = CrossAuditService(store, provider)
    await svc.deploy_policy("t1", POLICY)
    agreed = await svc.evaluate("t1", policy="judges", prompt="p", response="a clear answer")
    assert agreed.decision.passed and agreed.review_ids == []

    split = await svc.evaluate("t1", policy="judges", prompt="p", response="maybe, maybe not")
    d = split.decision
    assert not d.passed and d.action.value == "require_review"  # not the rule's block
    [rule] = d.rules
    assert rule.disagreement and rule.action is not None and rule.action.value == "require_review"
    assert rule.reason.startswith("evaluators disagree: 2 pass / 1 fail, spread 0.80 >= 0.30; sent to review")
    assert [(e.evaluator, e.score, e.status.value) for e in rule.evaluators] == [
        ("strict", 0.1, "fail"),
        ("lenient", 0.9, "pass"),
        ("middle", 0.8, "pass"),
    ]

    [item] = await store.list_reviews("t1", state=ReviewState.OPEN)
    assert split.review_ids == [item.id]
    assert item.kind.value == "require_review" and item.rule == "panel"
    assert item.decision_id == d.decision_id
    assert item.params["reviewer_role"] == "safety_panel"
    assert item.params["max_review_time"] == "2h" and item.params["review_due_at"]
    assert item.params["auto_approve_after"] == "24h" and item.params["auto_approve_at"]
    assert item.params["disagreement"] == rule.reason
    assert "message" not in item.params  # the rule's own (block) action_config is not the review's
    assert "min_spread" not in item.params and "action" not in item.params
    audit = await store.get_decision("t1", d.decision_id)
    assert audit.action == "require_review"
    await engine.aclose()
