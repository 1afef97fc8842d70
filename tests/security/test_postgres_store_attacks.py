"""Attacks on the store paths, PostgreSQL first (issue 20, item 5): every tenant-controlled
string and number that reaches SQL, on both backends (``any_store``: SQLite and a private
PostgreSQL, tests/pgserver.py). The shared SQL binds every value as a parameter; what these
probe is what PostgreSQL does with values SQLite takes without complaint."""

from __future__ import annotations

import dataclasses

import pytest

from crossaudit.kernel.errors import CrossAuditError, NotFoundError
from tests.unit.test_store import audit, deploy, review

NUL = "\x00"


@pytest.fixture
def store(any_store):
    return any_store


async def test_nul_bytes_in_tenant_strings_never_fail_a_call_or_lose_a_decision(store) -> None:
    """PostgreSQL text cannot hold U+0000 and psycopg raised an untyped DataError for it: a
    prompt with a NUL in a policy that keeps raw text lost its answered decision's audit record,
    and a NUL in an id or a filter was an internal error instead of "not found"."""
    rec = dataclasses.replace(audit("d1"), prompt=f"hi{NUL}there", response=NUL, request_id=f"r{NUL}1")
    await store.record_decision(rec, [review("d1", "rv1")])
    got = await store.get_decision("t1", "d1")
    assert got.prompt is not None and got.prompt.startswith("hi") and got.prompt.endswith("there")
    assert got.request_id.startswith("r")
    await store.add_feedback("t1", "d1", rule="r1", label="false_positive", comment=f"x{NUL}y")
    for lookup in (
        lambda: store.get_decision("t1", f"d1{NUL}"),
        lambda: store.get_review("t1", f"rv1{NUL}"),
        lambda: store.get_evaluator("t1", NUL),
        lambda: store.get_evaluator_by_name("t1", f"e{NUL}"),
        lambda: store.get_deployed_policy("t1", f"p{NUL}", "production"),
        lambda: store.add_feedback("t1", f"d{NUL}", rule="", label="false_positive"),
    ):
        with pytest.raises(NotFoundError):
            await lookup()
    assert await store.list_decisions("t1", policy=f"p{NUL}") == []
    assert await store.list_decisions(f"t1{NUL}") == []
    assert await store.list_outbox("t1", kind=f"webhook{NUL}") == []
    assert await store.list_policies("t1", f"production{NUL}") == []


async def test_out_of_range_numbers_are_typed_errors_or_clamped(store) -> None:
    """A page size or time bound beyond what the database's integer and float types hold must
    never surface as a driver exception (PostgreSQL: NumericValueOutOfRange; SQLite: OverflowError)."""
    await store.record_decision(audit("d1"), [])
    for call in (
        lambda: store.list_decisions("t1", limit=10**30),
        lambda: store.list_reviews("t1", limit=2**64),
        lambda: store.list_outbox("t1", limit=10**40),
        lambda: store.list_decisions("t1", since=-1e308, until=1e308),
    ):
        try:
            rows = await call()
        except CrossAuditError:
            continue
        assert isinstance(rows, list)
    assert [r.decision_id for r in await store.list_decisions("t1", limit=10**30)] == ["d1"]


@pytest.mark.parametrize("hostile", ["%", "_", "p%", "'", "p' OR '1'='1", "p\\", "t1' --", "*"])
async def test_quotes_and_like_wildcards_never_widen_a_filter_or_cross_tenants(store, hostile: str) -> None:
    """Held: every value is a bound parameter and the only LIKE pattern is a constant, so SQL
    syntax and LIKE wildcards in a tenant's filters match themselves only."""
    await store.record_decision(audit("d1"), [review("d1", "rv1")])
    await store.record_decision(audit("d2", tenant="t2"), [review("d2", "rv2", tenant="t2")])
    await deploy(store, "content: 1", tenant="t2", name="p")
    assert await store.list_decisions("t1", policy=hostile) == []
    assert await store.list_decisions(hostile) == []
    assert await store.list_reviews(hostile) == []
    assert await store.list_reviews("t1", policy=hostile) == []
    assert await store.list_policies(hostile) == []
    assert await store.list_policies("t2", hostile) == []
    with pytest.raises(NotFoundError):
        await store.get_decision(hostile, "d1")
    with pytest.raises(NotFoundError):
        await store.get_deployed_policy("t1", hostile, "production")
    assert [r.decision_id for r in await store.list_decisions("t1")] == ["d1"]


