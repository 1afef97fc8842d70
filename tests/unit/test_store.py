"""SQLiteStore: versions, deployments, rollback, evaluators, audit, reviews, feedback, tenants."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crossaudit.api.records import AuditRecord, ReviewRecord
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import ErrorCode, InvalidInputError, NotFoundError
from crossaudit.store import SQLiteStore
from crossaudit.store.base import ReviewAlreadyResolvedError
from orchestrator.reviews import ReviewKind, ReviewState
from tests.records import review_record


@pytest.fixture
def store(any_store):  # both backends (tests/conftest.py)
    return any_store


async def deploy(store: SQLiteStore, content: str, env: str = "production", tenant: str = "t1", name: str = "p"):
    return await store.deploy_policy(
        tenant, name=name, declared_version="1.0", description="d", content=content, environment=env
    )


def audit(decision_id: str, tenant: str = "t1", rules: list | None = None) -> AuditRecord:
    return AuditRecord(
        decision_id=decision_id,
        tenant=tenant,
        policy="p",
        policy_revision=1,
        policy_version="1.0",
        policy_digest="x",
        environment="production",
        passed=False,
        action="flag",
        rules=rules if rules is not None else [{"rule": "r1", "status": "fail"}],
        errored_rules=[],
        latency_ms=1.5,
        prompt_sha256=sha256_text("p"),
        response_sha256=sha256_text("r"),
        context_sha256=sha256_text("{}"),
        created_at=time.time(),
    )


def review(decision_id: str, rid: str, tenant: str = "t1") -> ReviewRecord:
    return review_record(decision_id, tenant, id=rid, rule="r1", kind=ReviewKind.FLAG, params={"severity": "high"})


async def test_versions_are_numbered_and_identical_content_is_reused(store: SQLiteStore) -> None:
    v1, d1, created1 = await deploy(store, "a", env="staging")
    v1b, d1b, created1b = await deploy(store, "a", env="production")
    v2, _, created2 = await deploy(store, "b", env="staging")
    assert (v1.version, created1, v1b.version, created1b, v2.version, created2) == (1, True, 1, False, 2, True)
    assert d1.environment == "staging" and d1b.environment == "production"
    assert (await store.get_deployed_policy("t1", "p", "staging")).content == "b"
    assert (await store.get_deployed_policy("t1", "p", "production")).content == "a"
    assert (await store.get_policy_version("t1", "p", 1)).digest == sha256_text("a")
    [summary] = await store.list_policies("t1")
    assert summary.latest_version == 2 and {d.environment for d in summary.deployments} == {"staging", "production"}
    assert await store.list_policies("t1", environment="development") == []


async def test_rollback_goes_to_previous_distinct_version_or_a_given_one(store: SQLiteStore) -> None:
    await deploy(store, "a")
    await deploy(store, "b")
    await deploy(store, "b")  # redeploy of the same version is not a rollback target
    dep, prev = await store.rollback_policy("t1", "p", "production")
    assert (dep.version, prev) == (1, 2)
    dep, prev = await store.rollback_policy("t1", "p", "production", to_version=2)
    assert (dep.version, prev) == (2, 1)
    with pytest.raises(NotFoundError):
        await store.rollback_policy("t1", "p", "production", to_version=9)
    with pytest.raises(NotFoundError):
        await store.rollback_policy("t1", "p", "staging")


async def test_rollback_without_history_is_not_found(store: SQLiteStore) -> None:
    await deploy(store, "a")
    with pytest.raises(NotFoundError, match="no earlier deployment"):
        await store.rollback_policy("t1", "p", "production")


async def test_tenants_never_see_each_other(store: SQLiteStore) -> None:
    await deploy(store, "a", tenant="t1")
    ev, _ = await store.put_evaluator("t1", name="e", code="c", language="python", dependencies=(), digest="d1")
    await store.record_decision(audit("dec1"), [review("dec1", "rv1")])
    assert await store.list_policies("t2") == []
    with pytest.raises(NotFoundError):
        await store.get_deployed_policy("t2", "p", "production")
    with pytest.raises(NotFoundError):
        await store.get_evaluator("t2", ev.id)
    assert await store.list_evaluators("t2") == []
    with pytest.raises(NotFoundError):
        await store.get_decision("t2", "dec1")
    assert await store.list_reviews("t2") == []
    with pytest.raises(NotFoundError):
        await store.resolve_review("t2", "rv1", ReviewState.APPROVED)
    with pytest.raises(NotFoundError):
        await store.add_feedback("t2", "dec1", rule="", label="correct")
    with pytest.raises(NotFoundError):
        await store.rollback_policy("t2", "p", "production", to_version=1)


async def test_evaluators_are_content_addressed_and_versioned(store: SQLiteStore) -> None:
    e1, c1 = await store.put_evaluator("t1", name="e", code="v1", language="python", dependencies=("a",), digest="d1")
    e1b, c1b = await store.put_evaluator("t1", name="e", code="v1", language="python", dependencies=("a",), digest="d1")
    e2, c2 = await store.put_evaluator("t1", name="e", code="v2", language="python", dependencies=(), digest="d2")
    assert c1 and not c1b and c2
    assert e1.id == e1b.id != e2.id and (e1.version, e2.version) == (1, 2)
    assert (await store.get_evaluator("t1", e1.id)).dependencies == ("a",)
    assert (await store.get_evaluator_by_name("t1", "e")).id == e2.id
    assert (await store.get_evaluator_by_name("t1", "e", 1)).code == "v1"
    listed = await store.list_evaluators("t1")
    assert [e.version for e in listed] == [1, 2] and all(e.code == "" for e in listed)


async def test_audit_reviews_and_feedback(store: SQLiteStore) -> None:
    await store.record_decision(audit("dec1"), [review("dec1", "rv1")])
    rec = await store.get_decision("t1", "dec1")
    assert rec.action == "flag" and rec.prompt is None and rec.rules[0]["rule"] == "r1"
    assert await store.count_decisions("t1") == 1 == await store.count_decisions()
    [open_review] = await store.list_reviews("t1", state=ReviewState.OPEN)
    assert open_review.params == {"severity": "high"}
    done = await store.resolve_review("t1", "rv1", ReviewState.REJECTED, reviewer="ann", note="bad")
    assert done.state is ReviewState.REJECTED and done.resolved_at and done.reviewer == "ann"
    with pytest.raises(ReviewAlreadyResolvedError) as err:
        await store.resolve_review("t1", "rv1", ReviewState.APPROVED)
    assert err.value.code is ErrorCode.FAILED_PRECONDITION
    with pytest.raises(InvalidInputError):
        await store.resolve_review("t1", "rv1", ReviewState.OPEN)
    fb = await store.add_feedback("t1", "dec1", rule="r1", label="false_positive", comment="ok")
    assert [f.id for f in await store.list_feedback("t1", "dec1")] == [fb.id]
    with pytest.raises(NotFoundError, match="no rule"):
        await store.add_feedback("t1", "dec1", rule="nope", label="correct")
    await store.add_feedback("t1", "dec1", rule="r1", label="correct")
    await store.add_feedback("t1", "dec1", rule="", label="false_negative")  # decision-level: not counted
    assert await store.feedback_counts("t1") == {("p", "r1"): (2, 1, 0)}
    assert await store.feedback_counts("t2") == {}


async def test_decision_and_its_reviews_are_atomic(store: SQLiteStore) -> None:
    with pytest.raises(InvalidInputError):
        await store.record_decision(audit("dec1"), [review("other", "rv1")])
    assert await store.count_decisions() == 0
    assert await store.list_reviews("t1") == []


async def test_everything_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    s = SQLiteStore(path)
    await deploy(s, "a")
    ev, _ = await s.put_evaluator("t1", name="e", code="c", language="python", dependencies=(), digest="d")
    await s.record_decision(audit("dec1"), [review("dec1", "rv1")])
    await s.set_meta("bootstrapped", "1")
    await s.aclose()
    s2 = SQLiteStore(path)
    try:
        assert (await s2.get_deployed_policy("t1", "p", "production")).content == "a"
        assert (await s2.get_evaluator("t1", ev.id)).code == "c"
        assert (await s2.get_decision("t1", "dec1")).latency_ms == 1.5
        assert len(await s2.list_reviews("t1")) == 1
        assert await s2.get_meta("bootstrapped") == "1"
    finally:
        await s2.aclose()


def test_bad_synchronous_mode_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError):
        SQLiteStore(tmp_path / "x.db", synchronous="sometimes")


async def test_a_closed_store_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    from crossaudit.store.base import StoreUnavailableError

    s = SQLiteStore(tmp_path / "db.sqlite")
    await s.aclose()
    with pytest.raises(StoreUnavailableError) as err:
        await s.list_policies("t1")
    assert err.value.code is ErrorCode.UNAVAILABLE and err.value.retryable


async def test_a_locked_sqlite_database_is_unavailable_and_the_store_still_works_after(tmp_path: Path) -> None:
    """Another program holding the write lock past the busy timeout: a typed, retryable
    StoreUnavailableError (the transaction rolled back), and the next call succeeds."""
    import sqlite3

    from crossaudit.store.base import StoreUnavailableError

    s = SQLiteStore(tmp_path / "db.sqlite", busy_timeout_ms=50)
    other = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailableError, match="database unavailable") as err:
            await s.record_decision(audit("dec1"), [])
        assert err.value.retryable
        other.execute("ROLLBACK")
        await s.record_decision(audit("dec1"), [])
        assert await s.count_decisions("t1") == 1
    finally:
        other.close()
        await s.aclose()


async def test_reviews_past_auto_approve_at_are_approved_by_auto(store: SQLiteStore) -> None:
    import dataclasses

    past, future = "2020-01-01T00:00:00+00:00", "2999-01-01T00:00:00+00:00"
    due = dataclasses.replace(
        review("dec1", "rv-due"), kind=ReviewKind.REQUIRE_REVIEW, params={"auto_approve_at": past}
    )
    later = dataclasses.replace(
        review("dec1", "rv-later"), kind=ReviewKind.REQUIRE_REVIEW, params={"auto_approve_at": future}
    )
    flag = dataclasses.replace(review("dec1", "rv-flag"), params={"auto_approve_at": past})  # flags never auto-approve
    await store.record_decision(audit("dec1"), [due, later, flag])
    assert await store.auto_approve_due("t1", time.time()) == 1
    assert await store.auto_approve_due("t1", time.time()) == 0
    states = {r.id: (r.state, r.reviewer) for r in await store.list_reviews("t1")}
    assert states["rv-due"] == (ReviewState.APPROVED, "auto")
    assert states["rv-later"][0] is ReviewState.OPEN and states["rv-flag"][0] is ReviewState.OPEN
    assert await store.auto_approve_due("t2", time.time()) == 0
