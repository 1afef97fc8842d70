"""An evaluator's error message may quote the request: custom code's ``int(prompt)`` fails with
``ValueError: invalid literal for int() with base 10: '<the prompt>'``. The rule's reason quoted
that message in the audit record, with no raw audit text and no retention, and ``audit erase``
left it in GetDecision, the database (SQLite file and WAL, PostgreSQL rows), the decision log's
outbox copy and the console's decision page, where a reviewer key read it. It could not be erased:
the reasons are inside the leaf's ``rules_sha256``. The audit record now keeps the error's class
and the SHA-256 of its message, never the message (docs/retention.md); the log verifies after the
erasure (docs/evidence.md). A real server on both stores (``server_store_env``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossaudit import Client
from crossaudit.evidence.notes import generate_private_pem
from crossaudit.kernel.canonical import sha256_text
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.console_http import console_url, sign_in
from tests.e2e.policies import custom_policy, returns

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
REVIEWER = "acme-rita-key-0123456789abcdef"
# No retention entry, no raw audit text: the tenant asked for nothing to be kept.
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
      - {{key: {REVIEWER}, role: reviewer, name: rita}}
"""
SUBJECT = "contact alice-zq9183@example.com"  # a data subject's text, quoted by the evaluator's error
QUOTED = f"invalid literal for int() with base 10: {SUBJECT!r}"
POLICY = custom_policy("parse", returns('{"score": int(prompt)}'), evaluator="parses", rules=["numeric"])


@pytest.fixture
def srv(tmp_path: Path, server_store_env: dict[str, str]) -> Iterator[ServerProcess]:
    signing = tmp_path / "signing.pem"
    signing.write_bytes(generate_private_pem())
    signing.chmod(0o600)
    extra = ("--console-port", "0", "--decision-log-dir", str(tmp_path / "decision-log"),
             "--set", f"evidence.signing_key_file={signing}")  # fmt: skip
    with ServerProcess(tmp_path / "server", keys_text=KEYS_FILE, env=server_store_env, extra=extra) as s:
        yield s


def at_rest(srv: ServerProcess, store_env: dict[str, str]) -> bytes:
    """Every byte the database holds: the SQLite file and its WAL, or every PostgreSQL row as text."""
    url = store_env.get("CROSSAUDIT_STORE_URL")
    if not url:
        path = srv.data_dir / "data" / "crossaudit.db"
        wal = path.with_name(path.name + "-wal")
        return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    import psycopg

    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return "\n".join(str(r[0]) for t in tables for r in conn.execute(f"SELECT t::text FROM {t} t")).encode()


def outbox_payloads(srv: ServerProcess, store_env: dict[str, str], decision_id: str) -> list[str]:
    sql = "SELECT payload FROM outbox WHERE decision_id=? AND kind LIKE ?"
    args = (decision_id, "decision_log:%")
    url = store_env.get("CROSSAUDIT_STORE_URL")
    rows: list[Any]
    if url:
        import psycopg

        with psycopg.connect(url) as conn:
            rows = conn.execute(sql.replace("?", "%s"), args).fetchall()
    else:
        conn = sqlite3.connect(f"file:{srv.data_dir / 'data' / 'crossaudit.db'}?mode=ro", uri=True)
        try:
            rows = conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    return [r[0] if isinstance(r[0], str) else json.dumps(r[0]) for r in rows]


def test_erasure_leaves_no_evaluator_error_text_and_the_log_still_verifies(
    srv: ServerProcess, server_store_env: dict[str, str], tmp_path: Path
) -> None:
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(POLICY)
        d = c.evaluate("parse", SUBJECT, "an answer", {"user_id": "u-zq"}, timeout=60)
    assert d.errored_rules == ["numeric"] and not d.passed
    assert QUOTED in d.rules[0].reason  # the caller, who sent the text, is told why

    res = run_cli("audit", "erase", "--decision", d.decision_id, server=srv, api_key=ADMIN)
    assert res.returncode == 0, res.stderr

    # GetDecision, as the admin reads it
    with Client(srv.address, api_key=ADMIN) as c:
        rec = c.get_decision(d.decision_id)
    assert rec.inputs_erased_at is not None
    stored = json.dumps(rec.rules)
    assert SUBJECT not in stored and "alice-zq9183" not in stored
    [rule] = rec.rules
    # what stays: which evaluator failed, its error's class, and the digest of the message
    assert "parses" in rule["reason"] and "ValueError" in rule["reason"]
    assert sha256_text(d.rules[0].evaluators[0].error or "") in rule["reason"]
    # the database at rest (SQLite: the file and its WAL), and the decision log's outbox copy
    assert b"alice-zq9183" not in at_rest(srv, server_store_env)
    copies = outbox_payloads(srv, server_store_env, d.decision_id)
    assert copies and not any("alice-zq9183" in p for p in copies)
    # the console's decision page, as a reviewer key reads it
    h = sign_in(console_url(srv.start_line), REVIEWER)
    try:
        page = h.get(f"/decisions/{d.decision_id}")
    finally:
        h.close()
    assert page.status_code == 200 and "numeric" in page.text
    assert "alice-zq9183" not in page.text
    # the log verifies after the erasure
    pub = tmp_path / "pub.pem"
    key = run_cli("audit", "key", server=srv, api_key=ADMIN)
    assert key.returncode == 0, key.stderr
    pub.write_text(key.stdout)
    verified = run_cli("audit", "verify", "--key", str(pub), "--json", server=srv, api_key=ADMIN)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["ok"]
