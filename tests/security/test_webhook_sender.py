"""The webhook sender against what a tenant (or a careless grant) can put in a request: header
values the HTTP library refuses, and signing secrets that cannot sign.

The sender is the real one (httpx) and the receiver a real HTTP server on 127.0.0.1; the server
start is a real ``crossaudit serve`` process.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossaudit.api.records import OutboxRecord
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.outbox import signing
from crossaudit.outbox.attempts import Attempt
from crossaudit.outbox.destinations import WebhookGrant, origin_of
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.webhooks import WebhookSender, header_problem
from crossaudit.service.auth import load_tenants_file
from orchestrator.secrets import SecretGrant, TenantSecrets
from tests.e2e.conftest import ROOT
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.security

SIGNING = "a-signing-secret-of-32-characters"
BAD_WHSEC = "whsec_this!is*not~base64=="


def _send(receiver: Receiver, tmp_path: Path, token: str, signing_secret: str = SIGNING, **headers: str) -> Attempt:
    """One attempt of a webhook whose headers use ``${TOKEN}``, granted from a file holding ``token``."""
    (tmp_path / "token").write_text(token)
    (tmp_path / "signing").write_text(signing_secret)
    for f in ("token", "signing"):
        (tmp_path / f).chmod(0o600)
    secrets = TenantSecrets("acme", {"TOKEN": SecretGrant("TOKEN", file=tmp_path / "token")})
    grant = WebhookGrant(
        allow=(origin_of(receiver.url),),
        allow_networks=(ipaddress.ip_network("127.0.0.1/32"),),
        signing_secret=SecretGrant("signing_secret", file=tmp_path / "signing"),
    )
    payload = {"url": receiver.url + "/hook", "method": "POST", "headers": headers, "body": '{"a":1}'}
    msg = OutboxRecord(id="d-1", tenant="acme", kind="webhook", decision_id="x", rule="r", payload=payload)

    async def go() -> Attempt:
        sender = WebhookSender(lambda t: grant, lambda t: secrets, DeliveryLimits())
        try:
            return await sender.send(msg)
        finally:
            await sender.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("abc\r\nX-Injected: owned", "line break"),
        ("abc\ndef", "line break"),
        ("s3cr\x00t", "control character"),
        ("caf\u00e9-token", "outside ASCII"),
        ("\u202egnp.exe", "outside ASCII"),
        ("trailing-space ", "whitespace"),
    ],
    ids=["crlf", "lf", "nul", "latin1", "bidi", "trailing_space"],
)
def test_a_header_value_the_http_library_refuses_is_dead_at_once(
    receiver: Receiver, tmp_path: Path, token: str, reason: str
) -> None:
    """It was retried (12 attempts over hours) as if the receiver were down, and its error quoted
    the value, i.e. the granted secret."""
    attempt = _send(receiver, tmp_path, token, Authorization="Bearer ${TOKEN}")
    assert not attempt.delivered and attempt.permanent, attempt
    assert "authorization" in attempt.error.lower() and reason in attempt.error, attempt.error
    for piece in ("abc", "def", "s3cr", "caf", "gnp", "trailing-space", "owned"):
        assert piece not in attempt.error
    assert receiver.requests == []


def test_a_clean_header_still_goes_out(receiver: Receiver, tmp_path: Path) -> None:
    attempt = _send(receiver, tmp_path, "tok-123\twith-tab", Authorization="Bearer ${TOKEN}")
    assert attempt.delivered, attempt
    [got] = receiver.wait_for(1)
    assert got.headers["authorization"] == "Bearer tok-123\twith-tab"


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("X-Ok", "v", None),
        ("X-Ok", "", None),
        ("X Bad", "v", "not an HTTP token"),
        ("X-Bad:", "v", "not an HTTP token"),
        ("X-\u00e9", "v", "not an HTTP token"),
        ("X-A", "a\rb", "line break"),
        ("X-A", "a\x7fb", "control character"),
        ("X-A", " a", "whitespace"),
    ],
)
def test_header_problem(name: str, value: str, problem: str | None) -> None:
    got = header_problem(name, value)
    assert got is None if problem is None else (got is not None and problem in got), got


# -- signing secrets ----------------------------------------------------------------------------


def test_a_whsec_secret_that_is_not_base64_is_dead_at_send_not_a_crash(receiver: Receiver, tmp_path: Path) -> None:
    """A file secret is read at each attempt (rotation): one rotated into a bad whsec_ raised an
    untyped ValueError out of the sender, so the row stayed leased and came back forever."""
    attempt = _send(receiver, tmp_path, "tok", signing_secret=BAD_WHSEC, Authorization="Bearer ${TOKEN}")
    assert not attempt.delivered and attempt.permanent, attempt
    assert "signing_secret" in attempt.error and "base64" in attempt.error
    assert BAD_WHSEC not in attempt.error and "this!is" not in attempt.error
    assert receiver.requests == []


def _keys_file(tmp_path: Path, secret: str, how: str) -> Path:
    (tmp_path / "hook.secret").write_text(secret)
    (tmp_path / "hook.secret").chmod(0o600)
    source = "{file: hook.secret}" if how == "file" else "{env: HOOK_SIGNING_TEST}"
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "tenants:\n"
        "  acme:\n"
        "    keys: [acme-key-0123456789abcdef]\n"
        "    webhooks:\n"
        '      allow: ["https://hooks.acme.example"]\n'
        f"      signing_secret: {source}\n"
    )
    keys.chmod(0o600)
    return keys


@pytest.mark.parametrize("how", ["env", "file"])
@pytest.mark.parametrize(
    ("secret", "problem"),
    [(BAD_WHSEC, "not base64"), ("whsec_c2hvcnQ=", "shorter than 16 bytes"), ("tiny-secret", "shorter than 16 bytes")],
    ids=["not_base64", "whsec_short", "short"],
)
def test_an_unusable_signing_secret_is_a_configuration_error_when_the_keys_file_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, secret: str, problem: str
) -> None:
    monkeypatch.setenv("HOOK_SIGNING_TEST", secret)
    with pytest.raises(ConfigurationError) as info:
        load_tenants_file(_keys_file(tmp_path, secret, how))
    message = info.value.message
    assert "tenant 'acme'" in message and "webhooks.signing_secret" in message and problem in message, message
    assert secret not in message and secret.removeprefix("whsec_") not in message


def test_the_server_does_not_start_with_a_bad_whsec_secret(tmp_path: Path) -> None:
    """At start: one error: line naming the tenant and the setting, exit 1, no traceback."""
    keys = _keys_file(tmp_path, BAD_WHSEC, "env")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env["HOOK_SIGNING_TEST"] = BAD_WHSEC
    serve = [sys.executable, "-m", "crossaudit.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    res = subprocess.run(
        [*serve, "--api-keys", str(keys), "--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr[-2000:]
    assert "tenant 'acme'" in errors[0] and "webhooks.signing_secret" in errors[0] and "base64" in errors[0]
    assert "Traceback" not in res.stderr + res.stdout and BAD_WHSEC not in res.stderr + res.stdout


def test_good_secrets_still_sign() -> None:
    key = "whsec_" + base64.b64encode(b"k" * 24).decode()
    assert signing.secret_problem(key) is None and signing.secret_problem(SIGNING) is None
    assert signing.secret_problem(BAD_WHSEC) is not None
