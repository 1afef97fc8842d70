"""A caller's ``request_id`` is a correlation id the server keeps in the audit record, the
decision log's outbox row and the evidence leaf. As an attacker sees it (a second attack on the
erasure and log fixes found both):

- it was free text of any length that ``audit_size`` never counted: any caller key stored up to
  ``max_request_bytes`` per decision while the tenant's quota was charged a few hundred bytes;
- a NUL in it made the PostgreSQL store (which writes NUL as U+FFFD) keep a row that no longer
  hashed to the leaf computed before, so one request made the tenant's signed log report an
  edited record that nobody edited.

Now it is at most ``limits.max_request_id_chars`` printable characters, else INVALID_ARGUMENT and
nothing is stored; what is stored counts against the audit caps. A real server on both stores."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.api.records import AuditRecord
from crossaudit.evidence.notes import generate_private_pem
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.service.config import ServiceLimits
from crossaudit.store.base import audit_size
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.policies import custom_policy, returns

pytestmark = [pytest.mark.e2e, pytest.mark.security]

ADMIN = "acme-admin-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: ops}}
"""
POLICY = custom_policy("rid", returns('{"score": 1.0}'), evaluator="ok", rules=["r"])
LIMIT = ServiceLimits().max_request_id_chars
HOSTILE_IDS = {
    "two MiB": "r" * (2 * 1024 * 1024),
    "one past the limit": "r" * (LIMIT + 1),
    "NUL": "a\x00b",
    "newline": "a\nb",
    "escape": "a\x1b[31mb",
    "C1 control": "a\x85b",
}


@pytest.fixture
def srv(tmp_path: Path, server_store_env: dict[str, str]) -> Iterator[ServerProcess]:
    signing = tmp_path / "signing.pem"
    signing.write_bytes(generate_private_pem())
    signing.chmod(0o600)
    extra = ("--set", f"evidence.signing_key_file={signing}")
    with ServerProcess(tmp_path / "server", keys_text=KEYS_FILE, env=server_store_env, extra=extra) as s:
        yield s


def test_a_hostile_request_id_is_refused_and_stores_nothing(srv: ServerProcess, tmp_path: Path) -> None:
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(POLICY)
        kept = c.evaluate("rid", "p", "r", timeout=60, request_id="before").decision_id
        for rid in HOSTILE_IDS.values():
            with pytest.raises(InvalidInputError, match="request_id"):  # INVALID_ARGUMENT, typed
                c.evaluate("rid", "p", "r", timeout=60, request_id=rid)
        longest = c.evaluate("rid", "p", "r", timeout=60, request_id="é" * LIMIT)  # the limit counts characters
        listed = c.list_decisions(policy="rid", limit=100)
        assert c.get_decision(longest.decision_id).request_id == "é" * LIMIT
    assert sorted(d.decision_id for d in listed) == sorted([kept, longest.decision_id])  # nothing else stored
    pub = tmp_path / "pub.pem"
    key = run_cli("audit", "key", server=srv, api_key=ADMIN)
    assert key.returncode == 0, key.stderr
    pub.write_text(key.stdout)
    verified = run_cli("audit", "verify", "--key", str(pub), "--json", server=srv, api_key=ADMIN)
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout[-2000:] + verified.stderr


def test_a_stored_request_id_counts_against_the_audit_caps() -> None:
    bare = AuditRecord(
        decision_id="d", tenant="t", policy="p", policy_revision=1, policy_version="1.0", policy_digest="x",
        environment="production", passed=True, action="allow", rules=[], errored_rules=[], latency_ms=1.0,
        prompt_sha256="a", response_sha256="b", context_sha256="c", created_at=0.0,
    )  # fmt: skip
    with_id = dataclasses.replace(bare, request_id="é" * LIMIT)
    assert audit_size(with_id) - audit_size(bare) == len(("é" * LIMIT).encode())
