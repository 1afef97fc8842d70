"""Attacks on retained inputs and their erasure (docs/retention.md) by someone holding a copy of
the database, or a hostile tenant admin: erased or purged text must not stay readable in the
database files, and an erasure must not cost a walk over the tenant's whole outbox."""

from __future__ import annotations

import base64
import dataclasses
import os
import time
import uuid

import pytest

from crossaudit.api.records import ErasureRecord, OutboxRecord
from crossaudit.governance.retention import Retention
from crossaudit.governance.vault import OperatorKey, OperatorKeys
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import InvalidInputError, QuotaExceededError
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.outbox import decisionlog
from crossaudit.service.config import RetentionConfig
from crossaudit.service.grants import TenantGrants
from crossaudit.store import SQLiteStore
from crossaudit.store.base import Store
from crossaudit.store.sql import ERASE_OUTBOX_COPIES
from orchestrator.policy import load_policy
from tests.records import audit_record

MARKER = "zq-erased-text-4be1"
POLICY = load_policy('name: p\ndescription: d\nversion: "1.0"\n')


def retention(store: Store, **config: object) -> Retention:
    keys = OperatorKeys(OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "test"))
    return Retention(store, TenantGrants(retention={"acme": 86_400.0}), RetentionConfig(**config), keys=keys)  # type: ignore[arg-type]


async def record(store: Store, ret: Retention, decision_id: str, *, now: float, text: str = MARKER) -> bytes:
    """A decision audited with its raw text (and a decision-log copy of it) and retained; returns
    its ciphertext."""
    result = EvaluatorResult(evaluator="e", status=Status.FAIL, score=0.0, violations=[text], identity="i")
    rule = RuleResult(rule="r", status=Status.FAIL, passed=False, evaluators=[result])
    decision = Decision(
        policy="p", policy_version="1.0", passed=False, action=Action.BLOCK, rules=[rule], decision_id=decision_id
    )
    sealed = await ret.seal("acme", POLICY, decision, "production", text, text, {"user_id": "u"}, stage="", now=now)
    assert sealed is not None
    rec = audit_record(
        decision_id,
        "acme",
        action="block",
        rules=[{"rule": "r", "evaluators": [{"evaluator": "e", "violations": [text]}]}],
        prompt_sha256=sha256_text(text),
        response_sha256=sha256_text(text),
        context_sha256=sha256_text("{}"),
        created_at=now,
        prompt=text,
        response=text,
        inputs_retained_until=sealed.expires_at,
    )
    copy = OutboxRecord(
        id=f"log-{decision_id}",
        tenant="acme",
        kind="decision_log:file",
        decision_id=decision_id,
        rule="",
        payload=decisionlog.entry(rec),
        created_at=now,
    )
    await store.record_decision(rec, [], [copy], retained=sealed)
    return sealed.ciphertext


def blank_erasure() -> ErasureRecord:
    return ErasureRecord(str(uuid.uuid4()), "acme", "context_field", "", 0, time.time(), "admin key")


def sqlite_files(store: SQLiteStore) -> bytes:
    """Every byte of the SQLite database: its file and its WAL (what a copy of the data dir holds)."""
    wal = f"{store.path}-wal"
    return open(store.path, "rb").read() + (open(wal, "rb").read() if os.path.exists(wal) else b"")


@pytest.fixture
async def sqlite_store(tmp_path):
    s = SQLiteStore(tmp_path / "db.sqlite")
    yield s
    await s.aclose()


async def test_erased_text_is_not_left_in_the_sqlite_files(sqlite_store: SQLiteStore) -> None:
    """The hole: an erasure set the raw text NULL and deleted the sealed row, but SQLite kept the
    old bytes in freed space of the file and in the WAL; a copy of the data dir still read the
    erased prompt (and the sealed row, which the tenant key, never erased, still opens)."""
    ret = retention(sqlite_store)
    now = time.time()
    sealed = await record(sqlite_store, ret, "d1", now=now)
    long_text = MARKER + "-long-" + "x" * 9000  # over a page: kept in overflow pages
    sealed_long = await record(sqlite_store, ret, "d2", now=now, text=long_text)
    assert MARKER.encode() in sqlite_files(sqlite_store)  # the test sees what it looks for
    await ret.erase("acme", actor="admin key", decision_id="d1")
    await ret.erase("acme", actor="admin key", context_field=("user_id", "u"))
    rest = sqlite_files(sqlite_store)
    assert MARKER.encode() not in rest
    assert sealed not in rest and sealed_long not in rest


