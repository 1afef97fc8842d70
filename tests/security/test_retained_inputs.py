"""Exploits against retained inputs (docs/retention.md), on both stores: a tenant reading or
erasing another tenant's inputs, plaintext at rest, retained text in logs or error messages.
The same attacks through a real server are in tests/e2e/test_retention.py."""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import time

import pytest

from crossaudit.governance.retention import Retention
from crossaudit.governance.vault import OperatorKey, OperatorKeys
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import CrossAuditError, NotFoundError, RetainedInputsTamperedError, RetentionKeyError
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.service.config import RetentionConfig
from crossaudit.service.grants import TenantGrants
from crossaudit.store import SQLiteStore
from crossaudit.store.base import Store
from orchestrator.policy import load_policy
from tests.records import audit_record

MARKER = "zq-secret-8d1f"
SUBJECT = "subject-zq-2b7c"
POLICY = load_policy('name: p\ndescription: d\nversion: "1.0"\n')


def keys() -> OperatorKeys:
    return OperatorKeys(OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "test"))


def retention(store: Store, operator: OperatorKeys | None = None, **config: object) -> Retention:
    grants = TenantGrants(retention={"acme": 86_400.0, "globex": 86_400.0})
    return Retention(store, grants, RetentionConfig(**config), keys=operator or keys())  # type: ignore[arg-type]


async def retain(store: Store, ret: Retention, tenant: str, decision_id: str) -> None:
    now = time.time()
    result = EvaluatorResult(evaluator="e", status=Status.FAIL, score=0.0, violations=[MARKER], identity="i")
    rule = RuleResult(rule="r", status=Status.FAIL, passed=False, evaluators=[result])
    decision = Decision(
        policy="p", policy_version="1.0", passed=False, action=Action.BLOCK, rules=[rule], decision_id=decision_id
    )
    sealed = await ret.seal(
        tenant, POLICY, decision, "production", f"{MARKER} prompt", f"{MARKER} response", {"user_id": SUBJECT},
        stage="", now=now,
    )  # fmt: skip
    assert sealed is not None
    rec = audit_record(
        decision_id,
        tenant,
        action="block",
        rules=[],
        prompt_sha256=sha256_text("x"),
        response_sha256=sha256_text("x"),
        context_sha256=sha256_text("x"),
        created_at=now,
        inputs_retained_until=sealed.expires_at,
    )
    await store.record_decision(rec, [], retained=sealed)


def at_rest(store: Store) -> bytes:
    """Every byte the database holds (the SQLite file and its WAL; every PostgreSQL row as text)."""
    if isinstance(store, SQLiteStore):
        wal = f"{store.path}-wal"
        return open(store.path, "rb").read() + (open(wal, "rb").read() if os.path.exists(wal) else b"")
    import psycopg

    with psycopg.connect(store.url) as conn:  # type: ignore[attr-defined]
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return "\n".join(str(r[0]) for t in tables for r in conn.execute(f"SELECT t::text FROM {t} t")).encode()


async def test_a_tenant_can_neither_read_nor_erase_another_tenants_inputs(any_store: Store) -> None:
    ret = retention(any_store)
    await retain(any_store, ret, "acme", "d1")
    await retain(any_store, ret, "globex", "g1")
    assert await ret.load("globex", ["d1"]) == {}
    with pytest.raises(NotFoundError) as e:
        await ret.erase("globex", actor="admin key", decision_id="d1")
    assert e.value.message == "decision 'd1' not found"  # the same answer as for an id that never was
    with pytest.raises(NotFoundError) as never:
        await ret.erase("globex", actor="admin key", decision_id="never-was")
    assert never.value.message == "decision 'never-was' not found"
    # the same subject id in globex's request context erases globex's decision only
    assert (await ret.erase("globex", actor="admin key", context_field=("user_id", SUBJECT))).decisions == 1
    assert list(await ret.load("acme", ["d1"])) == ["d1"]
    assert await ret.load("globex", ["g1"]) == {}


async def test_nothing_retained_is_at_rest_in_plaintext(any_store: Store) -> None:
    await retain(any_store, retention(any_store), "acme", "d1")
    rest = at_rest(any_store)
    assert MARKER.encode() not in rest and SUBJECT.encode() not in rest
    assert MARKER.encode().hex().encode() not in rest  # nor as PostgreSQL's hex of a bytea


async def test_retained_text_never_reaches_a_log_line_or_an_error(
    any_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    small = retention(any_store)
    await retain(any_store, small, "acme", "d1")
    capped = retention(any_store, max_inputs_bytes_per_decision=64)  # too large to retain: logged
    big = Decision(policy="p", policy_version="1", passed=True, action=Action.ALLOW, rules=[], decision_id="big")
    assert await capped.seal("acme", POLICY, big, "production", MARKER * 10, "", {}, stage="", now=time.time()) is None
    errors: list[CrossAuditError] = []
    # a row moved to another decision, and a server with another operator key
    [row] = await any_store.load_retained("acme", ["d1"], time.time())
    await any_store.record_decision(
        dataclasses.replace(
            (await any_store.get_decision("acme", "d1")), decision_id="d2", inputs_retained_until=row.expires_at
        ),
        [],
        retained=dataclasses.replace(row, decision_id="d2"),
    )
    for call in (
        lambda: small.load("acme", ["d2"]),
        lambda: retention(any_store).load("acme", ["d1"]),
    ):
        with pytest.raises((RetainedInputsTamperedError, RetentionKeyError)) as e:
            await call()
        errors.append(e.value)
    await small.erase("acme", actor="admin key", context_field=("user_id", SUBJECT))
    await small.purge_once()
    assert len(errors) == 2
    for text in [caplog.text, *(str(e) for e in errors)]:
        assert MARKER not in text and SUBJECT not in text
    assert "inputs not retained" in caplog.text and "erasure" in caplog.text
