"""Records as a principal: reviewer roles on the queue and on resolution; the audit log's time range."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from crossaudit.governance.records import Records
from crossaudit.kernel.errors import NotFoundError, PermissionDeniedError
from crossaudit.service.config import ServiceLimits
from crossaudit.service.principals import Principal, Role
from crossaudit.service.tenants import Tenants
from crossaudit.store import SQLiteStore
from orchestrator.reviews import ReviewState
from tests.unit.test_store import audit, review

ALICE = Principal("t1", Role.REVIEWER, "alice", frozenset({"content_moderator"}))
BOB = Principal("t1", Role.REVIEWER, "bob")
APP = Principal("t1", Role.SERVICE, "app")


@pytest.fixture
async def records(tmp_path: Path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    moderated = dataclasses.replace(review("d1", "needs-mod"), params={"reviewer_role": "content_moderator"})
    await store.record_decision(dataclasses.replace(audit("d1"), created_at=100.0), [moderated])
    await store.record_decision(dataclasses.replace(audit("d2"), created_at=200.0), [review("d2", "anyone")])
    await store.record_decision(dataclasses.replace(audit("d3", tenant="t2"), created_at=150.0), [])
    yield Records(store, Tenants(store, lambda *a: None), limits=ServiceLimits())  # type: ignore[arg-type]
    await store.aclose()


async def test_a_reviewers_queue_holds_what_it_may_resolve(records: Records) -> None:
    assert {r.id for r in await records.list_reviews("t1", principal=ALICE)} == {"needs-mod", "anyone"}
    assert {r.id for r in await records.list_reviews("t1", principal=BOB)} == {"anyone"}
    assert {r.id for r in await records.list_reviews("t1", principal=Principal("t1"))} == {"needs-mod", "anyone"}
    with pytest.raises(PermissionDeniedError):
        await records.list_reviews("t1", principal=APP)
    with pytest.raises(PermissionDeniedError, match="own tenant"):
        await records.list_reviews("t2", principal=ALICE)


async def test_resolution_checks_the_reviewer_role_and_records_the_principals_name(records: Records) -> None:
    with pytest.raises(PermissionDeniedError, match="needs reviewer_role 'content_moderator'"):
        await records.resolve_review("t1", "needs-mod", ReviewState.APPROVED, reviewer="alice", principal=BOB)
    with pytest.raises(PermissionDeniedError, match=r"may not call ReviewService\.ResolveReview"):
        await records.resolve_review("t1", "anyone", ReviewState.APPROVED, principal=APP)
    with pytest.raises(NotFoundError):
        await records.resolve_review("t1", "no-such-item", ReviewState.APPROVED, principal=ALICE)
    done = await records.resolve_review("t1", "needs-mod", ReviewState.REJECTED, reviewer="bob", principal=ALICE)
    assert (done.state, done.reviewer) == (ReviewState.REJECTED, "alice")
    assert (await records.get_review("t1", "needs-mod", principal=ALICE)).reviewer == "alice"
    with pytest.raises(NotFoundError):
        await records.get_review("t1", "needs-mod", principal=BOB)  # not an item of bob's queue


async def test_the_audit_log_filters_by_time_range(records: Records) -> None:
    assert [d.decision_id for d in await records.list_decisions("t1")] == ["d2", "d1"]
    assert [d.decision_id for d in await records.list_decisions("t1", since=150)] == ["d2"]
    assert [d.decision_id for d in await records.list_decisions("t1", until=150)] == ["d1"]
    assert [d.decision_id for d in await records.list_decisions("t1", since=100, until=200)] == ["d2", "d1"]
    assert await records.list_decisions("t1", since=201) == []
    assert [d.decision_id for d in await records.list_decisions("t2", since=0)] == ["d3"]
