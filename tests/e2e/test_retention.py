"""Retained inputs through a real server on both stores (``server_store_env``): evaluations of a
tenant that retains inputs are sealed with their audit record (the database holds no plaintext,
and what it holds decrypts, with the operator key, to the request and every verdict by identity);
``crossaudit audit erase`` by decision and by context field removes the inputs and the raw audit
text and records it (admin keys only; another tenant's id is NOT_FOUND); the purge worker
deletes expired rows; no operator key, nothing retained; retained text never reaches the log."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossaudit import Client
from crossaudit.governance.vault import OperatorKey, OperatorKeys, TenantKey
from crossaudit.kernel.errors import NotFoundError, PermissionDeniedError
from crossaudit.store.base import AUDIT_DAY_S, audit_size
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.policies import word_policy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
REVIEWER = "acme-rita-key-0123456789abcdef"
GLOBEX = "globex-admin-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
      - {{key: {REVIEWER}, role: reviewer, name: rita}}
    retention: {{inputs: 7d}}
  globex: {{keys: [{GLOBEX}], retention: {{inputs: 7d}}}}
"""
MARKER = "zq-secret-prompt-5c1e"  # retained text: must never appear in plaintext outside the service
QUIET_MARKER = "zq-unaudited-prompt-81b2"  # retained, not audited raw: the database never holds it
USER = "user-zq-4471"  # a data subject's id, in the request context
WAIT_S = 30.0  # bound on waiting for the purge worker

KEPT = word_policy("kept", settings={"audit_all_evaluations": True})  # raw text audited too
QUIET = word_policy("quiet")
BRIEF = word_policy("brief", settings={"retention": {"inputs": "1s"}})  # shortened by the policy


def operator_key_text() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def start(tmp: Path, store_env: dict[str, str], operator_key: str | None) -> ServerProcess:
    # DEBUG: the most the server ever logs is scanned for retained text
    env = {**store_env, "CROSSAUDIT_RETENTION__PURGE_INTERVAL_S": "0.2", "CROSSAUDIT_LOG_LEVEL": "DEBUG"}
    if operator_key is not None:
        env |= {"CROSSAUDIT_RETENTION__OPERATOR_KEY_ENV": "TEST_OPERATOR_KEY", "TEST_OPERATOR_KEY": operator_key}
    srv = ServerProcess(tmp, keys_text=KEYS_FILE, env=env)
    srv.start()
    return srv


