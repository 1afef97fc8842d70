"""Webhooks as an attacker uses them: other origins, the server's loopback and metadata addresses
(directly or through a name), redirects, the server's secrets, and another tenant's deliveries."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import NotFoundError, PolicyValidationError
from tests.e2e.conftest import ServerProcess
from tests.e2e.policies import returns, webhook_policy
from tests.webhook_receiver import Receiver, Reply, loopback_grant

pytestmark = [pytest.mark.security, pytest.mark.e2e, pytest.mark.slow]

ACME, INITECH, GLOBEX = "acme-key-0123456789abcdef", "initech-key-0123456789abcd", "globex-key-0123456789abcdef"
WAIT_S = 30.0


def hook_policy(url: str, name: str = "hook", headers: dict[str, str] | None = None, **kw: Any) -> str:
    """Sends a webhook to ``url`` on every answer."""
    return webhook_policy(
        name, url, code=returns('{"score": 0.0}'), evaluator="always_fails", rules=["call_out"],
        headers=headers or {}, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    a, b = Receiver(), Receiver()
    yield a, b
    a.close()
    b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receivers: tuple[Receiver, Receiver]) -> Iterator[ServerProcess]:
    a, b = receivers
    keys = f"""
tenants:
  acme:
    keys: [{ACME}]
    webhooks: {loopback_grant(a.url, b.url, signing_env="ACME_SIGNING")}
  initech:
    keys: [{INITECH}]
    webhooks:
      allow: ["http://localhost:{a.port}", "{a.url}"]
      signing_secret: {{env: ACME_SIGNING}}
  globex: [{GLOBEX}]
"""
    with ServerProcess(
        tmp_path_factory.mktemp("ssrf"),
        keys_text=keys,
        env={"ACME_SIGNING": "a-signing-secret-of-32-characters", "SERVER_ONLY_SECRET": "operator-only-value"},
    ) as srv:
        yield srv


def _dead(c: Client, timeout: float = WAIT_S) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = c.list_deliveries()
        if found and found[0].state.value == "dead":
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no dead delivery: {c.list_deliveries()}")


@pytest.mark.parametrize(
    ("tenant", "url", "message"),
    [
        (ACME, "https://attacker.example/collect", "not in this tenant's webhook allowlist"),
        (ACME, "http://127.0.0.1:1/", "not in this tenant's webhook allowlist"),  # another port of loopback
        (INITECH, "http://127.0.0.1:{port}/", "allow_networks"),  # allowlisted origin, loopback address
        (INITECH, "http://169.254.169.254/latest/meta-data/", "not in this tenant's webhook allowlist"),
        (GLOBEX, "http://127.0.0.1:{port}/", "not in this tenant's webhook allowlist"),  # no webhooks granted
    ],
)
def test_destinations_outside_the_grant_are_refused_at_deploy(
    server: ServerProcess, receivers: tuple[Receiver, Receiver], tenant: str, url: str, message: str
) -> None:
    with Client(server.address, api_key=tenant) as c, pytest.raises(PolicyValidationError, match=message):
        c.deploy_policy(hook_policy(url.format(port=receivers[0].port)))


def test_the_servers_environment_is_not_a_header_source(server: ServerProcess, receivers) -> None:
    policy = hook_policy(receivers[0].url + "/", headers={"X-Leak": "${SERVER_ONLY_SECRET}"})
    with Client(server.address, api_key=ACME) as c, pytest.raises(PolicyValidationError, match="SERVER_ONLY_SECRET"):
        c.deploy_policy(policy)


def test_a_name_that_resolves_to_loopback_is_refused_when_sending(server: ServerProcess, receivers) -> None:
    a, _ = receivers
    before = len(a.requests)
    with Client(server.address, api_key=INITECH) as c:
        c.deploy_policy(hook_policy(f"http://localhost:{a.port}/hook", name="via-name"))
        c.evaluate("via-name", "p", "r", timeout=20)
        dead = _dead(c)
    assert "resolves to" in dead.last_error and dead.attempts == 1  # type: ignore[attr-defined]
    time.sleep(0.5)
    assert len(a.requests) == before  # nothing reached loopback


def test_redirects_are_not_followed(server: ServerProcess, receivers) -> None:
    a, b = receivers
    a.script = [Reply(307, {"Location": f"{b.url}/stolen"})]
    before_b = len(b.requests)
    with Client(server.address, api_key=ACME) as c:
        c.deploy_policy(hook_policy(f"{a.url}/hook", name="redirected"))
        c.evaluate("redirected", "p", "r", timeout=20)
        dead = _dead(c)
    assert dead.last_status == 307 and "redirects are not followed" in dead.last_error  # type: ignore[attr-defined]
    time.sleep(0.5)
    assert len(b.requests) == before_b


def test_another_tenants_deliveries_are_invisible(server: ServerProcess) -> None:
    with Client(server.address, api_key=ACME) as c:
        theirs = c.list_deliveries()
    assert theirs
    with Client(server.address, api_key=GLOBEX) as c:
        assert c.list_deliveries() == []
        with pytest.raises(NotFoundError):
            c.redeliver(theirs[0].id)


def test_an_oversized_payload_is_refused_not_sent(tmp_path: Path, server: ServerProcess, receivers) -> None:
    a, _ = receivers
    # Template fields are short (names, hashes, times), so only the policy's own text can be big.
    big = hook_policy(a.url + "/", name="big", payload={"blob": "x" * 300_000})
    before = len(a.requests)
    with Client(server.address, api_key=ACME) as c:
        c.deploy_policy(big)
        c.evaluate("big", "p", "r", timeout=20)
        found = [m for m in c.list_deliveries() if m.rule == "call_out" and "larger than" in m.last_error]
    assert found and found[0].state.value == "dead"
    time.sleep(0.5)
    assert len(a.requests) == before
