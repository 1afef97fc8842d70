"""Two tenants are isolated in every service; a missing or wrong key is rejected everywhere."""

from __future__ import annotations

import grpc
import pytest

from crossaudit import Client
from crossaudit.kernel.errors import NotFoundError, PolicyValidationError, UnauthenticatedError
from crossaudit.v1 import audit_pb2, evaluation_pb2, evaluator_pb2, policy_pb2, replay_pb2, review_pb2
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import KEYWORDS, UPLOAD_CODE, uses_upload

pytestmark = pytest.mark.e2e

PUBLIC_SERVICES = [
    s
    for mod in (policy_pb2, evaluation_pb2, evaluator_pb2, review_pb2, audit_pb2, replay_pb2)
    for s in mod.DESCRIPTOR.services_by_name.values()
]


def test_tenants_are_isolated_in_every_service(acme: Client, globex: Client) -> None:
    acme.deploy_policy(KEYWORDS, environment="production")
    ev = acme.upload_evaluator("secret-scorer", UPLOAD_CODE)
    acme.deploy_policy(uses_upload(ev.id))
    decision = acme.evaluate("keywords", "p", "bad and worse", timeout=10)
    assert len(decision.review_ids) == 2

    # PolicyService
    assert "keywords" not in {p.name for p in globex.list_policies()}
    with pytest.raises(NotFoundError):
        globex.get_policy("keywords")
    with pytest.raises(NotFoundError):
        globex.rollback("keywords", to_version=1)
    # EvaluationService
    with pytest.raises(NotFoundError):
        globex.evaluate("keywords", "p", "r", timeout=10)
    [item] = list(globex.evaluate_many("keywords", [{"prompt": "p", "response": "r"}], timeout=10))
    assert isinstance(item, NotFoundError)
    with pytest.raises(NotFoundError):
        globex.submit_feedback(decision.decision_id, "correct")
    # EvaluatorService: the id is unknown to globex, and cannot be referenced by its policies
    assert globex.list_evaluators() == []
    with pytest.raises(NotFoundError):
        globex.get_evaluator(ev.id)
    with pytest.raises(NotFoundError):
        globex.get_evaluator(name="secret-scorer")
    with pytest.raises(PolicyValidationError, match="not an evaluator uploaded by this tenant"):
        globex.deploy_policy(uses_upload(ev.id))
    # ReviewService
    assert not set(decision.review_ids) & {r.id for r in globex.list_reviews(state="any")}
    with pytest.raises(NotFoundError):
        globex.resolve_review(decision.review_ids[0], "approved")

    # AuditService
    with pytest.raises(NotFoundError):
        globex.get_decision(decision.decision_id)
    assert decision.decision_id not in {d.decision_id for d in globex.list_decisions()}
    assert acme.get_decision(decision.decision_id).policy == "keywords"

    # the same names are independent per tenant
    mine = globex.deploy_policy(KEYWORDS.replace("flags", "globex flags"))
    assert mine.version.version == 1 and mine.created
    assert globex.evaluate("keywords", "p", "fine", timeout=10).passed
    assert acme.get_policy("keywords").content == KEYWORDS
    same_code = globex.upload_evaluator("secret-scorer", UPLOAD_CODE)
    assert same_code.created and same_code.id != ev.id


def _call(channel: grpc.Channel, service: object, method: object, metadata: tuple) -> grpc.StatusCode:
    path = f"/{service.full_name}/{method.name}"  # type: ignore[attr-defined]
    ident = lambda b: b  # noqa: E731 - raw bytes in and out: an empty message of any type
    try:
        if method.client_streaming and method.server_streaming:  # type: ignore[attr-defined]
            list(channel.stream_stream(path, ident, ident)(iter([b""]), timeout=10, metadata=metadata))
        elif method.server_streaming:  # type: ignore[attr-defined]
            list(channel.unary_stream(path, ident, ident)(b"", timeout=10, metadata=metadata))
        elif method.client_streaming:  # type: ignore[attr-defined]
            channel.stream_unary(path, ident, ident)(iter([b""]), timeout=10, metadata=metadata)
        else:
            channel.unary_unary(path, ident, ident)(b"", timeout=10, metadata=metadata)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    "metadata",
    [(), (("authorization", "Bearer wrong-key-0123456789abcdef"),), (("authorization", f"Basic {key('acme')}"),)],
    ids=["missing", "wrong", "not-bearer"],
)
def test_every_method_rejects_a_missing_or_wrong_key(server: ServerProcess, metadata: tuple) -> None:
    methods = [(s, m) for s in PUBLIC_SERVICES for m in s.methods]
    assert len(methods) == 27  # with the decision log (GetLogKey, ReadLog, two proofs, GetReceipt) and ListLabels
    with grpc.insecure_channel(server.address) as ch:
        codes = {f"{s.name}.{m.name}": _call(ch, s, m, metadata) for s, m in methods}
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}, codes


def test_the_client_reports_a_wrong_key_as_unauthenticated(server: ServerProcess) -> None:
    with Client(server.address, api_key="nope-nope-nope-nope") as c, pytest.raises(UnauthenticatedError):
        c.list_policies()
    with Client(server.address) as c, pytest.raises(UnauthenticatedError, match="missing API key"):
        c.list_policies()
