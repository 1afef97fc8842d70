"""A tenant's webhook backlog: 10,000 pending deliveries to a receiver that never answers must
not spin the delivery worker (it leased rows of a tenant already at its in-flight share, handed
them back and woke at once: 80-97% of a core with no caller at all, on the loop and store thread
every tenant shares), nor delay another tenant's webhooks; and a tenant's outbox is bounded
(pending webhooks per tenant, webhook rules per policy) without ever losing an answered
decision's audit record. The store's part runs on both backends; the rest through a real server.

The backlog is written with the real store before the server starts (as a server restarted on a
backlog finds it); the receiver is a loopback port that accepts and never answers. The server's
CPU is read from /proc over a few seconds: the figure is printed (target: under 5% of a core,
docs/webhooks.md); the assertion is generous so that a noisy shared machine does not flake."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.api.records import AuditRecord, OutboxRecord, OutboxState
from crossaudit.kernel.errors import QuotaExceededError
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.webhooks import webhook_payload
from crossaudit.store import SQLiteStore
from crossaudit.store.base import Store
from tests.e2e.conftest import ServerProcess
from tests.e2e.policies import webhook_policy
from tests.records import audit_record
from tests.webhook_receiver import HangingReceiver, Receiver, loopback_grant

pytestmark = pytest.mark.security

PENDING = 10_000
MEASURE_S = 5.0
CPU_BOUND = 0.30  # of one core; the target is 0.05 (see the module docstring)
SIGNING_SECRET = "a-signing-secret-for-the-backlog-test"
WAIT_S = 30.0


def keys_file(hanging: int, working: int) -> str:
    return f"""
tenants:
  acme:
    keys: [acme-key-0123456789abcdef]
    webhooks: {loopback_grant(f"http://127.0.0.1:{hanging}", signing_env="SIGNING_SECRET")}
  globex:
    keys: [globex-key-0123456789abcdef]
    webhooks: {loopback_grant(f"http://127.0.0.1:{working}", signing_env="SIGNING_SECRET")}