async def test_purged_rows_are_not_left_in_the_sqlite_files(sqlite_store: SQLiteStore) -> None:
    ret = retention(sqlite_store)
    sealed = await record(sqlite_store, ret, "d1", now=time.time() - 2 * 86_400)  # expired
    assert await ret.purge_once() == 1
    assert sealed not in sqlite_files(sqlite_store)


def plan(store: Store, sql: str, *args: object) -> str:
    """The backend's query plan of ``sql`` (PostgreSQL told to avoid a sequential scan wherever an
    index could serve: what it does on a table of millions of rows)."""
    if isinstance(store, SQLiteStore):
        return "\n".join(str(tuple(r)) for r in store._conn.execute(f"EXPLAIN QUERY PLAN {sql}", args).fetchall())
    import psycopg

    with psycopg.connect(store.url) as conn:  # type: ignore[attr-defined]
        conn.execute("SET enable_seqscan = off")
        return "\n".join(r[0] for r in conn.execute(f"EXPLAIN {sql.replace('?', '%s')}", args).fetchall())


@pytest.mark.parametrize("selector", ["decision", "context_field"])
async def test_an_erasure_finds_the_outbox_copies_by_decision_not_by_walking_the_tenants_outbox(
    any_store: Store, selector: str
) -> None:
    """The hole: the outbox is never pruned (one decision-log row per decision and sink) and had
    no index by decision, so every erasure read all of its tenant's outbox rows inside a write
    transaction: on SQLite, one admin looping `audit erase` held the only writer's lock for the
    length of that walk, stalling every tenant's decisions."""
    args = ("d1",) if selector == "decision" else ("d1", "d2")  # one decision, or a batch of them
    match = f"decision_id IN ({', '.join('?' * len(args))})"
    shown = plan(any_store, ERASE_OUTBOX_COPIES.format(match=match), "acme", "decision_log:%", *args)
    assert "outbox_decision" in shown, shown


async def test_an_erasure_by_context_field_runs_in_bounded_transactions(any_store: Store) -> None:
    """The hole: erasure by a context field matched every retained decision of the tenant with
    that value in ONE transaction, reading all their audit rules and outbox copies into memory at
    once. A tenant admin erasing a value shared by months of decisions (up to the daily audit
    quota times the retention) held SQLite's writer for all of it and could exhaust the server's
    memory. Now each transaction erases at most retention.erase_batch decisions, and a call makes
    at most retention.max_erase_batches of them (more: a typed error saying how many were erased)."""
    now = time.time()
    ret = retention(any_store, erase_batch=2, max_erase_batches=2)
    for i in range(7):
        await record(any_store, ret, f"d{i}", now=now)
    ids = [f"d{i}" for i in range(7)]
    key = await ret._key("acme", create=False)
    assert key is not None
    digest = key.blind("user_id", "u")
    first = await any_store.erase_inputs(
        dataclasses.replace(blank_erasure(), selector_digest=digest), blind_index=digest, limit=2
    )
    assert first.decisions == 2 and len(await ret.load("acme", ids)) == 5  # one transaction: two decisions
    with pytest.raises(QuotaExceededError, match=r"retention\.max_erase_batches") as e:
        await ret.erase("acme", actor="admin key", context_field=("user_id", "u"))
    assert "erased 4 decision(s)" in e.value.message and "again" in e.value.message
    assert len(await ret.load("acme", ids)) == 1
    done = await ret.erase("acme", actor="admin key", context_field=("user_id", "u"))
    assert done.decisions == 1 and await ret.load("acme", ids) == {}
    for i in range(7):
        assert (await any_store.get_decision("acme", f"d{i}")).prompt is None
    counts = sorted(e.decisions for e in await ret.list_erasures("acme"))
    assert counts == [1, 2, 4]  # one record per call, counting every batch it made


