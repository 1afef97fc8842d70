"""A tenant's keys carry roles: exploits by a service key and by reviewers, against the real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crossaudit import Client
from crossaudit.kernel.errors import NotFoundError, PermissionDeniedError
from crossaudit.v1 import delivery_pb2, delivery_pb2_grpc, policy_pb2, policy_pb2_grpc
from tests.e2e.conftest import ServerProcess
from tests.e2e.roles import KEYS, KEYS_FILE, MODERATED

pytestmark = [pytest.mark.e2e, pytest.mark.security]


@pytest.fixture(scope="module")
def roles_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("roles"), keys_text=KEYS_FILE) as srv:
        yield srv


@pytest.fixture(scope="module")
def clients(roles_server: ServerProcess) -> Iterator[dict[str, Client]]:
    out = {name: Client(roles_server.address, api_key=key) for name, key in KEYS.items()}
    try:
        yield out
    finally:
        for c in out.values():
            c.close()


@pytest.fixture(scope="module")
def review_id(clients: dict[str, Client]) -> str:
    """An open item that needs a content_moderator (created by the service key's evaluation)."""
    clients["admin"].deploy_policy(MODERATED, environment="production")
    decision = clients["service"].evaluate("moderated", "p", "an unsafe answer", timeout=30)
    assert not decision.passed and len(decision.review_ids) == 1
    return decision.review_ids[0]


def _raw_status(address: str, key: str, call: str) -> grpc.RpcError:
    """A raw gRPC call (no SDK), to read the status code and message as any client would."""
    metadata = (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(address) as channel:
        try:
            if call == "deploy":
                policy_pb2_grpc.PolicyServiceStub(channel).DeployPolicy(
                    policy_pb2.DeployPolicyRequest(content=MODERATED, environment="production"),
                    metadata=metadata,
                    timeout=10,
                )
            else:
                delivery_pb2_grpc.DeliveryServiceStub(channel).ListDeliveries(
                    delivery_pb2.ListDeliveriesRequest(), metadata=metadata, timeout=10
                )
        except grpc.RpcError as err:
            return err
    raise AssertionError(f"{call} succeeded")


def test_a_service_key_evaluates_but_cannot_deploy_resolve_or_read_the_audit_log(
    clients: dict[str, Client], review_id: str, roles_server: ServerProcess
) -> None:
    svc = clients["service"]
    assert svc.evaluate("moderated", "p", "fine", timeout=30).passed
    assert "moderated" in {p.name for p in svc.list_policies()}
    with pytest.raises(PermissionDeniedError, match=r"role 'service' may not call PolicyService\.DeployPolicy"):
        svc.deploy_policy(MODERATED.replace("1.0", "2.0"), environment="production")
    with pytest.raises(PermissionDeniedError, match=r"PolicyService\.DeployPolicyStream"):  # the one with progress
        svc.deploy_policy(MODERATED.replace("1.0", "2.0"), environment="production", progress=lambda m, f: None)
    with pytest.raises(PermissionDeniedError, match="RollbackPolicy"):
        svc.rollback("moderated", environment="production")
    with pytest.raises(PermissionDeniedError, match=r"ReviewService\.ResolveReview"):
        svc.resolve_review(review_id, "approved", reviewer="checkout")
    with pytest.raises(PermissionDeniedError, match=r"ReviewService\.ListReviews"):
        svc.list_reviews()
    with pytest.raises(PermissionDeniedError, match=r"AuditService\.ListDecisions"):
        svc.list_decisions()
    with pytest.raises(PermissionDeniedError, match=r"EvaluatorService\.UploadEvaluator"):
        svc.upload_evaluator("x", "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n")
    # the status any gRPC client sees: PERMISSION_DENIED naming the role and the method
    err = _raw_status(roles_server.address, KEYS["service"], "deploy")
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "'service'" in err.details() and "DeployPolicy" in err.details()
    # nothing was deployed, nothing resolved
    assert clients["admin"].get_policy("moderated", environment="production").version.version == 1
    assert {r.id for r in clients["admin"].list_reviews(state="open")} >= {review_id}


def test_a_method_no_role_lists_is_admin_only(clients: dict[str, Client], roles_server: ServerProcess) -> None:
    for who in ("service", "moderator"):
        err = _raw_status(roles_server.address, KEYS[who], "deliveries")
        assert err.code() is grpc.StatusCode.PERMISSION_DENIED, who
        assert "DeliveryService.ListDeliveries" in err.details()
    assert isinstance(clients["admin"].list_deliveries(), list)


def test_a_reviewer_cannot_evaluate_or_deploy(clients: dict[str, Client]) -> None:
    alice = clients["moderator"]
    with pytest.raises(PermissionDeniedError, match=r"role 'reviewer' may not call EvaluationService\.Evaluate"):
        alice.evaluate("moderated", "p", "an unsafe answer", timeout=30)
    with pytest.raises(PermissionDeniedError, match="EvaluateStream"):
        list(alice.evaluate_many("moderated", [{"prompt": "p", "response": "r"}], timeout=30))
    with pytest.raises(PermissionDeniedError, match="DeployPolicy"):
        alice.deploy_policy(MODERATED, environment="staging")
    with pytest.raises(PermissionDeniedError, match="SubmitFeedback"):
        alice.submit_feedback("d", "false_positive")
    assert alice.server_info().tenant == "acme"


def test_a_reviewer_without_the_role_cannot_resolve_and_one_with_it_can(
    clients: dict[str, Client], review_id: str
) -> None:
    bob, alice = clients["reviewer"], clients["moderator"]
    with pytest.raises(PermissionDeniedError, match="needs reviewer_role 'content_moderator'"):
        bob.resolve_review(review_id, "approved", reviewer="alice", note="impersonating")
    # bob's queue holds only what he may resolve; alice's holds the item
    assert review_id not in {r.id for r in bob.list_reviews(state="open")}
    assert review_id in {r.id for r in alice.list_reviews(state="open")}
    # the item is still open; alice resolves it, and her name is recorded, not the request's text
    done = alice.resolve_review(review_id, "rejected", reviewer="mallory", note="harmful")
    assert done.state.value == "rejected" and done.reviewer == "alice" and done.note == "harmful"
    # a reviewer reads the decision behind it (GetDecision is a reviewer's method)
    assert alice.get_decision(done.decision_id).policy == "moderated"


def test_items_without_a_reviewer_role_are_any_reviewers(clients: dict[str, Client]) -> None:
    decision = clients["service"].evaluate("moderated", "p", "a rude answer", timeout=30)
    [flag_id] = decision.review_ids
    bob = clients["reviewer"]
    assert flag_id in {r.id for r in bob.list_reviews(state="open")}
    assert bob.resolve_review(flag_id, "dismissed", note="fine").reviewer == "bob"


def test_another_tenants_reviewer_sees_not_found(clients: dict[str, Client]) -> None:
    decision = clients["service"].evaluate("moderated", "p", "another unsafe answer", timeout=30)
    [item] = decision.review_ids
    carol = clients["globex_reviewer"]  # a content_moderator, but of globex
    with pytest.raises(NotFoundError):
        carol.resolve_review(item, "approved")
    with pytest.raises(NotFoundError):
        carol.get_decision(decision.decision_id)
    assert item not in {r.id for r in carol.list_reviews(state="any")}
    assert clients["admin"].resolve_review(item, "approved", reviewer="ops").reviewer == "ops"


def test_old_keys_files_still_make_admins(tmp_path: Path) -> None:
    with ServerProcess(tmp_path) as srv:  # tenants: {acme: [key], globex: [key]}: plain strings
        from tests.e2e.conftest import key

        with Client(srv.address, api_key=key("acme")) as c:
            c.deploy_policy(MODERATED, environment="production")
            d = c.evaluate("moderated", "p", "unsafe", timeout=30)
            assert c.resolve_review(d.review_ids[0], "approved", reviewer="ops").reviewer == "ops"


@pytest.mark.parametrize(
    ("key", "method", "code"),
    [
        (None, "/crossaudit.v1.NoSuchService/Probe", grpc.StatusCode.UNAUTHENTICATED),
        ("not-a-key-of-anyone-at-all", "/crossaudit.v1.PolicyService/NoSuchMethod", grpc.StatusCode.UNAUTHENTICATED),
        ("admin", "/crossaudit.v1.NoSuchService/Probe", grpc.StatusCode.UNIMPLEMENTED),
        (None, "/crossaudit.v1.PolicyService/DeployPolicy", grpc.StatusCode.UNAUTHENTICATED),
        ("service", "/crossaudit.v1.DeliveryService/RedeliverDelivery", grpc.StatusCode.PERMISSION_DENIED),
        (None, "/grpc.health.v1.Health/Check", grpc.StatusCode.OK),
    ],
)
def test_every_call_is_authorized_before_anything_answers_it(
    roles_server: ServerProcess, key: str | None, method: str, code: grpc.StatusCode
) -> None:
    """Unknown methods do not reveal what exists to a caller without a valid key; known ones are
    refused before their request is even looked at (the body here is garbage); health is public."""
    metadata = () if key is None else (("authorization", f"Bearer {KEYS.get(key, key)}"),)
    body = b"" if method.startswith("/grpc.health") else b"\xff\xff\xff garbage"
    with grpc.insecure_channel(roles_server.address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(body, metadata=metadata, timeout=10)
            got = grpc.StatusCode.OK
        except grpc.RpcError as e:
            got = e.code()
    assert got is code
