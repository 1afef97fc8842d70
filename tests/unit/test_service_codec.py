"""The one codec (``crossaudit.api.convert``): what a servicer encodes, the SDK decodes back
to the same record or model (tenant aside: no message carries it)."""

from __future__ import annotations

import dataclasses

import pytest

from crossaudit.api import convert
from crossaudit.api.errors import item_fields
from crossaudit.api.models import DeployResult, PolicyInfo, ReviewInfo, RollbackResult, ServerInfo
from crossaudit.api.records import (
    AuditRecord,
    DeploymentRecord,
    EvaluatorRecord,
    PolicySummaryRecord,
    PolicyVersionRecord,
    ReviewRecord,
)
from crossaudit.kernel.errors import InvalidInputError, NotFoundError
from crossaudit.kernel.results import Action, ActionOutcome, Decision, EvaluatorResult, RuleResult, Span, Status
from crossaudit.v1 import evaluation_pb2 as ev_pb
from orchestrator.reviews import ReviewKind, ReviewState

T0 = 1_700_000_000.5  # exact in binary: timestamps round-trip to the same float

VERSION = PolicyVersionRecord("t", "p", 3, "1.2", "d" * 64, "desc", "name: p\n", T0)
DEPLOYMENT = DeploymentRecord("t", "p", "staging", 3, T0 + 1)
EVALUATOR = EvaluatorRecord("0" * 36, "t", "scorer", 2, "python", ("textblob>=0.18",), "e" * 64, "code\n", "d", T0)


def untenanted(record: object) -> object:
    return dataclasses.replace(record, tenant="")  # type: ignore[type-var]


def test_policy_answers_round_trip() -> None:
    assert convert.version_from_pb(convert.version_to_pb(VERSION), VERSION.content) == untenanted(VERSION)
    assert convert.version_from_pb(convert.version_to_pb(VERSION)).content == ""  # deploy answers leave it out
    assert convert.deployment_from_pb(convert.deployment_to_pb(DEPLOYMENT)) == untenanted(DEPLOYMENT)
    summary = PolicySummaryRecord("p", 3, (DEPLOYMENT,))
    assert convert.summary_from_pb(convert.summary_to_pb(summary)) == PolicySummaryRecord(
        "p", 3, (untenanted(DEPLOYMENT),)
    )
    deployed = convert.deploy_result_from_pb(convert.deploy_result_to_pb(DeployResult(VERSION, DEPLOYMENT, True)))
    assert deployed.created and deployed.deployment == untenanted(DEPLOYMENT) and deployed.version.version == 3
    info = convert.policy_info_from_pb(convert.policy_info_to_pb(PolicyInfo(VERSION, (DEPLOYMENT,))))
    assert info.content == VERSION.content and info.version == untenanted(VERSION)
    rb = convert.rollback_from_pb(convert.rollback_to_pb(RollbackResult(DEPLOYMENT, 2)))
    assert (rb.deployment, rb.previous_version) == (untenanted(DEPLOYMENT), 2)


def test_evaluator_answers_round_trip() -> None:
    assert convert.evaluator_from_pb(convert.evaluator_to_pb(EVALUATOR, include_code=True)) == untenanted(EVALUATOR)
    assert convert.evaluator_from_pb(convert.evaluator_to_pb(EVALUATOR)).code == ""
    uploaded = convert.uploaded_from_pb(convert.uploaded_to_pb(EVALUATOR, created=True))
    assert uploaded.created and uploaded.id == EVALUATOR.id and uploaded.dependencies == EVALUATOR.dependencies


def test_review_answers_carry_the_record_and_the_read_time_flags() -> None:
    rec = ReviewRecord(
        "r", "t", "dec", "p", 1, "production", "no_bad", ReviewKind.FLAG, ReviewState.OPEN,
        params={"severity": "high", "escalate_at": "2020-01-01T00:00:00+00:00"}, created_at=T0,
    )  # fmt: skip
    back = convert.review_from_pb(convert.review_to_pb(rec))
    assert isinstance(back, ReviewInfo) and back.escalated and not back.overdue
    assert ReviewRecord(**{f.name: getattr(back, f.name) for f in dataclasses.fields(ReviewRecord)}) == untenanted(rec)
    resolved = dataclasses.replace(rec, state=ReviewState.APPROVED, resolved_at=T0 + 2, reviewer="ann", note="ok")
    back = convert.review_from_pb(convert.review_to_pb(resolved))
    assert (back.state, back.resolved_at, back.reviewer, back.escalated) == (ReviewState.APPROVED, T0 + 2, "ann", False)


