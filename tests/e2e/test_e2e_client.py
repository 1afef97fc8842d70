"""The real server driven through ``crossaudit.Client``: every service, typed errors."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crossaudit import AsyncClient, Client
from crossaudit.kernel.errors import (
    InvalidInputError,
    NotFoundError,
    PolicyValidationError,
    RequestTooLargeError,
    ReviewAlreadyResolvedError,
)
from crossaudit.kernel.results import Action
from crossaudit.sdk import ReviewState
from tests.e2e.conftest import ServerProcess, key, need_docker
from tests.e2e.policies import KEYWORDS, KEYWORDS_V2, LEARNING, UPLOAD_CODE, uses_upload

pytestmark = pytest.mark.e2e

INVALID = """name: broken
description: d
version: "1.0"
rules:
  - name: r
    evaluator: missing
    threshold: 1.5
"""


@pytest.fixture(scope="module", params=["process", "docker"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if request.param == "docker":
        need_docker()
    srv = ServerProcess(tmp_path_factory.mktemp(f"client-server-{request.param}"), sandbox=request.param)
    (srv.policies_dir / "boot.yaml").write_text(KEYWORDS.replace("name: keywords", "name: bootstrapped"))
    srv.start()
    try:
        yield srv
    finally:
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(KEYWORDS)
        yield c


def test_health_answers_without_a_key(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "crossaudit.v1.EvaluationService"):
            r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_policies_dir_is_deployed_to_the_default_environment_on_first_start(client: Client) -> None:
    mine = {p.name: p for p in client.list_policies(environment="production")}
    assert [d.environment for d in mine["bootstrapped"].deployments] == ["production"]
    d = client.evaluate("bootstrapped", "p", "fine", timeout=10)  # where a caller looks by default
    assert d.passed and d.policy_revision == 1 and d.environment == "production"


def test_evaluate_answers_the_decision_with_its_id(client: Client, server: ServerProcess) -> None:
    d = client.evaluate("keywords", "hi", "a fine answer", context={"user": {"role": "admin"}}, timeout=10)
    assert d.passed and d.action is Action.ALLOW and d.decision_id and d.environment == "production"
    assert [r.rule for r in d.rules] == ["no_bad", "no_worse"]
    assert d.rule("no_worse").evaluators[0].details == {"length": 13.0}
    assert d.rule("no_bad").evaluators[0].kind == "custom"
    # what produced each verdict crosses the wire (docs/provenance.md)
    prov = d.rule("no_bad").evaluators[0].provenance
    assert prov["kind"] == "custom" and prov["backend"] == server.sandbox and len(prov["code_sha256"]) == 64
    assert prov["image_id"].startswith("sha256:" if server.sandbox == "docker" else "process:")


def test_flag_and_require_review_create_reviews_that_can_be_resolved(client: Client) -> None:
    d = client.evaluate("keywords", "hi", "a bad and worse answer", timeout=10)
    assert not d.passed and d.action is Action.REQUIRE_REVIEW and len(d.review_ids) == 2
    assert d.rule("no_bad").outcome.params["severity"] == "high"
    reviews = {r.id: r for r in client.list_reviews(state="open")}
    assert set(d.review_ids) <= set(reviews)
    mine = [reviews[i] for i in d.review_ids]
    assert {r.kind.value for r in mine} == {"flag", "require_review"}
    assert all(r.decision_id == d.decision_id and r.policy_revision == 1 for r in mine)
    done = client.resolve_review(mine[0].id, "approved", reviewer="ann", note="ok")
    assert done.state.value == "approved" and done.reviewer == "ann" and done.resolved_at
    with pytest.raises(ReviewAlreadyResolvedError, match="already approved"):  # FAILED_PRECONDITION, typed
        client.resolve_review(mine[0].id, "rejected")
    with pytest.raises(InvalidInputError):
        client.resolve_review(mine[1].id, "bogus")
    assert mine[0].id not in {r.id for r in client.list_reviews(state="open")}


def test_the_audit_log_has_hashes_not_text(client: Client) -> None:
    import hashlib

    d = client.evaluate("keywords", "secret prompt", "a bad answer", context={"k": "v"}, timeout=10)
    a = client.get_decision(d.decision_id)
    assert (a.policy, a.policy_revision, a.environment, a.action, a.passed) == (
        "keywords",
        d.policy_revision,
        "production",
        "flag",
        False,
    )
    assert a.prompt is None and a.response is None
    assert a.response_sha256 == hashlib.sha256(b"a bad answer").hexdigest()
    assert [r["rule"] for r in a.rules] == ["no_bad", "no_worse"]
    assert a.rules[0]["evaluators"][0]["violations"] == 1  # counted, not copied
    assert a.decision_id == client.list_decisions(policy="keywords", limit=1)[0].decision_id
    with pytest.raises(NotFoundError):
        client.get_decision("00000000-0000-0000-0000-000000000000")


def test_feedback_on_a_decision_and_its_rules(client: Client) -> None:
    d = client.evaluate("keywords", "hi", "bad", timeout=10)
    assert client.submit_feedback(d.decision_id, "false_positive", rule="no_bad", comment="fine really")
    with pytest.raises(NotFoundError):
        client.submit_feedback(d.decision_id, "correct", rule="no_such_rule")
    with pytest.raises(NotFoundError):
        client.submit_feedback("00000000-0000-0000-0000-000000000000", "correct")
    with pytest.raises(InvalidInputError):
        client.submit_feedback(d.decision_id, "not a label!")


def test_feedback_moves_a_learning_rules_threshold(client: Client) -> None:
    client.deploy_policy(LEARNING)
    first = client.evaluate("learning", "p", "r", timeout=10)
    assert not first.passed and first.rule("strict").threshold == 0.8
    for _ in range(2):  # reviewers say the rule was too strict
        client.submit_feedback(first.decision_id, "false_positive", rule="strict")
    after = client.evaluate("learning", "p", "r", timeout=10)
    assert after.passed and after.rule("strict").threshold == pytest.approx(0.6)
    # the labels carry the rule's recorded score: the calibration (docs/calibration.md) moved it,
    # by at most feedback_weight (0.2) from 0.8
    assert "feedback (2 labelled scores" in after.rule("strict").reason


def test_invalid_policy_is_invalid_argument_with_every_issue_located(client: Client) -> None:
    with pytest.raises(PolicyValidationError) as err:
        client.deploy_policy(INVALID)
    issues = err.value.issues
    assert {i.path for i in issues} >= {"rules[0].evaluator", "rules[0].threshold"}
    assert all(i.line for i in issues)
    assert [str(i) for i in client.validate_policy(INVALID)] == [str(i) for i in issues]
    assert client.validate_policy(KEYWORDS) == []


def test_versions_deployments_and_rollback(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "kw.yaml"
    path.write_text(KEYWORDS_V2)
    r = client.deploy_policy(path, environment="staging")
    assert r.created and r.version.version == 2 and r.version.declared_version == "2.0"
    again = client.deploy_policy(KEYWORDS_V2, environment="staging")
    assert not again.created and again.version.version == 2
    assert client.evaluate("keywords", "", "bad", environment="staging", timeout=10).passed  # v2 ignores 'bad'
    assert not client.evaluate("keywords", "", "bad", timeout=10).passed  # production still v1
    client.deploy_policy(KEYWORDS_V2)
    d = client.evaluate("keywords", "", "nasty", timeout=10)
    assert d.policy_revision == 2 and d.policy_version == "2.0" and not d.passed
    rb = client.rollback("keywords")
    assert (rb.previous_version, rb.deployment.version) == (2, 1)
    d = client.evaluate("keywords", "", "nasty", timeout=10)
    assert d.policy_revision == 1 and d.passed
    info = client.get_policy("keywords", environment="staging")
    assert info.content == KEYWORDS_V2 and {x.environment for x in info.deployments} == {"production", "staging"}
    assert client.get_policy("keywords", version=1).content == KEYWORDS
    [summary] = [p for p in client.list_policies() if p.name == "keywords"]
    assert summary.latest_version == 2
    with pytest.raises(NotFoundError):
        client.rollback("keywords", environment="nowhere")


def test_upload_is_validated_versioned_and_referenced_by_id(client: Client) -> None:
    events: list[tuple[str, float]] = []
    ev = client.upload_evaluator("scorer", UPLOAD_CODE, progress=lambda m, f: events.append((m, f)))
    assert ev.created and ev.version == 1 and len(ev.id) == 36
    same = client.upload_evaluator("scorer", UPLOAD_CODE)
    assert not same.created and same.id == ev.id
    v2 = client.upload_evaluator("scorer", UPLOAD_CODE + "\n# v2\n")
    assert v2.created and v2.version == 2 and v2.id != ev.id
    assert client.get_evaluator(ev.id, include_code=True).code == UPLOAD_CODE
    assert client.get_evaluator(name="scorer").id == v2.id
    assert [e.version for e in client.list_evaluators(name="scorer")] == [1, 2]
    client.deploy_policy(uses_upload(ev.id))
    d = client.evaluate("uses-upload", "", "please block me", timeout=10)
    assert d.action is Action.BLOCK and d.rules[0].score == 0.25
    assert d.rules[0].evaluators[0].details == {"source": "upload"}
    with pytest.raises(InvalidInputError, match="evaluate"):
        client.upload_evaluator("broken", "def other():\n    pass\n")
    with pytest.raises(InvalidInputError):
        client.upload_evaluator("deps", UPLOAD_CODE, dependencies=["git+https://example.invalid/x"])
    with pytest.raises(NotFoundError):
        client.get_evaluator("00000000-0000-0000-0000-000000000000")


def test_evaluate_stream_answers_every_item(client: Client) -> None:
    items = [{"prompt": "p", "response": "bad" if i % 2 else "good", "request_id": f"r{i}"} for i in range(20)]
    answers = list(client.evaluate_many("keywords", items, timeout=30))
    assert sorted(a.request_id for a in answers) == sorted(f"r{i}" for i in range(20))
    by_id = {a.request_id: a for a in answers}
    assert by_id["r1"].action is Action.FLAG and by_id["r2"].passed
    errors = list(client.evaluate_many("no-such-policy", items[:3], timeout=30))
    assert len(errors) == 3 and all(isinstance(e, NotFoundError) for e in errors)


def test_unknown_policy_and_bad_environment(client: Client) -> None:
    with pytest.raises(NotFoundError):
        client.evaluate("no-such-policy", "", "", timeout=10)
    with pytest.raises(InvalidInputError, match="environment"):
        client.evaluate("keywords", "", "", environment="Bad Env", timeout=10)


def test_oversized_requests_are_refused_not_retried(client: Client, server: ServerProcess) -> None:
    """Every refusal names its setting: the engine's content cap, then the one request limit
    (limits.max_request_bytes, 4 MiB) - in the client before sending, and in the server for a
    client configured higher."""
    with pytest.raises(InvalidInputError, match=r"over the 1048576 bytes .*\(engine_limits.max_content_bytes\)"):
        client.evaluate("keywords", "", "x" * (2 * 1024 * 1024), timeout=10)
    with pytest.raises(RequestTooLargeError) as mine:  # checked here: nothing is sent
        client.evaluate("keywords", "", "x" * (5 * 1024 * 1024), timeout=10)
    assert "over this client's limit of 4194304 bytes" in mine.value.message
    assert "CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES" in mine.value.message and not mine.value.retryable
    with Client(server.address, api_key=key("acme"), max_request_bytes=64 * 1024 * 1024) as roomy:
        with pytest.raises(RequestTooLargeError) as theirs:  # within grpc's margin: the server's own refusal
            roomy.evaluate("keywords", "", "x" * (4 * 1024 * 1024 + 512 * 1024), timeout=10)
        err = theirs.value
        assert err.setting == "limits.max_request_bytes" and err.limit == 4 * 1024 * 1024
        assert err.message.startswith("the request is ") and "over the server's limit of 4194304 bytes" in err.message
        assert "(limits.max_request_bytes; CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES where the server runs)" in err.message
        with pytest.raises(InvalidInputError, match="too large"):  # far beyond: grpc's cap (limit + 1 MiB)
            roomy.evaluate("keywords", "", "x" * (6 * 1024 * 1024), timeout=10)
        items = [{"prompt": "", "response": "fine"}, {"prompt": "", "response": "x" * (4 * 1024 * 1024 + 1024)}]
        with pytest.raises(RequestTooLargeError, match=r"limits\.max_request_bytes"):  # a stream item too
            list(roomy.evaluate_many("keywords", items, timeout=30))
    with pytest.raises(RequestTooLargeError, match="this client's limit"):  # the blocking stream checks each item
        list(client.evaluate_many("keywords", items, timeout=30))


def test_metrics_endpoint_counts_decisions(client: Client, server: ServerProcess) -> None:
    client.evaluate("keywords", "", "fine", timeout=10)
    with pytest.raises(NotFoundError):
        client.evaluate("no-such-policy", "", "", timeout=10)
    body = urllib.request.urlopen(f"http://{server.metrics_address}/metrics", timeout=10).read().decode()
    assert 'crossaudit_decisions_total{action="allow",passed="true",policy="keywords",tenant="acme"}' in body
    assert "crossaudit_rule_latency_seconds_bucket" in body and "crossaudit_sandbox_state" in body
    assert 'crossaudit_evaluator_results_total{kind="custom",status="pass"}' in body
    assert 'crossaudit_rpcs_total{code="NOT_FOUND",method="Evaluate"}' in body


# --- AsyncClient: the same methods, awaited (a tenant and names of its own) ------------------


def _renamed(policy: str, name: str) -> str:
    return policy.replace("name: keywords", f"name: {name}")


async def test_async_client_manages_policy_versions(server: ServerProcess, tmp_path: Path) -> None:
    v1, v2 = _renamed(KEYWORDS, "async-policies"), _renamed(KEYWORDS_V2, "async-policies")
    async with AsyncClient(server.address, api_key=key("globex")) as c:
        assert await c.validate_policy(v1) == []
        issues = await c.validate_policy(INVALID)
        assert {i.path for i in issues} >= {"rules[0].evaluator", "rules[0].threshold"} and all(i.line for i in issues)
        with pytest.raises(PolicyValidationError) as err:
            await c.deploy_policy(INVALID)
        assert [str(i) for i in err.value.issues] == [str(i) for i in issues]
        first = await c.deploy_policy(v1)
        path = tmp_path / "async.yaml"
        path.write_text(v2)
        second = await c.deploy_policy(path)
        assert (first.created, first.version.version, second.created, second.version.version) == (True, 1, True, 2)
        assert second.version.declared_version == "2.0" and second.deployment.environment == "production"
        info = await c.get_policy("async-policies")
        assert info.content == v2 and [(d.environment, d.version) for d in info.deployments] == [("production", 2)]
        [summary] = [p for p in await c.list_policies() if p.name == "async-policies"]
        assert summary.latest_version == 2
        rb = await c.rollback("async-policies")
        assert (rb.previous_version, rb.deployment.version) == (2, 1)
        assert (await c.get_policy("async-policies")).content == v1
        assert (await c.get_policy("async-policies", version=2)).content == v2
        with pytest.raises(NotFoundError):
            await c.rollback("async-policies", environment="nowhere")


async def test_async_client_reviews_feedback_and_audit(server: ServerProcess) -> None:
    import hashlib

    async with AsyncClient(server.address, api_key=key("globex")) as c:
        await c.deploy_policy(_renamed(KEYWORDS, "async-reviews"))
        d = await c.evaluate("async-reviews", "secret prompt", "a bad and worse answer", timeout=10)
        assert not d.passed and d.action is Action.REQUIRE_REVIEW and len(d.review_ids) == 2
        reviews = await c.list_reviews(state="open", policy="async-reviews")
        assert sorted(r.id for r in reviews) == sorted(d.review_ids)
        assert all(r.decision_id == d.decision_id and not (r.escalated or r.overdue) for r in reviews)
        done = await c.resolve_review(d.review_ids[0], "approved", reviewer="ann", note="ok")
        assert done.state is ReviewState.APPROVED and done.reviewer == "ann" and done.note == "ok" and done.resolved_at
        with pytest.raises(ReviewAlreadyResolvedError):
            await c.resolve_review(d.review_ids[0], "rejected")
        assert [r.id for r in await c.list_reviews(state="open", policy="async-reviews")] == [d.review_ids[1]]
        assert await c.submit_feedback(d.decision_id, "false_positive", rule="no_bad", comment="fine really")
        with pytest.raises(NotFoundError):
            await c.submit_feedback(d.decision_id, "correct", rule="no_such_rule")
        a = await c.get_decision(d.decision_id)
        assert (a.policy, a.environment, a.action, a.passed) == ("async-reviews", "production", "require_review", False)
        assert a.prompt is None and a.response_sha256 == hashlib.sha256(b"a bad and worse answer").hexdigest()
        assert [r["rule"] for r in a.rules] == ["no_bad", "no_worse"]
        assert [x.decision_id for x in await c.list_decisions(policy="async-reviews", limit=1)] == [d.decision_id]
        with pytest.raises(NotFoundError):
            await c.get_decision("00000000-0000-0000-0000-000000000000")


async def test_async_client_uploads_and_finds_evaluators(server: ServerProcess) -> None:
    async with AsyncClient(server.address, api_key=key("globex")) as c:
        ev = await c.upload_evaluator("async-scorer", UPLOAD_CODE, progress=lambda message, fraction: None)
        assert ev.created and ev.version == 1 and ev.name == "async-scorer" and len(ev.id) == 36
        same = await c.upload_evaluator("async-scorer", UPLOAD_CODE)
        assert not same.created and same.id == ev.id
        got = await c.get_evaluator(ev.id, include_code=True)
        assert got.code == UPLOAD_CODE and got.digest == ev.digest
        assert (await c.get_evaluator(name="async-scorer")).id == ev.id
        assert [e.id for e in await c.list_evaluators(name="async-scorer")] == [ev.id]
        await c.deploy_policy(uses_upload(ev.id))
        d = await c.evaluate("uses-upload", "", "please block me", timeout=10)
        assert d.action is Action.BLOCK and d.rules[0].evaluators[0].details == {"source": "upload"}
        with pytest.raises(InvalidInputError, match="evaluate"):
            await c.upload_evaluator("async-broken", "def other():\n    pass\n")
        with pytest.raises(NotFoundError):
            await c.get_evaluator("00000000-0000-0000-0000-000000000000")


async def test_async_client_server_info_and_stream(server: ServerProcess) -> None:
    async with AsyncClient(server.address, api_key=key("globex")) as c:
        info = await c.server_info()
        assert info.tenant == "globex" and info.multi_tenant and info.version
        assert info.sandbox_backend == server.sandbox and info.weaker_isolation == (server.sandbox == "process")
        await c.deploy_policy(_renamed(KEYWORDS, "async-stream"))
        items = [{"prompt": "p", "response": "bad" if i % 2 else "good", "request_id": f"r{i}"} for i in range(6)]
        answers = {a.request_id: a async for a in c.evaluate_many("async-stream", items, timeout=30)}
        assert sorted(answers) == [f"r{i}" for i in range(6)]
        assert answers["r1"].action is Action.FLAG and answers["r2"].passed
