"""Results the wire cannot carry, and input that does not decode, against the real server.

* An evaluator returning ``10**400``, a span ending at ``10**30``, a lone surrogate or NaN/inf
  is refused where the result enters (``ResultInvalidError``): the caller gets a decision in
  which that rule errored (fail-closed), never INTERNAL, and the audit record (read back
  through the real AuditService) says the same — for Evaluate and for EvaluateStream items.
* A NUL or control character in a policy is a located policy issue (line:col), never INTERNAL
  (Validate answers it, Deploy is INVALID_ARGUMENT, PolicyTester raises PolicyValidationError).
* Bytes that are not the request message, and a Struct context nested too deeply, are
  INVALID_ARGUMENT with a clear message (unary and streaming RPCs), never UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import struct_pb2

from crossaudit import Client, PolicyTester
from crossaudit.kernel.errors import InvalidInputError, PolicyValidationError
from crossaudit.kernel.results import Action, Status
from crossaudit.service.config import ServiceLimits
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import policy_pb2 as pol_pb
from crossaudit.v1 import policy_pb2_grpc as pol_grpc
from tests.e2e.conftest import ServerProcess, key

pytestmark = pytest.mark.security
e2e = pytest.mark.e2e

# The block scalar keeps ``\ud800`` as text: the evaluator's Python makes the lone surrogate.
HOSTILE = r"""
name: hostile-results
description: an evaluator whose results the wire cannot carry
version: "1.0"
evaluators:
  - name: hostile
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            if prompt == "bigint":
                return {"score": 1.0, "details": {"x": 10 ** 400}}
            if prompt == "span":
                return {"score": 1.0, "spans": [{"start": 0, "end": 10 ** 30, "label": "x"}]}
            if prompt == "surrogate":
                return {"score": 1.0, "details": {"x": "\ud800"}}
            if prompt == "nan":
                return {"score": 1.0, "details": {"x": float("nan")}}
            if prompt == "inf":
                return {"score": 1.0, "details": {"x": float("inf")}}
            if prompt == "deep":
                doc = 1
                for _ in range(30):
                    doc = {"d": doc}
                return {"score": 1.0, "details": {"x": doc}}
            return {"score": 1.0, "details": {"ok": True}}
rules:
  - name: hostile_rule
    evaluator: hostile
    threshold: 0.5
    action: block