def test_audit_records_round_trip_with_and_without_raw_text() -> None:
    rec = AuditRecord(
        "dec", "t", "p", 2, "1.0", "d" * 64, "production", False, "flag",
        [{"rule": "no_bad", "status": "fail", "score": 0.0}], ["broken"], 12.5,
        "a" * 64, "b" * 64, "c" * 64, T0, request_id="r1",
    )  # fmt: skip
    assert convert.audit_from_pb(convert.audit_to_pb(rec)) == untenanted(rec)
    raw = dataclasses.replace(rec, prompt="", response="hi", modified_response_sha256="f" * 64)
    assert convert.audit_from_pb(convert.audit_to_pb(raw)) == untenanted(raw)  # an empty prompt stays ""


def test_server_info_round_trips() -> None:
    info = ServerInfo("1.0", "acme", True, "process", "restricted python", True)
    assert convert.server_info_from_pb(convert.server_info_to_pb(info)) == info


def test_decisions_and_stream_items_round_trip() -> None:
    outcome = ActionOutcome(rule="no_bad", action=Action.FLAG, params={"severity": "high"})
    ev = EvaluatorResult(
        evaluator="has_bad", kind="custom", status=Status.FAIL, score=0.0, passed=False, violations=["bad"],
        details={"n": 1.0}, spans=[Span(start=0, end=3, label="bad", score=1.0)], attempts=1,
        provenance={"kind": "custom", "image_id": "sha256:" + "a" * 64, "code_sha256": "b" * 64},
    )  # fmt: skip
    rule = RuleResult(rule="no_bad", status=Status.FAIL, passed=False, score=0.0, threshold=0.5, action=Action.FLAG,
                      evaluators=[ev], outcome=outcome)  # fmt: skip
    d = Decision(policy="p", policy_version="1.0", passed=False, action=Action.FLAG, rules=[rule],
                 outcomes=[outcome], decision_id="dec", modified_response="***")  # fmt: skip
    msg = convert.decision_to_pb(d, revision=2, environment="staging", review_ids=["r"], request_id="q")
    back = convert.decision_from_pb(msg)
    assert back.model_dump(include=set(Decision.model_fields)) == d.model_dump()
    assert back.rules[0].evaluators[0].provenance == ev.provenance  # the SDK's results carry it
    assert (back.policy_revision, back.environment, back.review_ids, back.request_id) == (2, "staging", ["r"], "q")
    item = convert.stream_item_from_pb(ev_pb.EvaluateStreamResponse(request_id="q", decision=msg))
    assert item == back
    err = ev_pb.ItemError(**item_fields(NotFoundError("no policy p")))
    failed = convert.stream_item_from_pb(ev_pb.EvaluateStreamResponse(request_id="q2", error=err))
    assert isinstance(failed, NotFoundError) and failed.request_id == "q2"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {"n": 3, "s": "ok", "b": True, "f": 0.25, "none": None},
            {"n": 3, "s": "ok", "b": True, "f": 0.25, "none": None},
        ),
        ({"é": "ünïcode"}, {"é": "ünïcode"}),
        ({"nan": float("nan"), "inf": float("-inf")}, {"nan": None, "inf": None}),
        ({"big": 2**60}, {"big": str(2**60)}),
        ({"lone": "a\ud800b"}, {"lone": "a\ufffdb"}),
        ({"k\udfff": 1}, {"k\ufffd": 1}),
        ({"t": (1, 2)}, {"t": [1, 2]}),
        ({"nested": {"x": [1.5, float("nan")]}}, {"nested": {"x": [1.5, None]}}),
        ({1: "int key"}, {"1": "int key"}),
        ({"obj": Action.BLOCK}, {"obj": "block"}),
    ],
)
def test_struct_conversion_fixes_what_a_struct_cannot_carry(doc: dict, expected: dict) -> None:
    """Flat scalar documents take the fast path; anything else the JSON round trip: same answers."""
    assert convert.from_struct(convert.to_struct(doc)) == expected


def test_struct_numbers_come_back_as_ints_when_integral() -> None:
    s = convert.to_struct({"n": 3, "f": 2.5, "big": 2**53, "list": [1, 1.5, {"k": -4}], "none": None})
    doc = convert.from_struct(s)
    assert doc == {"n": 3, "f": 2.5, "big": 2**53, "list": [1, 1.5, {"k": -4}], "none": None}
    assert type(doc["n"]) is int and type(doc["list"][2]["k"]) is int and type(doc["f"]) is float


def test_a_struct_holding_nan_is_a_typed_error() -> None:
    s = convert.to_struct({"ok": 1})
    s.fields["bad"].list_value.values.add().number_value = float("nan")
    with pytest.raises(InvalidInputError, match="NaN or infinite"):
        convert.from_struct(s, what="context")