async def test_a_statement_stuck_on_a_lock_gives_its_pool_connection_back(postgres_url: str) -> None:
    """A query waiting on a lock another session holds (or running long) held one of the pool's
    connections for as long as that lasted, with no bound: a few such calls and every tenant's
    store operations waited for a free connection. ``statement_timeout_s`` bounds each statement."""
    import asyncio

    import psycopg

    from crossaudit.store.base import StoreUnavailableError
    from crossaudit.store.postgres import PostgresLimits, PostgresStore

    store = PostgresStore(postgres_url, limits=PostgresLimits(pool_size=1, statement_timeout_s=0.5))
    holder = psycopg.connect(postgres_url, connect_timeout=5)
    try:
        holder.execute("LOCK TABLE decisions IN ACCESS EXCLUSIVE MODE")  # an open transaction holds it
        with pytest.raises(StoreUnavailableError):  # typed, by the statement timeout: not a wait_for's TimeoutError
            await asyncio.wait_for(store.list_decisions("t1"), 20)
        holder.rollback()
        assert await asyncio.wait_for(store.list_decisions("t1"), 20) == []  # the one connection is back
    finally:
        holder.close()
        await store.aclose()


async def test_a_policy_listing_reads_one_page_not_the_tenants_whole_table(store) -> None:
    """A tenant's policies are not capped in number and ListPolicies read every one of them (and
    every deployment) into memory before cutting the answer to ``limits.max_list_items``: the page
    is now cut in SQL, the environment filter applied before the cut."""
    for i in range(12):
        await deploy(store, f"content: {i}", env="production" if i % 3 == 0 else "staging", name=f"p{i:02d}")
    page = await store.list_policies("t1", limit=4)
    assert [p.name for p in page] == ["p00", "p01", "p02", "p03"]
    deployed = await store.list_policies("t1", "production", limit=3)
    assert [p.name for p in deployed] == ["p00", "p03", "p06"]
    assert [d.environment for d in deployed[0].deployments] == ["production"]
    assert len(await store.list_policies("t1")) == 12
    assert await store.list_policies("t1", limit=0) == []


async def test_a_decision_listing_is_bounded_in_bytes_not_only_in_count(store) -> None:
    """ListDecisions read up to max_list_items (1000) whole records of up to 256 KiB each, 256 MiB
    per call, into memory (and then could not send them: the answer limit is 8 MiB). The store now
    adds up the stored sizes first and reads only the records that fit ``max_bytes``."""
    big = "x" * 100_000
    for i in range(5):
        await store.record_decision(dataclasses.replace(audit(f"d{i}"), created_at=1000.0 + i, prompt=big), [])
    assert [r.decision_id for r in await store.list_decisions("t1", limit=10, max_bytes=250_000)] == ["d4", "d3"]
    assert [r.decision_id for r in await store.list_decisions("t1", limit=10, max_bytes=10)] == ["d4"]
    assert len(await store.list_decisions("t1", limit=10, max_bytes=10**9)) == 5
    assert len(await store.list_decisions("t1", limit=3)) == 3
    assert (await store.list_decisions("t1", limit=1, max_bytes=10**9))[0].prompt == big


async def test_the_statement_timeout_keeps_the_urls_own_options(postgres_url: str) -> None:
    """``options`` given to the pool replaced any ``options`` of the operator's URL."""
    from crossaudit.store.postgres import PostgresLimits, PostgresStore

    sep = "&" if "?" in postgres_url else "?"
    url = f"{postgres_url}{sep}options=-c%20lock_timeout%3D1234"
    store = PostgresStore(url, limits=PostgresLimits(statement_timeout_s=2))
    try:
        with store._pool.connection() as conn:
            assert conn.execute("SHOW lock_timeout").fetchone()[0] == "1234ms"
            assert conn.execute("SHOW statement_timeout").fetchone()[0] == "2s"
            conn.rollback()
    finally:
        await store.aclose()