class Database:
    """The server's database read directly (read-only for SQLite): what is at rest."""

    def __init__(self, srv: ServerProcess, store_env: dict[str, str]) -> None:
        self.url = store_env.get("CROSSAUDIT_STORE_URL")
        self.path = srv.data_dir / "data" / "crossaudit.db"

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if self.url:
            import psycopg

            with psycopg.connect(self.url) as conn:
                return [tuple(r) for r in conn.execute(sql.replace("?", "%s"), args).fetchall()]
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in conn.execute(sql, args).fetchall()]
        finally:
            conn.close()

    def at_rest(self) -> bytes:
        """Every byte the database holds: the SQLite file and its WAL, or every PostgreSQL row as text."""
        if not self.url:
            wal = self.path.with_name(self.path.name + "-wal")
            return self.path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
        tables = [r[0] for r in self.rows("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return "\n".join(str(r[0]) for t in tables for r in self.rows(f"SELECT t::text FROM {t} t")).encode()

    def decrypt(self, operator_key: str, tenant: str, decision_id: str) -> dict[str, Any]:
        """A retained row opened as the operator could: unwrap the tenant's key, then the row."""
        [(key_id, op_id, wrapped)] = self.rows(
            "SELECT key_id, operator_key_id, wrapped FROM tenant_keys WHERE tenant=?", tenant
        )
        keys = OperatorKeys(OperatorKey.parse(operator_key, "test"))
        key = TenantKey.of(tenant, key_id, keys.unwrap(tenant, op_id, bytes(wrapped)))
        [(nonce, ct)] = self.rows(
            "SELECT nonce, ciphertext FROM retained_inputs WHERE tenant=? AND decision_id=?", tenant, decision_id
        )
        return json.loads(key.open(decision_id, bytes(nonce), bytes(ct)))

    def retained(self, tenant: str) -> list[str]:
        return sorted(r[0] for r in self.rows("SELECT decision_id FROM retained_inputs WHERE tenant=?", tenant))


@pytest.fixture
def keyed(tmp_path: Path, server_store_env: dict[str, str]) -> Iterator[tuple[ServerProcess, Database, str]]:
    key = operator_key_text()
    srv = start(tmp_path, server_store_env, key)
    try:
        yield srv, Database(srv, server_store_env), key
    finally:
        srv.stop()


def test_retained_inputs_are_sealed_with_the_decision_and_decrypt_to_the_request(keyed) -> None:
    srv, db, key = keyed
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(KEPT)
        c.deploy_policy(QUIET)
        d = c.evaluate("kept", MARKER, "a bad answer", {"user_id": USER, "n": 7}, timeout=30, stage="output")
        q = c.evaluate("quiet", QUIET_MARKER, "fine", {"user_id": USER}, timeout=30)
        rec = c.get_decision(d.decision_id)
    assert not d.passed and q.passed
    assert rec.inputs_retained_until is not None and rec.inputs_erased_at is None
    assert 6.9 * 86_400 < rec.inputs_retained_until - rec.created_at <= 7 * 86_400
    doc = db.decrypt(key, "acme", d.decision_id)
    assert (doc["prompt"], doc["response"], doc["context"], doc["stage"]) == (
        MARKER, "a bad answer", {"user_id": USER, "n": 7}, "output"
    )  # fmt: skip
    [(identity, result)] = doc["results"].items()  # the one evaluator, by its engine identity
    assert identity and result["identity"] == identity and result["evaluator"] == "has_bad"
    assert result["score"] == 0.0 and result["status"] == "fail"
    # at rest: no plaintext of what was retained and not audited raw, not even its index
    rest = db.at_rest()
    assert QUIET_MARKER.encode() not in rest and USER.encode() not in rest
    assert db.retained("acme") == sorted([d.decision_id, q.decision_id])
    assert MARKER not in srv.log.read_text() and USER not in srv.log.read_text()


def test_erase_by_decision_and_by_context_field_through_the_cli(keyed) -> None:
    srv, db, _ = keyed
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(KEPT)
        first = c.evaluate("kept", MARKER, "r1", {"user_id": USER}, timeout=30).decision_id
        second = c.evaluate("kept", MARKER, "r2", {"user_id": USER}, timeout=30).decision_id
        other = c.evaluate("kept", MARKER, "r3", {"user_id": "someone-else"}, timeout=30).decision_id
    with Client(srv.address, api_key=GLOBEX) as g:
        g.deploy_policy(KEPT)
        theirs = g.evaluate("kept", MARKER, "g", {"user_id": USER}, timeout=30).decision_id
        with pytest.raises(NotFoundError):  # acme's decision, asked for by globex: erases nothing
            g.erase_inputs(decision_id=first)
    with Client(srv.address, api_key=REVIEWER) as r, pytest.raises(PermissionDeniedError, match="EraseInputs"):
        r.erase_inputs(decision_id=first)
    res = run_cli("audit", "erase", "--decision", first, server=srv, api_key=GLOBEX)
    assert res.returncode == 1 and "not found" in res.stderr, res.stderr

    res = run_cli("audit", "erase", "--decision", first, server=srv, api_key=ADMIN)
    assert res.returncode == 0, res.stderr
    assert f"of 1 decision(s) matching decision {first}" in res.stdout and "by admin 'dpo'" in res.stdout
    # the subject's id from standard input (NAME=-), so it is in no process list or shell history
    res = run_cli(
        "audit", "erase", "--context-field", "user_id=-", "--json", server=srv, api_key=ADMIN, stdin=USER + "\n"
    )
    assert res.returncode == 0, res.stderr
    erasure = json.loads(res.stdout)
    assert (erasure["selector_kind"], erasure["decisions"], erasure["actor"]) == ("context_field", 1, "admin 'dpo'")
    assert USER not in res.stdout  # a keyed digest of the selector, never the value

    assert db.retained("acme") == [other] and db.retained("globex") == [theirs]
    with Client(srv.address, api_key=ADMIN) as c:
        for erased in (first, second):
            rec = c.get_decision(erased)
            assert rec.prompt is None and rec.response is None and rec.inputs_erased_at is not None
            assert rec.prompt_sha256  # hashes stay
        assert c.get_decision(other).prompt == MARKER
    with Client(srv.address, api_key=GLOBEX) as g:
        assert g.get_decision(theirs).prompt == MARKER  # another tenant's subject with the same id: untouched
    kinds = [r[0] for r in db.rows("SELECT selector_kind FROM erasures WHERE tenant=? ORDER BY created_at", "acme")]
    assert kinds == ["decision", "context_field"]
    assert MARKER not in srv.log.read_text() and USER not in srv.log.read_text()


def test_the_purge_worker_removes_expired_inputs(keyed) -> None:
    srv, db, _ = keyed
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(BRIEF)
        c.deploy_policy(QUIET)
        brief = c.evaluate("brief", "p", "r", timeout=30).decision_id
        kept = c.evaluate("quiet", "p", "r", timeout=30).decision_id
        rec = c.get_decision(brief)
    assert rec.inputs_retained_until is not None and rec.inputs_retained_until - rec.created_at <= 1.0
    deadline = time.monotonic() + WAIT_S
    while brief in db.retained("acme") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert db.retained("acme") == [kept]


def test_without_an_operator_key_nothing_is_retained(tmp_path: Path, server_store_env: dict[str, str]) -> None:
    srv = start(tmp_path, server_store_env, None)
    try:
        with Client(srv.address, api_key=ADMIN) as c:
            c.deploy_policy(KEPT)
            d = c.evaluate("kept", MARKER, "r", {"user_id": USER}, timeout=30)
            assert c.get_decision(d.decision_id).inputs_retained_until is None
            erased = c.erase_inputs(decision_id=d.decision_id)  # the raw audit text can still be erased
            assert erased.decisions == 1 and c.get_decision(d.decision_id).prompt is None
        db = Database(srv, server_store_env)
        assert db.retained("acme") == [] and db.rows("SELECT tenant FROM tenant_keys") == []
        assert "no operator key configured: no evaluation inputs are retained" in srv.log.read_text()
    finally:
        srv.stop()


async def test_the_service_loads_what_a_real_evaluation_retained(
    tmp_path: Path, server_store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read interface replay uses (``service.retention.load``), on a server started in this
    process: the decision's inputs and its verdicts by identity, nothing of another tenant's."""
    from crossaudit import AsyncClient
    from crossaudit.service.assembly import start_server
    from crossaudit.service.config import RetentionConfig, ServerConfig

    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    keys.chmod(0o600)
    monkeypatch.setenv("TEST_OPERATOR_KEY", operator_key_text())
    config = ServerConfig(
        port=0,
        data_dir=tmp_path / "data",
        api_keys_file=keys,
        sandbox="process",
        allow_process_sandbox=True,
        policies_dir=None,
        store_url=server_store_env.get("CROSSAUDIT_STORE_URL"),
        retention=RetentionConfig(operator_key_env="TEST_OPERATOR_KEY"),
    )
    running = await start_server(config)
    try:
        async with AsyncClient(running.address, api_key=ADMIN) as c:
            await c.deploy_policy(KEPT)
            d = await c.evaluate("kept", MARKER, "a bad answer", {"user_id": USER}, timeout=30)
            ok = await c.evaluate("kept", "p", "fine", timeout=30)
        retention = running.service.retention
        got = await retention.load("acme", [d.decision_id, ok.decision_id, "no-such-decision"])
        assert sorted(got) == sorted([d.decision_id, ok.decision_id])
        inputs = got[d.decision_id]
        assert (inputs.prompt, inputs.response, inputs.context) == (MARKER, "a bad answer", {"user_id": USER})
        [(identity, result)] = inputs.results.items()  # the rule's one evaluator, by its engine identity
        assert result["identity"] == identity and result["evaluator"] == "has_bad" and result["score"] == 0.0
        assert got[ok.decision_id].results[identity]["score"] == 1.0  # same evaluator and config: same identity
        assert await retention.load("globex", [d.decision_id]) == {}
        # the sealed rows count toward the tenant's audit bytes of the day, beside the records
        store = running.service.store
        records = [await store.get_decision("acme", i) for i in (d.decision_id, ok.decision_id)]
        rows = await store.load_retained("acme", [d.decision_id, ok.decision_id], time.time())
        day = int(records[0].created_at // AUDIT_DAY_S)
        index = 64  # d's one context field, as its blind-index digest (load_retained leaves the index out)
        total = sum(map(audit_size, records)) + sum(r.size for r in rows) + index
        assert await store.audit_bytes("acme", day) == total
    finally:
        await running.stop(0)


def test_erase_refuses_a_context_field_without_a_value_before_calling() -> None:
    res = run_cli("audit", "erase", "--context-field", "user_id", env={"CROSSAUDIT_SERVER": "127.0.0.1:9"})
    assert res.returncode == 1 and "NAME=VALUE" in res.stderr, res.stderr
    res = run_cli("audit", "erase", env={"CROSSAUDIT_SERVER": "127.0.0.1:9"})
    assert res.returncode == 2 and "--decision" in res.stderr, res.stderr
    res = run_cli("audit", "erase", "--context-field", "user_id=-", stdin="", env={"CROSSAUDIT_SERVER": "127.0.0.1:9"})
    assert res.returncode == 1 and "standard input held no value" in res.stderr, res.stderr


def test_a_malformed_operator_key_stops_the_server_before_it_starts(tmp_path: Path) -> None:
    env = {"CROSSAUDIT_RETENTION__OPERATOR_KEY_ENV": "TEST_OPERATOR_KEY", "TEST_OPERATOR_KEY": "c2hvcnQ="}
    srv = ServerProcess(tmp_path, keys_text=KEYS_FILE, env=env)
    with pytest.raises(RuntimeError, match="did not start"):
        srv.start()
    log = srv.log.read_text()
    assert "retention operator key ($TEST_OPERATOR_KEY): 5 bytes, an operator key is 32 bytes" in log
    assert "c2hvcnQ=" not in log and "Traceback" not in log
