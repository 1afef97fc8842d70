"""``context.content.hash`` is a digest the server computes, but a caller could pin it ("caller
supplied values win"): a ``custom`` action's payload template ``{{content.hash}}`` then rendered
the caller's text into the webhook's outbox row (at rest) and sent it, and ``audit erase
--decision`` left it (erasure scrubbed only the decision log's copies). A pinned
``content.hash`` must now be a SHA-256 in hex, and a pinned ``content.length`` an integer, else
INVALID_ARGUMENT: every value a webhook payload renders is the engine's own or a digest, never
request text (docs/webhooks.md). A real server on both stores."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import InvalidInputError
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.policies import webhook_policy
from tests.security.test_erased_error_text import at_rest
from tests.webhook_receiver import loopback_grant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
SUBJECT = "alice-zq9183@example.com"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def srv(tmp_path: Path, server_store_env: dict[str, str]) -> Iterator[tuple[ServerProcess, int]]:
    port = _free_port()  # nobody listens: the delivery stays in the outbox
    keys = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
    webhooks: {loopback_grant(f"http://127.0.0.1:{port}", signing_env="ACME_SIGNING_SECRET")}
"""
    env = {**server_store_env, "ACME_SIGNING_SECRET": "whsec_c2lnbmluZy1zZWNyZXQtZm9yLXRlc3Rz"}
    with ServerProcess(tmp_path / "server", keys_text=keys, env=env) as s:
        yield s, port


def _policy(port: int) -> str:
    return webhook_policy(
        "hooks",
        f"http://127.0.0.1:{port}/v",
        rules=["notify"],
        payload={"content_hash": "{{content.hash}}", "length": "{{content.length}}"},
    )


PINNED_TEXT = [
    {"hash": SUBJECT},
    {"hash": "ab" * 31 + "zq"},  # 64 characters, not hex
    {"hash": ["ab" * 32]},
    {"length": SUBJECT},
    {"length": True},
    {"length": -1},
]


def test_pinned_content_text_is_refused_and_never_at_rest(
    srv: tuple[ServerProcess, int], server_store_env: dict[str, str]
) -> None:
    s, port = srv
    with Client(s.address, api_key=ADMIN) as c:
        c.deploy_policy(_policy(port))
        for content in PINNED_TEXT:
            with pytest.raises(InvalidInputError, match=r"content\.(hash|length)"):  # INVALID_ARGUMENT
                c.evaluate("hooks", "p", "a bad answer", {"content": content}, timeout=60)
    assert b"alice-zq9183" not in at_rest(s, server_store_env)


def test_a_pinned_digest_is_rendered_as_a_digest_and_no_caller_text_stays_after_erasure(
    srv: tuple[ServerProcess, int], server_store_env: dict[str, str]
) -> None:
    """The attack as found: after ``audit erase --decision`` nothing of the caller's context is at rest."""
    s, port = srv
    pinned = "AB" * 32
    with Client(s.address, api_key=ADMIN) as c:
        c.deploy_policy(_policy(port))
        d = c.evaluate("hooks", "p", "a bad answer", {"content": {"hash": pinned}, "note": SUBJECT}, timeout=60)
    assert not d.passed
    assert pinned.lower().encode() in at_rest(s, server_store_env)  # the webhook's pending row, as a digest
    res = run_cli("audit", "erase", "--decision", d.decision_id, server=s, api_key=ADMIN)
    assert res.returncode == 0, res.stderr
    assert b"alice-zq9183" not in at_rest(s, server_store_env)
