"""PostgreSQL as several replicas see it: migrations applied once, outbox leases that never
overlap, review auto-approval exactly once, typed errors that never show the password; and
SQLite databases from before versioned migrations opening at the current schema."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crossaudit.api.records import AuditRecord, OutboxRecord
from crossaudit.kernel.errors import StoreUnavailableError
from crossaudit.store import SQLiteStore, migrations
from crossaudit.store.postgres import PostgresLimits, PostgresStore, mask_url
from orchestrator.reviews import ReviewState
from tests.records import audit_record, review_record

pytestmark = pytest.mark.slow


def _audit(decision_id: str) -> AuditRecord:
    return audit_record(decision_id, "t")


def test_replicas_starting_together_apply_each_migration_once(postgres_url: str) -> None:
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(PostgresStore(postgres_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(stores) == 4
    assert {s.schema_version() for s in stores} == {len(migrations.POSTGRES)}
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, len(migrations.POSTGRES) + 1))

    async def close() -> None:
        for s in stores:
            await s.aclose()

    asyncio.run(close())


async def test_two_replicas_never_lease_the_same_message(postgres_url: str) -> None:
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    try:
        for i in range(40):
            msg = OutboxRecord(
                id=f"m{i}",
                tenant="t",
                kind="webhook",
                decision_id=f"d{i}",
                rule="r",
                payload={},
                created_at=time.time(),
            )
            await a.record_decision(_audit(f"d{i}"), [], [msg])
        now = time.time()
        got = await asyncio.gather(*(s.claim_outbox(["webhook"], now, limit=7, lease_s=60) for s in (a, b) * 4))
        ids = [m.id for batch in got for m in batch]
        assert len(ids) == len(set(ids)) == 40  # every message leased exactly once
    finally:
        await a.aclose()
        await b.aclose()


async def test_auto_approval_fires_once_across_replicas(postgres_url: str) -> None:
    stores = [PostgresStore(postgres_url) for _ in range(3)]
    try:
        review = review_record("d1", "t", id="r1", params={"auto_approve_at": "2020-01-01T00:00:00+00:00"})
        await stores[0].record_decision(_audit("d1"), [review])
        counts = await asyncio.gather(*(s.auto_approve_due("t", time.time()) for s in stores for _ in range(3)))
        assert sum(counts) == 1
        [item] = await stores[1].list_reviews("t")
        assert (item.state, item.reviewer) == (ReviewState.APPROVED, "auto")
    finally:
        for s in stores:
            await s.aclose()


async def test_a_serialization_failure_reruns_the_transaction(postgres_url: str) -> None:
    """Write skew under SERIALIZABLE: two transactions count the rows, then each inserts one.
    PostgreSQL fails one of them (40001); the store re-runs it, and the re-run sees the other's row."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE skew (who TEXT)")
    store = PostgresStore(postgres_url)
    both_read = threading.Barrier(2, timeout=30)
    runs = {"a": 0, "b": 0}

    def book(who: str) -> Callable[[Any], int]:
        def fn(conn: Any) -> int:
            runs[who] += 1
            seen = int(conn.execute("SELECT COUNT(*) FROM skew").fetchone()[0])
            if runs[who] == 1:
                both_read.wait()  # the first runs overlap; a re-run does not wait for anyone
            conn.execute("INSERT INTO skew VALUES (?)", (who,))
            return seen

        return fn

    try:
        seen = await asyncio.gather(store._run(book("a")), store._run(book("b")))
        assert sorted(seen) == [0, 1] and sorted(runs.values()) == [1, 2]
    finally:
        await store.aclose()


async def test_a_transaction_that_stays_busy_is_unavailable_after_its_retries(postgres_url: str) -> None:
    import psycopg

    store = PostgresStore(postgres_url, limits=PostgresLimits(max_retries=2, retry_backoff_s=0.01))
    runs: list[float] = []

    def busy(conn: Any) -> None:
        runs.append(time.monotonic())
        raise psycopg.errors.SerializationFailure("could not serialize access")

    try:
        with pytest.raises(StoreUnavailableError, match="too busy"):
            await store._run(busy)
        assert len(runs) == 3  # one run and max_retries re-runs
        assert runs[1] - runs[0] >= 0.01 and runs[2] - runs[1] >= 0.02  # waits double
    finally:
        await store.aclose()


async def test_an_unreachable_database_is_unavailable_and_the_password_is_never_shown(postgres_server) -> None:
    url = (
        postgres_server.url()
        .replace("crossaudit@", "crossaudit:s3cr3t-pw@")
        .replace(f":{postgres_server.port}/", ":1/")
    )
    with pytest.raises(StoreUnavailableError) as info:
        PostgresStore(url)
    assert "s3cr3t-pw" not in str(info.value) and "***" in str(info.value)
    assert mask_url("postgresql://u:p%40ss@h:5432/db") == "postgresql://u:***@h:5432/db"


async def test_a_stopped_server_makes_calls_unavailable(postgres_server) -> None:
    from tests.pgserver import PgServer

    own = PgServer().start()
    store = PostgresStore(own.database())
    try:
        assert await store.count_decisions() == 0
        own.stop()
        with pytest.raises(StoreUnavailableError):
            await store.count_decisions()
    finally:
        own.stop()
        await store.aclose()


async def test_an_sqlite_database_from_before_the_outbox_opens_at_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # what the first schema left: its tables and user_version 1
        db.executescript(migrations.SQLITE[0])
        db.execute("PRAGMA user_version=1")
    store = SQLiteStore(path)
    try:
        msg = OutboxRecord(id="m", tenant="t", kind="webhook", decision_id="d", rule="r", payload={})
        await store.record_decision(_audit("d"), [], [msg])
        assert [m.id for m in await store.list_outbox("t")] == ["m"]
    finally:
        await store.aclose()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(migrations.SQLITE)