async def test_a_rotation_rewraps_every_key_of_the_previous_operator_key_past_keys_it_cannot_read(
    any_store: Store,
) -> None:
    """The hole: the start-up rotation stopped at the first batch in which no key could be
    rewrapped. A batch full of keys wrapped by a key no longer configured (an older rotation left
    unfinished) ended it, so keys of the previous operator key sorted after them stayed wrapped by
    it; the operator, seeing no rewrap line as the docs say, removed that key and lost those
    tenants' retained inputs."""
    lost = OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "lost")
    old = OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "old")
    new = OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "new")
    grants = TenantGrants(retention={"a1": 86_400.0, "a2": 86_400.0, "b": 86_400.0})
    for tenant, key in (("a1", lost), ("a2", lost), ("b", old)):  # a1, a2 sort before b
        ret = Retention(any_store, grants, RetentionConfig(), keys=OperatorKeys(key))
        assert await ret._key(tenant, create=True) is not None
    rotating = Retention(any_store, grants, RetentionConfig(rewrap_batch=2), keys=OperatorKeys(new, previous=old))
    assert await rotating.rotate() == 1
    rec = await any_store.get_tenant_key("b")
    assert rec is not None and rec.operator_key_id == new.id
    after = Retention(any_store, grants, RetentionConfig(), keys=OperatorKeys(new))  # the old key removed
    assert await after._key("b", create=False) is not None


async def test_a_reader_outside_the_server_delays_the_wal_truncation_without_stalling_the_store(
    sqlite_store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The WAL truncation after an erasure must not wait (busy_timeout) on a reader outside the
    server, such as a backup: every store call queues on the one SQLite thread. It is retried
    at the next erasure or purge, and the log says so."""
    import sqlite3

    ret = retention(sqlite_store)
    await record(sqlite_store, ret, "d1", now=time.time())
    await record(sqlite_store, ret, "d2", now=time.time())
    reader = sqlite3.connect(sqlite_store.path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM decisions").fetchone()  # holds a snapshot
        sqlite_store._conn.execute("PRAGMA busy_timeout=600000")  # a wait would hang this test
        await ret.erase("acme", actor="admin key", decision_id="d1")
        assert "WAL was not truncated" in caplog.text
        assert int(sqlite_store._conn.execute("PRAGMA busy_timeout").fetchone()[0]) == 600000  # restored
    finally:
        reader.close()
    await ret.erase("acme", actor="admin key", decision_id="d2")
    assert MARKER.encode() not in sqlite_files(sqlite_store)  # the next erasure truncated it


@pytest.mark.parametrize("kw", [{"decision_id": "d1", "context_field": ("user_id", "u")}, {}], ids=["both", "neither"])
def test_the_client_refuses_an_erasure_naming_both_selectors_or_none(kw: dict) -> None:
    """The hole: the SDK put only the context field on the wire when given a decision id too, so
    a caller meaning one decision erased every decision of that field's value."""
    from crossaudit import Client

    with (
        Client("127.0.0.1:1", api_key="acme-admin-key-0123456789abcdef") as c,  # never reached
        pytest.raises(InvalidInputError, match="exactly one"),
    ):
        c.erase_inputs(**kw)


@pytest.mark.parametrize("lowered", ["tenant ceiling", "server maximum", "tenant entry removed"])
async def test_a_lowered_ceiling_applies_to_inputs_already_retained(any_store: Store, lowered: str) -> None:
    """The hole: a row kept the expiry computed when it was sealed. An operator who shortened a
    tenant's `retention: {inputs: ...}` or `retention.max_inputs_s`, or removed the tenant's entry
    (a legal hold ended, a contract changed), still had those inputs loaded for replay and kept at
    rest for up to the old period. Now load never answers, and the purge deletes, a row older than
    its tenant's current ceiling."""
    now = time.time()
    before = Retention(
        any_store,
        TenantGrants(retention={"acme": 7 * 86_400.0}),
        RetentionConfig(),
        keys=OperatorKeys(OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "test")),
    )
    await record(any_store, before, "old", now=now - 2 * 86_400)  # sealed two days ago for seven
    await record(any_store, before, "new", now=now - 60)
    assert sorted(await before.load("acme", ["old", "new"])) == ["new", "old"]
    grants, config = {"acme": 86_400.0}, RetentionConfig()
    if lowered == "server maximum":
        grants, config = {"acme": 7 * 86_400.0}, RetentionConfig(max_inputs_s=86_400.0)
    elif lowered == "tenant entry removed":
        grants = {}
    after = Retention(any_store, TenantGrants(retention=grants), config, keys=before.keys)
    kept = [] if lowered == "tenant entry removed" else ["new"]
    assert sorted(await after.load("acme", ["old", "new"])) == kept
    assert await after.purge_once() == 2 - len(kept)
    assert sorted(r.decision_id for r in await any_store.load_retained("acme", ["old", "new"], now)) == kept
