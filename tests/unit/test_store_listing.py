"""The store's filtered listings, all built by one helper (``crossaudit.store.sql._listing``).

The helper's contract (values only bound, optional filters left out, the page clamped) is checked
on its output; then every listing's filters, time bounds, order and page are checked on both
backends, so the shared SQL behaves the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from crossaudit.api.records import OutboxRecord, OutboxState, ReviewRecord
from crossaudit.store.sql import MAX_SQL_INT, _listing
from orchestrator.reviews import ReviewKind, ReviewState
from tests.records import audit_record

HOSTILE = "x' OR '1'='1"


def test_values_are_bound_never_written_into_the_sql() -> None:
    sql, args = _listing(
        "reviews", HOSTILE, {"policy=?": HOSTILE, "state=?": None}, since=1, until=None, order="id", limit=2**80
    )
    assert sql == "SELECT * FROM reviews WHERE tenant=? AND policy=? AND created_at>=? ORDER BY id LIMIT ?"
    assert args == [HOSTILE, HOSTILE, 1.0, MAX_SQL_INT]
    assert HOSTILE not in sql


def test_a_listing_without_a_page_has_no_limit_and_a_negative_page_is_empty() -> None:
    assert _listing("feedback", "t1", order="created_at, id") == (
        "SELECT * FROM feedback WHERE tenant=? ORDER BY created_at, id",
        ["t1"],
    )
    assert _listing("outbox", "t1", order="id", limit=-5)[1] == ["t1", 0]
    grouped = _listing("policy_versions pv", "t1", columns="name, MAX(version) AS v", group="name", order="name")
    assert (
        grouped[0]
        == "SELECT name, MAX(version) AS v FROM policy_versions pv WHERE tenant=? GROUP BY name ORDER BY name"
    )


def test_a_condition_must_bind_exactly_one_value() -> None:
    with pytest.raises(AssertionError):
        _listing("reviews", "t1", {"policy=? OR policy=?": "p"}, order="id")


@pytest.fixture
def store(any_store):  # both backends (tests/conftest.py)
    return any_store


def review(n: int, decision_id: str, policy: str, state: ReviewState = ReviewState.OPEN) -> ReviewRecord:
    return ReviewRecord(
        id=f"rv{n}",
        tenant="t1",
        decision_id=decision_id,
        policy=policy,
        policy_revision=1,
        environment="production",
        rule="r",
        kind=ReviewKind.FLAG,
        state=state,
        created_at=1000.0 + n,
    )


def message(n: int, decision_id: str, kind: str, **fields: Any) -> OutboxRecord:
    return OutboxRecord(
        id=f"m{n}",
        tenant="t1",
        kind=kind,
        decision_id=decision_id,
        rule="r",
        payload={"n": n},
        created_at=1000.0 + n,
        **fields,
    )


async def test_decisions_by_policy_time_window_page_and_bytes(store) -> None:
    for n in range(6):
        policy = "a" if n % 2 == 0 else "b"
        await store.record_decision(audit_record(f"d{n}", policy=policy, created_at=1000.0 + n), [])
    await store.record_decision(audit_record("other", tenant="t2", created_at=1003.0), [])

    def ids(records: list) -> list[str]:
        return [r.decision_id for r in records]

    assert ids(await store.list_decisions("t1")) == ["d5", "d4", "d3", "d2", "d1", "d0"]  # newest first
    assert ids(await store.list_decisions("t1", policy="a")) == ["d4", "d2", "d0"]
    assert ids(await store.list_decisions("t1", policy="")) == ids(await store.list_decisions("t1"))  # "" is any
    assert ids(await store.list_decisions("t1", since=1001, until=1003)) == ["d3", "d2", "d1"]  # bounds included
    assert ids(await store.list_decisions("t1", policy="b", since=1002, limit=1)) == ["d5"]
    assert ids(await store.list_decisions("t1", limit=2**70)) == ids(await store.list_decisions("t1"))
    assert await store.list_decisions("t1", limit=0) == []
    assert ids(await store.list_decisions("t1", policy=HOSTILE)) == []
    # a byte budget keeps whole records, newest first, and always at least one
    assert ids(await store.list_decisions("t1", max_bytes=1)) == ["d5"]
    assert ids(await store.list_decisions("t1", policy="a", max_bytes=10**9)) == ["d4", "d2", "d0"]


async def test_reviews_and_feedback_by_their_filters(store) -> None:
    await store.record_decision(audit_record("d1", policy="a"), [review(1, "d1", "a"), review(2, "d1", "a")])
    await store.record_decision(audit_record("d2", policy="b"), [review(3, "d2", "b")])
    await store.resolve_review("t1", "rv2", ReviewState.APPROVED)

    def rids(records: list) -> list[str]:
        return [r.id for r in records]

    assert rids(await store.list_reviews("t1")) == ["rv1", "rv2", "rv3"]  # oldest first
    assert rids(await store.list_reviews("t1", state=ReviewState.OPEN)) == ["rv1", "rv3"]
    assert rids(await store.list_reviews("t1", state=ReviewState.OPEN, policy="a")) == ["rv1"]
    assert rids(await store.list_reviews("t1", policy="", limit=2)) == ["rv1", "rv2"]
    assert await store.list_reviews("t2") == []

    f1 = await store.add_feedback("t1", "d1", rule="", label="correct")
    f2 = await store.add_feedback("t1", "d2", rule="", label="correct")
    assert [f.id for f in await store.list_feedback("t1")] == [f1.id, f2.id]
    assert [f.id for f in await store.list_feedback("t1", "d2")] == [f2.id]
    assert await store.list_feedback("t2") == []


async def test_outbox_by_state_and_kind(store) -> None:
    await store.record_decision(
        audit_record("d1"),
        [],
        [message(1, "d1", "webhook"), message(2, "d1", "decision_log:file"), message(3, "d1", "webhook")],
    )
    assert [m.id for m in await store.list_outbox("t1")] == ["m3", "m2", "m1"]  # newest first
    assert [m.id for m in await store.list_outbox("t1", kind="webhook", limit=1)] == ["m3"]
    assert [m.id for m in await store.list_outbox("t1", state=OutboxState.PENDING, kind="")] == ["m3", "m2", "m1"]
    assert await store.list_outbox("t1", state=OutboxState.DELIVERED) == []
    assert await store.list_outbox("t2") == []


async def test_policies_deployments_and_evaluators_by_their_filters(store) -> None:
    async def deploy(tenant: str, name: str, version: str, env: str) -> None:
        content = f"{name} {version}"
        await store.deploy_policy(
            tenant, name=name, declared_version=version, description="", content=content, environment=env
        )

    for name, env in (("p1", "production"), ("p2", "staging"), ("p3", "production")):
        await deploy("t1", name, "1", env)
    await deploy("t1", "p1", "2", "staging")
    await deploy("t2", "p9", "1", "production")

    listed = await store.list_policies("t1")
    assert [(p.name, p.latest_version) for p in listed] == [("p1", 2), ("p2", 1), ("p3", 1)]
    assert [d.environment for d in listed[0].deployments] == ["production", "staging"]
    assert [p.name for p in await store.list_policies("t1", "production")] == ["p1", "p3"]
    assert [p.name for p in await store.list_policies("t1", "", limit=1)] == ["p1"]
    assert [p.name for p in await store.list_policies("t1", limit=2**70)] == ["p1", "p2", "p3"]
    assert [d.environment for d in await store.list_deployments("t1", "p1")] == ["production", "staging"]
    assert await store.list_deployments("t1", "") == []  # a name is required, never "any"

    for name, code in (("e2", "a"), ("e1", "a"), ("e1", "b")):
        await store.put_evaluator("t1", name=name, code=code, language="python", dependencies=(), digest=name + code)
    assert [(e.name, e.version) for e in await store.list_evaluators("t1")] == [("e1", 1), ("e1", 2), ("e2", 1)]
    assert [(e.name, e.version) for e in await store.list_evaluators("t1", "e2")] == [("e2", 1)]
    assert all(e.code == "" for e in await store.list_evaluators("t1"))  # listings never carry code
    assert await store.list_evaluators("t2") == []


async def test_decisions_are_keyset_paged_by_policy_environment_and_range(store) -> None:
    """page_decisions (replay): most recent first, ties in created_at broken by id, every record
    once however the pages fall; another policy, environment or tenant is never on a page."""
    same = 1_000_000.0
    mine = [audit_record(f"d{i}", created_at=same if i < 4 else same + i) for i in range(7)]
    others = [
        audit_record("other-policy", policy="q", created_at=same),
        audit_record("other-env", environment="staging", created_at=same),
        audit_record("other-tenant", tenant="t2", created_at=same),
        audit_record("too-old", created_at=same - 10),
    ]
    for rec in [*mine, *others]:
        await store.record_decision(rec, [])
    seen, after = [], None
    for _ in range(10):
        page = await store.page_decisions(
            "t1", policy="p", environment="production", since=same, until=None, after=after, limit=2
        )
        if not page:
            break
        seen += [r.decision_id for r in page]
        after = (page[-1].created_at, page[-1].decision_id)
    assert seen == ["d6", "d5", "d4", "d0", "d1", "d2", "d3"]
    newest = await store.page_decisions(
        "t1", policy="p", environment="production", since=None, until=same + 4, after=None, limit=10
    )
    assert [r.decision_id for r in newest] == ["d4", "d0", "d1", "d2", "d3", "too-old"]
