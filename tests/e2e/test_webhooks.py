"""Webhooks of ``custom`` actions through a real server to a real receiver on loopback:
signed and rendered, retried until the receiver answers, kept across ``kill -9``, dead-lettered
and redelivered from the CLI; and the decision log to JSONL files and to an HTTP endpoint."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.outbox import signing
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.policies import webhook_policy, word_policy
from tests.webhook_receiver import Receiver, Reply, loopback_grant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = "acme-key-0123456789abcdef"
SIGNING_SECRET = "whsec_" + "c2lnbmluZy1zZWNyZXQtZm9yLXRlc3Rz"  # base64 of "signing-secret-for-tests"
HOOK_TOKEN = "hook-token-value-42"
WAIT_S = 45.0  # bound on waiting for a delivery (backoff included)


def keys_file(receiver_port: int) -> str:
    return f"""
tenants:
  acme:
    keys: [{KEY}]
    secrets: {{HOOK_TOKEN: {{env: ACME_HOOK_TOKEN}}}}
    webhooks: {loopback_grant(f"http://127.0.0.1:{receiver_port}", signing_env="ACME_SIGNING_SECRET")}
"""


def policy(receiver_port: int) -> str:
    """'bad' in the response sends a signed webhook with the tenant's granted token and a header
    the server must replace."""
    return webhook_policy(
        "hooks",
        f"http://127.0.0.1:{receiver_port}/policy-violation",
        rules=["notify_security"],
        method="POST",
        headers={"Authorization": "Bearer ${HOOK_TOKEN}", "webhook-signature": "forged"},
        payload={"violation_type": "{{rule.name}}", "content_hash": "{{content.hash}}", "timestamp": "{{timestamp}}"},
    )


LOGGED = word_policy("logged", rule="notify_security", action="flag")  # every decision goes to the decision log


def server(tmp: Path, receiver_port: int, *extra: str) -> ServerProcess:
    """A server whose tenant acme may send webhooks to the receiver on ``receiver_port``."""
    return ServerProcess(
        tmp,
        keys_text=keys_file(receiver_port),
        env={"ACME_SIGNING_SECRET": SIGNING_SECRET, "ACME_HOOK_TOKEN": HOOK_TOKEN},
        extra=extra,
    )


def wait_state(c: Client, delivery_id: str, state: str, timeout: float = WAIT_S) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [m for m in c.list_deliveries() if m.id == delivery_id]
        if found and found[0].state.value == state:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"delivery {delivery_id} not {state} after {timeout}s: {c.list_deliveries()}")


def test_one_delivery_signed_with_the_rendered_payload_and_granted_secret(tmp_path: Path, receiver: Receiver) -> None:
    with server(tmp_path, receiver.port) as srv:
        with Client(srv.address, api_key=KEY) as c:
            c.deploy_policy(policy(receiver.port))
            d = c.evaluate("hooks", "p", "a bad answer", timeout=20)
            assert d.action.value == "custom" and not d.passed
            [req] = receiver.wait_for(1, answered=200)
            [delivery] = c.list_deliveries()
            wait_state(c, delivery.id, "delivered")
            assert c.evaluate("hooks", "p", "a fine answer", timeout=20).passed
            time.sleep(1.0)
            assert len(c.list_deliveries()) == 1  # a passing rule sends nothing
        with urllib.request.urlopen(f"http://{srv.metrics_address}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
    assert 'crossaudit_delivery_attempts_total{kind="webhook",outcome="delivered"} 1.0' in metrics
    assert (req.method, req.path) == ("POST", "/policy-violation")
    assert req.headers["webhook-id"] == delivery.id
    signing.verify(SIGNING_SECRET, req.headers, req.body)  # the policy's forged header was replaced
    assert req.headers["authorization"] == f"Bearer {HOOK_TOKEN}"  # ${HOOK_TOKEN} from the tenant's grant
    assert req.headers["content-type"] == "application/json"
    body = json.loads(req.body)
    assert body["violation_type"] == "notify_security"
    assert len(body["content_hash"]) == 64 and body["timestamp"]
    # The secret never reached the database: the row keeps the reference.
    db = (srv.data_dir / "data" / "crossaudit.db").read_bytes()
    assert HOOK_TOKEN.encode() not in db and b"${HOOK_TOKEN}" in db


def test_receiver_down_then_up_is_retried_until_delivered(tmp_path: Path) -> None:
    probe = Receiver()
    port = probe.port
    probe.close()  # nothing listens on the port now: connection refused
    with server(tmp_path, port) as srv, Client(srv.address, api_key=KEY) as c:
        c.deploy_policy(policy(port))
        c.evaluate("hooks", "p", "bad", timeout=20)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            [m] = c.list_deliveries()
            if m.attempts >= 2:
                break
            time.sleep(0.2)
        assert m.state.value == "pending" and m.attempts >= 2 and "Connect" in m.last_error, m
        up = Receiver(port)  # the receiver comes back on the same port
        try:
            up.script = [Reply(503, {"Retry-After": "1"})]  # one more refusal, with Retry-After
            got = up.wait_for(2, timeout=WAIT_S)
            final = wait_state(c, m.id, "delivered")
        finally:
            up.close()
    assert [r.answered for r in got[:2]] == [503, 200]
    assert got[0].headers["webhook-id"] == got[1].headers["webhook-id"] == m.id  # one id across retries
    assert final.attempts >= 4  # type: ignore[attr-defined]


def test_kill_9_before_delivery_delivers_after_restart_and_loses_nothing(tmp_path: Path, receiver: Receiver) -> None:
    # The receiver holds its answers, so every delivery is in flight (or not yet tried) at the kill.
    receiver.script = [Reply(200, delay_s=30.0) for _ in range(5)]
    srv = server(tmp_path, receiver.port)
    srv.start()
    with Client(srv.address, api_key=KEY) as c:
        c.deploy_policy(policy(receiver.port))
        decisions = [c.evaluate("hooks", "p", f"bad {i}", timeout=20).decision_id for i in range(5)]
    srv.kill()
    receiver.release.set()  # the held requests end; their caller is gone
    receiver.script = []
    held = len(receiver.requests)
    srv.start()
    try:
        with Client(srv.address, api_key=KEY) as c:
            deliveries = c.list_deliveries()
            assert sorted(m.decision_id for m in deliveries) == sorted(decisions)
            for m in deliveries:
                wait_state(c, m.id, "delivered")
    finally:
        srv.stop()
    delivered = {r.headers["webhook-id"] for r in receiver.requests[held:] if r.answered == 200}
    assert {m.id for m in deliveries} <= delivered


def test_dead_letter_then_redelivery_from_the_cli(tmp_path: Path, receiver: Receiver) -> None:
    receiver.script = [Reply(410)]  # gone: no point retrying
    with server(tmp_path, receiver.port) as srv, Client(srv.address, api_key=KEY) as c:
        c.deploy_policy(policy(receiver.port))
        c.evaluate("hooks", "p", "bad", timeout=20)
        [m] = c.list_deliveries()
        dead = wait_state(c, m.id, "dead")
        assert dead.attempts == 1 and dead.last_status == 410  # type: ignore[attr-defined]
        listing = run_cli("webhooks", "list", "--state", "dead", server=srv, api_key=KEY, sandbox=None, timeout=60)
        assert listing.returncode == 0 and m.id in listing.stdout and "HTTP 410" in listing.stdout
        out = run_cli("webhooks", "redeliver", m.id, server=srv, api_key=KEY, sandbox=None, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"delivery {m.id} queued again" in out.stdout
        wait_state(c, m.id, "delivered")
        again = run_cli("webhooks", "redeliver", "no-such-delivery", server=srv, api_key=KEY, sandbox=None, timeout=60)
        assert again.returncode != 0 and "not found" in again.stderr and "Traceback" not in again.stderr
    assert [r.answered for r in receiver.requests] == [410, 200]


def test_decision_log_reaches_jsonl_files_and_an_http_endpoint(tmp_path: Path, receiver: Receiver) -> None:
    log_dir = tmp_path / "decision-log"
    logs = ("--decision-log-dir", str(log_dir), "--decision-log-url", f"{receiver.url}/logs")
    with server(tmp_path, receiver.port, *logs) as srv:
        with Client(srv.address, api_key=KEY) as c:
            c.deploy_policy(LOGGED)
            ids = {c.evaluate("logged", "p", text, timeout=20).decision_id for text in ("bad", "fine", "bad again")}
            audit = {d.decision_id: d for d in c.list_decisions()}
        deadline = time.monotonic() + WAIT_S
        entries: list[dict] = []
        while time.monotonic() < deadline:
            entries = [
                json.loads(line)
                for f in sorted(log_dir.glob("decisions-*.jsonl"))
                for line in f.read_text().splitlines()
            ]
            if {e["decision_id"] for e in entries} >= ids:
                break
            time.sleep(0.2)
        posted = [e for r in receiver.wait_for(1) if r.path == "/logs" for e in json.loads(r.body)]
        deadline = time.monotonic() + WAIT_S
        while {e["decision_id"] for e in posted} < ids and time.monotonic() < deadline:
            time.sleep(0.2)
            posted = [e for r in receiver.requests if r.path == "/logs" for e in json.loads(r.body)]
    assert {e["decision_id"] for e in entries} == ids == {e["decision_id"] for e in posted}
    for e in entries:
        assert e["schema_version"] == 1 and e["tenant"] == "acme" and e["policy"] == "logged"
        assert e["passed"] == audit[e["decision_id"]].passed
        assert e["rules"][0]["rule"] == "notify_security" and "prompt" not in e  # hashes only by default
    assert oct((log_dir / next(log_dir.glob("*.jsonl")).name).stat().st_mode & 0o777) == "0o600"
    assert all(r.headers.get("content-encoding") == "gzip" for r in receiver.requests if r.path == "/logs")