"""
HOSTILE_KINDS = ["bigint", "span", "surrogate", "nan", "inf"]
LIMIT = ServiceLimits().max_struct_depth


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(HOSTILE)
        yield c


def _identity(b: bytes) -> bytes:
    return b


def _md() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key('acme')}"),)


def _assert_refused_and_audited(client: Client, d, kind: str) -> None:  # type: ignore[no-untyped-def]
    rule = d.rule("hostile_rule")
    assert rule.status is Status.ERROR, (kind, rule)
    assert rule.evaluators[0].error_type == "ResultInvalidError", (kind, rule.evaluators[0])
    assert not d.passed and d.action is Action.BLOCK and d.errored_rules == ["hostile_rule"]
    audit = client.get_decision(d.decision_id)  # the real AuditService
    assert (audit.action, audit.passed, audit.errored_rules) == (d.action.value, d.passed, d.errored_rules)
    (audited,) = audit.rules
    assert audited["status"] == "error" and audited["evaluators"][0]["error_type"] == "ResultInvalidError"


@e2e
def test_a_sane_result_still_passes(client: Client) -> None:
    d = client.evaluate("hostile-results", "ok", "r", timeout=30)
    assert d.passed and d.rule("hostile_rule").evaluators[0].details == {"ok": True}


@e2e
@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_unsendable_result_is_a_rule_error_and_the_audit_agrees(client: Client, kind: str) -> None:
    d = client.evaluate("hostile-results", kind, "r", timeout=30)  # never INTERNAL
    _assert_refused_and_audited(client, d, kind)


@e2e
def test_unsendable_results_in_a_stream_are_answered_and_audited(client: Client) -> None:
    items = [{"prompt": kind, "response": "r", "request_id": kind} for kind in [*HOSTILE_KINDS, "ok"]]
    got = {r.request_id: r for r in client.evaluate_many("hostile-results", items, timeout=60)}
    assert set(got) == {*HOSTILE_KINDS, "ok"}
    for kind in HOSTILE_KINDS:
        assert not isinstance(got[kind], Exception), got[kind]
        _assert_refused_and_audited(client, got[kind], kind)
    assert got["ok"].passed


@e2e
def test_the_deepest_allowed_result_reaches_the_client(client: Client) -> None:
    """A result at the result_max_depth limit must still decode on the client (unary and stream)."""
    d = client.evaluate("hostile-results", "deep", "r", timeout=30)
    assert d.passed, d.rule("hostile_rule")
    (s,) = client.evaluate_many("hostile-results", [{"prompt": "deep", "response": "r"}], timeout=30)
    assert not isinstance(s, Exception) and s.passed


# --- control characters in policies ------------------------------------------------------

BAD_POLICIES = {
    "nul": 'name: ctl\ndescription: "a\x00b"\nversion: "1"\nrules: []\n',
    "bell": 'name: ctl\ndescription: d\nversion: "1"\nrules: []\nx: a\x07\n',
    "escape": 'name: ctl\ndescription: d\x1b[31m\nversion: "1"\nrules: []\n',
}
WHERE = {"nul": (2, 16), "bell": (5, 5), "escape": (2, 15)}


@e2e
@pytest.mark.parametrize("which", sorted(BAD_POLICIES))
def test_control_characters_in_a_policy_are_located_issues(server: ServerProcess, which: str) -> None:
    text = BAD_POLICIES[which]
    with grpc.insecure_channel(server.address) as ch:
        stub = pol_grpc.PolicyServiceStub(ch)
        answer = stub.ValidatePolicy(pol_pb.ValidatePolicyRequest(content=text, filename="p.yaml"), metadata=_md())
        assert not answer.valid  # invalid is an answer, not an error
        (issue,) = answer.issues
        assert (issue.line, issue.column) == WHERE[which] and "not allowed" in issue.message
        with pytest.raises(grpc.RpcError) as info:
            stub.DeployPolicy(pol_pb.DeployPolicyRequest(content=text, filename="p.yaml"), metadata=_md(), timeout=30)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        line, col = WHERE[which]
        assert f"p.yaml:{line}:{col}:" in info.value.details()
    with Client(server.address, api_key=key("acme")) as c, pytest.raises(PolicyValidationError) as typed:
        c.deploy_policy(text)
    assert (typed.value.issues[0].line, typed.value.issues[0].column) == WHERE[which]


@pytest.mark.parametrize("which", sorted(BAD_POLICIES))
def test_policy_tester_raises_a_policy_validation_error(which: str) -> None:
    with pytest.raises(PolicyValidationError) as info:
        PolicyTester(BAD_POLICIES[which], prepare=False)
    assert (info.value.issues[0].line, info.value.issues[0].column) == WHERE[which]


def test_a_lone_surrogate_escape_in_a_policy_is_a_located_issue() -> None:
    with pytest.raises(PolicyValidationError) as info:
        PolicyTester('name: "x\\ud800"\ndescription: d\nversion: "1"\nrules: []\n', prepare=False)
    assert info.value.issues[0].line == 1 and "surrogate" in info.value.issues[0].message


# --- bytes that are not the request message ----------------------------------------------

GARBAGE = [b"\xff\xff\xff\xff\xff", b"\x0a\x05ab", b"\x12\x80"]


@e2e
@pytest.mark.parametrize("raw", GARBAGE)
@pytest.mark.parametrize(
    "method", ["/crossaudit.v1.EvaluationService/Evaluate", "/crossaudit.v1.PolicyService/DeployPolicy"]
)
def test_malformed_unary_request_is_invalid_argument(server: ServerProcess, method: str, raw: bytes) -> None:
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(method, request_serializer=_identity, response_deserializer=_identity)
        with pytest.raises(grpc.RpcError) as info:
            call(raw, metadata=_md(), timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "not a valid crossaudit.v1." in info.value.details()
    assert dict(info.value.trailing_metadata())["crossaudit-error-type"] == "InvalidInputError"


@e2e
@pytest.mark.parametrize("raw", GARBAGE)
def test_malformed_stream_requests_are_invalid_argument(server: ServerProcess, raw: bytes) -> None:
    good = ev_pb.EvaluateRequest(policy="hostile-results", prompt="ok", response="r").SerializeToString()
    with grpc.insecure_channel(server.address) as ch:
        stream = ch.stream_stream(
            "/crossaudit.v1.EvaluationService/EvaluateStream",
            request_serializer=_identity,
            response_deserializer=_identity,
        )
        with pytest.raises(grpc.RpcError) as info:
            list(stream(iter([good, raw]), metadata=_md(), timeout=30))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert "not a valid crossaudit.v1.EvaluateRequest" in info.value.details()
        upload = ch.unary_stream(
            "/crossaudit.v1.EvaluatorService/UploadEvaluator",
            request_serializer=_identity,
            response_deserializer=_identity,
        )
        with pytest.raises(grpc.RpcError) as info:
            list(upload(raw, metadata=_md(), timeout=10))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()


@e2e
def test_malformed_bytes_without_a_key_are_unauthenticated_first(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(
            "/crossaudit.v1.EvaluationService/Evaluate", request_serializer=_identity, response_deserializer=_identity
        )
        with pytest.raises(grpc.RpcError) as info:
            call(GARBAGE[0], timeout=10)
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED


# --- Struct nesting ----------------------------------------------------------------------


def _nested_request(levels: int) -> bytes:
    """An EvaluateRequest whose context nests ``levels`` Structs (built in place: copying a
    message this deep would itself fail to parse)."""
    req = ev_pb.EvaluateRequest(policy="hostile-results", prompt="ok", response="r")
    cur: struct_pb2.Struct = req.context
    for _ in range(levels - 1):
        cur = cur.fields["a"].struct_value
    cur.fields["leaf"].number_value = 1
    return req.SerializeToString()


@e2e
@pytest.mark.parametrize("levels", [LIMIT + 1, 40, 200])
def test_too_deep_struct_context_is_invalid_argument(server: ServerProcess, levels: int) -> None:
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(
            "/crossaudit.v1.EvaluationService/Evaluate", request_serializer=_identity, response_deserializer=_identity
        )
        with pytest.raises(grpc.RpcError) as info:
            call(_nested_request(levels), metadata=_md(), timeout=10)
        stream = ch.stream_stream(
            "/crossaudit.v1.EvaluationService/EvaluateStream",
            request_serializer=_identity,
            response_deserializer=_identity,
        )
        answers = []
        try:
            answers = list(stream(iter([_nested_request(levels)]), metadata=_md(), timeout=10))
            streamed = None
        except grpc.RpcError as e:  # beyond what protobuf decodes: the message has no request_id
            streamed = e
    problems = [(info.value.code(), info.value.details())]
    if streamed is not None:
        problems.append((streamed.code(), streamed.details()))
    else:  # decodable but over the limit: this item's answer is its error, the stream goes on
        (item,) = [ev_pb.EvaluateStreamResponse.FromString(a) for a in answers]
        assert item.WhichOneof("result") == "error"
        problems.append((getattr(grpc.StatusCode, item.error.code), item.error.message))
    for code, details in problems:
        assert code is grpc.StatusCode.INVALID_ARGUMENT, details
        assert "nested too deeply" in details and f"at most {LIMIT} levels" in details


@e2e
def test_struct_context_at_the_limit_is_evaluated(client: Client, server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(
            "/crossaudit.v1.EvaluationService/Evaluate", request_serializer=_identity, response_deserializer=_identity
        )
        answer = ev_pb.EvaluateResponse.FromString(call(_nested_request(LIMIT), metadata=_md(), timeout=30))
    assert answer.passed and answer.decision_id


@e2e
def test_the_client_gets_a_typed_error_for_a_too_deep_context(client: Client) -> None:
    context: dict = {"leaf": 1}
    for _ in range(40):
        context = {"a": context}
    with pytest.raises(InvalidInputError, match="nested too deeply"):
        client.evaluate("hostile-results", "ok", "r", context=context, timeout=10)


@e2e
@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_number_in_the_context_is_invalid_argument(server: ServerProcess, number: float) -> None:
    """A Struct can carry NaN/inf (doubles) though JSON cannot: a typed refusal, never INTERNAL."""
    req = ev_pb.EvaluateRequest(policy="hostile-results", prompt="ok", response="r")
    req.context.fields["deep"].struct_value.fields["x"].number_value = number
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(
            "/crossaudit.v1.EvaluationService/Evaluate", request_serializer=_identity, response_deserializer=_identity
        )
        with pytest.raises(grpc.RpcError) as info:
            call(req.SerializeToString(), metadata=_md(), timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN or infinite" in (info.value.details() or "")