"""


def audit(decision_id: str, tenant: str) -> AuditRecord:
    return audit_record(decision_id, tenant, policy="hooks")


def seed(open_store: Callable[[], Store], rows: list[tuple[str, str]]) -> None:
    """One decision with one due webhook per (tenant, url), through the real store."""

    async def write() -> None:
        store = open_store()
        limits = DeliveryLimits()
        now = time.time()

        async def one(tenant: str, url: str) -> None:
            decision_id = str(uuid.uuid4())
            msg = OutboxRecord(
                id=str(uuid.uuid4()),
                tenant=tenant,
                kind="webhook",
                decision_id=decision_id,
                rule="notify",
                payload=webhook_payload({"url": url, "method": "POST"}, {"decision": decision_id}, limits),
                next_attempt_at=now,
                created_at=now,
            )
            await store.record_decision(audit(decision_id, tenant), [], [msg])

        try:
            for start in range(0, len(rows), 500):  # group commit writes each slice in a few transactions
                await asyncio.gather(*(one(t, u) for t, u in rows[start : start + 500]))
        finally:
            await store.aclose()

    asyncio.run(write())


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def receivers() -> Iterator[tuple[HangingReceiver, Receiver]]:
    hanging, working = HangingReceiver(), Receiver()
    try:
        yield hanging, working
    finally:
        hanging.close()
        working.close()


@pytest.mark.e2e
def test_a_backlog_to_a_hanging_receiver_leaves_the_server_idle_and_others_served(
    tmp_path: Path, receivers: tuple[HangingReceiver, Receiver]
) -> None:
    hanging, working = receivers
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    seed(
        lambda: SQLiteStore(data / "crossaudit.db"),
        [("acme", f"{hanging.url}/hook")] * PENDING + [("globex", f"{working.url}/hook")] * 5,
    )
    with ServerProcess(
        tmp_path, keys_text=keys_file(hanging.port, working.port), env={"SIGNING_SECRET": SIGNING_SECRET}
    ) as srv:
        share = DeliveryLimits().max_inflight_per_tenant
        # another tenant's webhooks go out while acme's backlog hangs
        working.wait_for(5, WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while hanging.open_connections() < share and time.monotonic() < deadline:
            time.sleep(0.2)
        assert hanging.open_connections() == share  # acme holds its share of attempts, no more
        time.sleep(1.0)
        c0, t0 = cpu_seconds(srv.pid), time.monotonic()
        time.sleep(MEASURE_S)
        used = (cpu_seconds(srv.pid) - c0) / (time.monotonic() - t0)
        print(f"\nidle CPU of the server with {PENDING} pending deliveries to a hanging receiver: {used:.1%} of a core")
        assert hanging.open_connections() <= share
        assert used < CPU_BOUND, f"the delivery worker spins: {used:.0%} of a core with no caller"


# --- the store, both backends ------------------------------------------------------------------


def message(decision_id: str, tenant: str, due: float, kind: str = "webhook") -> OutboxRecord:
    return OutboxRecord(
        id=f"{decision_id}-{kind}",
        tenant=tenant,
        kind=kind,
        decision_id=decision_id,
        rule="notify",
        payload={"url": "https://hooks.example/"},
        next_attempt_at=due,
        created_at=due,
    )


async def test_a_claim_takes_no_row_of_a_tenant_at_its_share_and_serves_the_others_in_turn(any_store: Store) -> None:
    """The spin's cause: rows of a tenant at its share were leased, only to be handed back."""
    t0 = time.time() - 100
    for i in range(200):  # acme's backlog is the oldest
        await any_store.record_decision(audit(f"a{i}", "acme"), [], [message(f"a{i}", "acme", t0 + i * 0.01)])
    for i in range(3):
        await any_store.record_decision(audit(f"g{i}", "globex"), [], [message(f"g{i}", "globex", t0 + 10 + i)])
    await any_store.record_decision(audit("i0", "initech"), [], [message("i0", "initech", t0 + 20)])
    now = time.time()
    got = await any_store.claim_outbox(["webhook"], now, limit=10, lease_s=60, per_tenant=2, held={"acme": 2})
    assert [m.tenant for m in got] == ["globex", "initech", "globex"]  # in turns; acme: none at all
    got = await any_store.claim_outbox(["webhook"], now, limit=10, lease_s=60, per_tenant=2, held={"acme": 1})
    assert [m.id for m in got] == ["a0-webhook", "g2-webhook"]  # acme: its one free slot, its oldest first
    got = await any_store.claim_outbox(["webhook"], now, limit=3, lease_s=60, per_tenant=4)
    assert [m.id for m in got] == ["a1-webhook", "a2-webhook", "a3-webhook"]  # limit: acme is oldest


async def test_pending_webhooks_are_capped_per_tenant_and_the_decision_is_always_recorded(any_store: Store) -> None:
    now = time.time()
    refused = []
    for i in range(5):
        msgs = [message(f"d{i}", "acme", now), message(f"d{i}", "acme", now, kind="decision_log:file")]
        refused += await any_store.record_decision(audit(f"d{i}", "acme"), [], msgs, max_pending={"webhook": 3})
    assert [m.id for m in refused] == ["d3-webhook", "d4-webhook"]
    assert await any_store.count_decisions("acme") == 5  # every answered decision is in the audit log
    kinds = [m.kind for m in await any_store.list_outbox("acme", limit=100)]
    assert kinds.count("webhook") == 3 and kinds.count("decision_log:file") == 5  # the operator's log: all
    other = await any_store.record_decision(
        audit("g0", "globex"), [], [message("g0", "globex", now)], max_pending={"webhook": 3}
    )
    assert other == []  # another tenant's quota is its own
    # redelivery counts against the same quota
    [first] = await any_store.claim_outbox(["webhook"], now, limit=1, lease_s=60, per_tenant=4)
    await any_store.settle_outbox(first, state=OutboxState.DEAD, last_error="HTTP 400", now=now)
    await any_store.record_decision(audit("d5", "acme"), [], [message("d5", "acme", now)], max_pending={"webhook": 3})
    with pytest.raises(QuotaExceededError, match="3 webhook messages of this tenant are pending, at most 3"):
        await any_store.redeliver_outbox("acme", first.id, now, kind="webhook", max_pending=3)
    assert (await any_store.redeliver_outbox("acme", first.id, now, kind="webhook", max_pending=4)).attempts == 0


