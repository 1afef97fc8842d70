"""The outbox's parts without a network: signatures, retry timing, destinations, the store's leases."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

import pytest

from crossaudit.api.records import AuditRecord, OutboxRecord, OutboxState
from crossaudit.kernel.errors import ConfigurationError, DeliveryPendingError, InvalidInputError, NotFoundError
from crossaudit.outbox import signing
from crossaudit.outbox.attempts import Attempt, next_delay
from crossaudit.outbox.destinations import (
    DestinationRefused,
    WebhookGrant,
    origin_of,
    parse_webhooks,
    refused_address,
)
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.store import SQLiteStore
from orchestrator.secrets import SecretGrant
from tests.records import audit_record

SECRET = "a-signing-secret-of-some-length"


def _secret(source: object, where: str) -> SecretGrant:
    assert isinstance(source, dict)
    return SecretGrant("signing_secret", env=source.get("env"))


# --- signatures ------------------------------------------------------------------------------


def test_signature_verifies_and_rejects_tampering_replays_and_other_keys() -> None:
    body = b'{"violation_type":"r"}'
    h = signing.headers(SECRET, "msg-1", body, now=1_700_000_000)
    assert h["webhook-signature"].startswith("v1,")
    signing.verify(SECRET, h, body, now=1_700_000_010)
    with pytest.raises(signing.SignatureError, match="no signature matches"):
        signing.verify(SECRET, h, body + b" ", now=1_700_000_010)
    with pytest.raises(signing.SignatureError, match="no signature matches"):
        signing.verify("another-secret-entirely", h, body, now=1_700_000_010)
    with pytest.raises(signing.SignatureError, match="no signature matches"):  # the id is signed too
        signing.verify(SECRET, {**h, "webhook-id": "msg-2"}, body, now=1_700_000_010)
    with pytest.raises(signing.SignatureError, match="tolerance"):
        signing.verify(SECRET, h, body, now=1_700_000_000 + signing.DEFAULT_TOLERANCE_S + 1)


def test_whsec_secrets_follow_the_standard_webhooks_key_format() -> None:
    # The Standard Webhooks specification's own example (id, timestamp, body, key -> signature).
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    assert signing.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


# --- retry timing ----------------------------------------------------------------------------


def test_backoff_grows_is_jittered_capped_and_yields_to_retry_after() -> None:
    limits = DeliveryLimits(backoff_base_s=2.0, backoff_max_s=60.0, retry_after_max_s=100.0)
    for n, top in ((1, 2.0), (2, 4.0), (3, 8.0), (10, 60.0)):
        waits = [next_delay(n, limits) for _ in range(50)]
        assert all(top / 2 <= w <= top for w in waits)
        assert len(set(waits)) > 1  # jittered
    assert next_delay(3, limits, retry_after_s=7) == 7
    assert next_delay(3, limits, retry_after_s=10_000) == 100.0


@pytest.mark.parametrize(
    ("status", "delivered", "permanent"),
    [
        (200, True, False),
        (204, True, False),
        (302, False, True),
        (400, False, True),
        (404, False, True),
        (408, False, False),
        (429, False, False),
        (500, False, False),
        (503, False, False),
    ],
)
def test_which_answers_are_retried(status: int, delivered: bool, permanent: bool) -> None:
    a = Attempt.from_status(status, None)
    assert (a.delivered, a.permanent) == (delivered, permanent)


# --- destinations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "224.0.0.1",
        "2002:7f00:1::",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refused_address(ipaddress.ip_address(address))


def test_public_addresses_are_not() -> None:
    assert not refused_address(ipaddress.ip_address("93.184.216.34"))
    assert not refused_address(ipaddress.ip_address("2606:4700::1"))


def test_origins_normalise_scheme_host_and_default_port() -> None:
    assert origin_of("HTTPS://Hooks.Example.COM/path?q=1") == origin_of("https://hooks.example.com:443")
    assert str(origin_of("http://[::1]:8080/x")) == "http://[::1]:8080"
    for bad in ("ftp://x.example", "https://user:pw@x.example/", "https://", "not a url"):
        with pytest.raises(ValueError):
            origin_of(bad)


def test_the_allowlist_is_exact_and_private_addresses_need_their_network(monkeypatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    grant = parse_webhooks(
        {"allow": ["https://hooks.example.com", "http://127.0.0.1:9000"], "signing_secret": {"env": "HOOK_SECRET"}},
        "tenant acme",
        _secret,
    )
    assert grant.url_problem("https://hooks.example.com/a/b") is None
    assert "not in this tenant's webhook allowlist" in (grant.url_problem("https://hooks.example.com:8443/") or "")
    assert "not in this tenant's webhook allowlist" in (grant.url_problem("http://hooks.example.com/") or "")
    assert "not in this tenant's webhook allowlist" in (grant.url_problem("https://evil.example.com/") or "")
    assert "allow_networks" in (grant.url_problem("http://127.0.0.1:9000/") or "")
    opened = parse_webhooks(
        {"allow": ["http://127.0.0.1:9000"], "allow_networks": ["127.0.0.1/32"], "signing_secret": {"env": "X"}},
        "tenant acme",
        _secret,
    )
    assert opened.url_problem("http://127.0.0.1:9000/hook") is None


async def test_a_name_that_resolves_to_loopback_is_refused_at_send_time() -> None:
    grant = WebhookGrant(allow=(origin_of("http://localhost:9000"),), signing_secret=SecretGrant("s", env="X"))
    assert grant.url_problem("http://localhost:9000/") is None  # a name: judged by its addresses, at send time
    with pytest.raises(DestinationRefused, match="resolves to"):
        await grant.pin("http://localhost:9000/")


def test_no_signing_secret_no_webhooks() -> None:
    grant = parse_webhooks({"allow": ["https://hooks.example.com"]}, "tenant acme", _secret)
    assert "signing secret" in (grant.url_problem("https://hooks.example.com/") or "")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"allow": "https://x.example"}, "must be a list"),
        ({"allow": ["https://x.example/path"]}, "must be an origin"),
        ({"allow": ["gopher://x.example"]}, "scheme"),
        ({"allow_networks": ["10.0.0.1/8"]}, "host bits"),
        ({"surprise": 1}, "unknown field"),
        ([], "must be a mapping"),
    ],
)
def test_bad_webhook_grants_are_configuration_errors(entry: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_webhooks(entry, "tenant acme", _secret)


# --- the store's outbox ------------------------------------------------------------------------


def _audit(decision_id: str, tenant: str = "t1") -> AuditRecord:
    return audit_record(decision_id, tenant)


def _msg(decision_id: str, tenant: str = "t1", kind: str = "webhook", due: float = 0.0) -> OutboxRecord:
    return OutboxRecord(
        id=f"m-{decision_id}-{kind}",
        tenant=tenant,
        kind=kind,
        decision_id=decision_id,
        rule="r",
        payload={"url": "https://x.example/"},
        next_attempt_at=due,
        created_at=time.time(),
    )


@pytest.fixture
def store(any_store):  # both backends (tests/conftest.py)
    return any_store


async def test_messages_are_written_with_their_decision_or_not_at_all(store: SQLiteStore) -> None:
    with pytest.raises(InvalidInputError, match="must belong"):
        await store.record_decision(_audit("d1"), [], [_msg("other")])
    assert await store.count_decisions() == 0
    assert await store.list_outbox("t1") == []
    await store.record_decision(_audit("d1"), [], [_msg("d1")])
    assert [m.id for m in await store.list_outbox("t1")] == ["m-d1-webhook"]
    assert await store.list_outbox("t2") == []  # another tenant sees nothing


async def test_a_lease_hides_a_message_from_other_workers_and_fences_its_outcome(store: SQLiteStore) -> None:
    await store.record_decision(_audit("d1"), [], [_msg("d1")])
    now = time.time()
    [claimed] = await store.claim_outbox(["webhook"], now, limit=10, lease_s=60)
    assert await store.claim_outbox(["webhook"], now, limit=10, lease_s=60) == []  # leased
    assert await store.claim_outbox(["decision_log:file"], now + 100, limit=10, lease_s=60) == []  # other kind
    [again] = await store.claim_outbox(["webhook"], now + 61, limit=10, lease_s=60)  # the lease expired
    # The first worker lost its lease: its outcome is not written; the second one's is.
    assert not await store.settle_outbox(claimed, state=OutboxState.DELIVERED, now=now + 62)
    assert await store.settle_outbox(
        again,
        state=OutboxState.PENDING,
        next_attempt_at=now + 500,
        last_error="HTTP 503",
        last_status=503,
        now=now + 62,
    )
    [m] = await store.list_outbox("t1")
    assert (m.state, m.attempts, m.last_status, m.lease_until) == (OutboxState.PENDING, 1, 503, 0.0)
    assert await store.claim_outbox(["webhook"], now + 499, limit=10, lease_s=60) == []  # not due yet
    assert len(await store.claim_outbox(["webhook"], now + 500, limit=10, lease_s=60)) == 1


async def test_redelivery_only_of_finished_messages_of_the_callers_tenant(store: SQLiteStore) -> None:
    await store.record_decision(_audit("d1"), [], [_msg("d1"), _msg("d1", kind="decision_log:file")])
    with pytest.raises(DeliveryPendingError):
        await store.redeliver_outbox("t1", "m-d1-webhook", time.time())
    [claimed] = await store.claim_outbox(["webhook"], time.time(), limit=1, lease_s=60)
    await store.settle_outbox(claimed, state=OutboxState.DEAD, last_error="HTTP 400", now=time.time())
    with pytest.raises(NotFoundError):
        await store.redeliver_outbox("t2", "m-d1-webhook", time.time())
    with pytest.raises(NotFoundError):  # a decision-log message is not the tenant's to resend
        await store.redeliver_outbox("t1", "m-d1-decision_log:file", time.time(), kind="webhook")
    m = await store.redeliver_outbox("t1", "m-d1-webhook", time.time())
    assert (m.state, m.attempts) == (OutboxState.PENDING, 0)
    assert len(await store.claim_outbox(["webhook"], time.time() + 1, limit=1, lease_s=60)) == 1


async def test_a_restart_voids_the_previous_process_leases(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "db.sqlite")
    await s.record_decision(_audit("d1"), [], [_msg("d1")])
    assert len(await s.claim_outbox(["webhook"], time.time(), limit=1, lease_s=3600)) == 1
    await s.aclose()  # as if killed mid-attempt
    s = SQLiteStore(tmp_path / "db.sqlite")
    try:
        assert len(await s.claim_outbox(["webhook"], time.time(), limit=1, lease_s=3600)) == 1
    finally:
        await s.aclose()