# --- quotas through a real server ----------------------------------------------------------------


def hook_policy(url: str, rules: int = 1) -> str:
    return webhook_policy(f"hooks{rules}", f"{url}/hook", rules=[f"notify_{i}" for i in range(rules)])


@pytest.mark.e2e
def test_a_tenant_over_its_pending_quota_still_gets_and_keeps_its_decisions(
    tmp_path: Path, receivers: tuple[HangingReceiver, Receiver]
) -> None:
    hanging, working = receivers
    with ServerProcess(
        tmp_path,
        keys_text=keys_file(hanging.port, working.port),
        env={"SIGNING_SECRET": SIGNING_SECRET},
        extra=(
            "--set",
            "delivery_limits.max_pending_per_tenant=3",
            "--set",
            "delivery_limits.max_webhook_rules_per_policy=4",
        ),
    ) as srv:
        with Client(srv.address, api_key="acme-key-0123456789abcdef") as acme:
            with pytest.raises(
                QuotaExceededError,
                match=r"5 rules whose action sends a webhook.*at most 4 "
                r"\(delivery_limits\.max_webhook_rules_per_policy\)",
            ) as refused:
                acme.deploy_policy(hook_policy(hanging.url, rules=5), environment="production")
            assert refused.value.code.value == "resource_exhausted" and not refused.value.retryable
            acme.deploy_policy(hook_policy(hanging.url, rules=4), environment="production")
            acme.deploy_policy(hook_policy(hanging.url), environment="production")
            decisions = [acme.evaluate("hooks1", "p", "a bad answer", timeout=30) for _ in range(6)]
            assert all(not d.passed for d in decisions)
            recorded = {r.decision_id for r in acme.list_decisions(policy="hooks1")}
            assert {d.decision_id for d in decisions} <= recorded  # every answered decision is audited
            assert len(acme.list_deliveries()) == 3  # the tenant's quota of pending webhooks
        deadline = time.monotonic() + WAIT_S
        text = ""
        while time.monotonic() < deadline and 'crossaudit_outbox_refused_total{kind="webhook"} 3.0' not in text:
            with urllib.request.urlopen(f"http://{srv.metrics_address}/metrics", timeout=10) as r:
                text = r.read().decode()
            time.sleep(0.2)
        assert 'crossaudit_outbox_refused_total{kind="webhook"} 3.0' in text
        log = srv.log.read_text()
        assert "delivery_limits.max_pending_per_tenant (3)" in log and "Traceback" not in log


async def test_replicas_claiming_in_turns_never_lease_a_row_twice(postgres_url: str) -> None:
    from crossaudit.store.postgres import PostgresStore

    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    try:
        t0 = time.time() - 100
        for i in range(40):
            tenant = ("acme", "globex", "initech")[i % 3]
            await a.record_decision(audit(f"d{i}", tenant), [], [message(f"d{i}", tenant, t0 + i)])
        now = time.time()
        got = await asyncio.gather(
            *(s.claim_outbox(["webhook"], now, limit=7, lease_s=60, per_tenant=20) for s in (a, b) * 4)
        )
        ids = [m.id for batch in got for m in batch]
        assert len(ids) == len(set(ids)) == 40  # every message leased exactly once
    finally:
        await a.aclose()
        await b.aclose()
