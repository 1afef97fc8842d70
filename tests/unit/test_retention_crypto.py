"""Retained inputs' cryptography (crossaudit/governance/vault.py) and the rule of how long inputs are
retained (crossaudit/governance/retention.py, docs/retention.md): typed errors, never garbage."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from crossaudit.governance.retention import effective_seconds, load_operator_keys
from crossaudit.governance.vault import NONCE_BYTES, OperatorKey, OperatorKeys, TenantKey, index_value, new_data_key
from crossaudit.kernel.dsl import retention_seconds
from crossaudit.kernel.errors import (
    ConfigurationError,
    ErrorCode,
    PolicyValidationError,
    RetainedInputsTamperedError,
    RetentionKeyError,
)
from crossaudit.service.auth import load_tenants_file
from crossaudit.service.config import RetentionConfig
from orchestrator.policy import load_policy as load_policy_text

DAY = 86_400.0


def operator_key() -> OperatorKey:
    return OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "test key")


def tenant_key(tenant: str = "acme") -> TenantKey:
    key_id, key = new_data_key()
    return TenantKey.of(tenant, key_id, key)


def test_a_data_key_is_stored_only_wrapped_and_unwraps_for_its_tenant_only() -> None:
    keys = OperatorKeys(operator_key())
    _, data = new_data_key()
    op_id, wrapped = keys.wrap("acme", data)
    assert op_id == keys.current.id and data not in wrapped and len(wrapped) == NONCE_BYTES + 32 + 16
    assert keys.unwrap("acme", op_id, wrapped) == data
    with pytest.raises(RetainedInputsTamperedError, match="globex"):  # copied to another tenant's row
        keys.unwrap("globex", op_id, wrapped)
    flipped = wrapped[:-1] + bytes([wrapped[-1] ^ 1])
    with pytest.raises(RetainedInputsTamperedError):
        keys.unwrap("acme", op_id, flipped)


def test_a_wrong_operator_key_is_named_by_id_not_reported_as_tampering() -> None:
    old, new = operator_key(), operator_key()
    op_id, wrapped = OperatorKeys(old).wrap("acme", new_data_key()[1])
    with pytest.raises(RetentionKeyError) as e:
        OperatorKeys(new).unwrap("acme", op_id, wrapped)
    assert old.id in e.value.message and new.id in e.value.message and e.value.code is ErrorCode.FAILED_PRECONDITION
    assert base64.b64encode(old.key).decode() not in e.value.message
    # during a rotation the previous key still unwraps, and wrap uses the current one
    rotating = OperatorKeys(new, previous=old)
    assert len(rotating.unwrap("acme", op_id, wrapped)) == 32
    assert rotating.wrap("acme", b"k" * 32)[0] == new.id


def test_a_row_decrypts_only_for_its_tenant_and_decision_and_tampering_is_typed() -> None:
    key = tenant_key("acme")
    nonce, ct = key.seal("d-1", b'{"prompt":"MARKER"}')
    assert len(nonce) == NONCE_BYTES and b"MARKER" not in ct
    assert key.open("d-1", nonce, ct) == b'{"prompt":"MARKER"}'
    with pytest.raises(RetainedInputsTamperedError, match="d-2"):  # copied to another decision
        key.open("d-2", nonce, ct)
    other = TenantKey.of("globex", key.id, key.key)  # even with the same key bytes, another tenant's AAD
    with pytest.raises(RetainedInputsTamperedError):
        other.open("d-1", nonce, ct)
    for bad in (ct[:-1] + bytes([ct[-1] ^ 1]), ct[:5], b""):
        with pytest.raises(RetainedInputsTamperedError) as e:
            key.open("d-1", nonce, bad)
        assert "MARKER" not in e.value.message
    with pytest.raises(RetainedInputsTamperedError):
        key.open("d-1", os.urandom(NONCE_BYTES), ct)


def test_every_row_has_a_fresh_nonce() -> None:
    key = tenant_key()
    nonces = {key.seal("d", b"same")[0] for _ in range(200)}
    assert len(nonces) == 200


def test_the_blind_index_is_keyed_per_tenant_and_matches_text_and_numbers_alike() -> None:
    a, b = tenant_key("acme"), tenant_key("acme")
    assert a.blind("user_id", "u-1") == a.blind("user_id", "u-1") != b.blind("user_id", "u-1")
    assert a.blind("user_id", "u-1") != a.blind("account", "u-1")  # the name is part of it
    assert a.blind("n", 42) == a.blind("n", "42") == a.blind("n", 42.0)  # a Struct's number is a double
    assert a.blind("flag", True) == a.blind("flag", "true")
    assert index_value("x") == "x" and index_value(1.5) == "1.5"
    # no prefix ambiguity between name and value
    assert a.blind("ab", "c") != a.blind("a", "bc")


def test_the_blind_index_matches_any_unicode_spelling_of_a_value() -> None:
    """A data subject's id typed on another keyboard (NFD) finds the one the request carried (NFC)."""
    a = tenant_key("acme")
    assert a.blind("user_id", "Jos\u00e9") == a.blind("user_id", "Jose\u0301")
    assert a.blind("na\u0308me", "x") == a.blind("n\u00e4me", "x")


@pytest.mark.parametrize(
    ("text", "problem"),
    [("not base64!", "not base64"), (base64.b64encode(b"short").decode(), "5 bytes"), ("", "0 bytes")],
)
def test_a_malformed_operator_key_is_a_configuration_error_that_never_echoes_it(text: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem) as e:
        OperatorKey.parse(text, "retention operator key")
    assert not text or text not in e.value.message


def test_operator_keys_from_a_private_file_or_a_variable(tmp_path: Path) -> None:
    text = base64.b64encode(os.urandom(32)).decode()
    f = tmp_path / "op.key"
    f.write_text(text + "\n")
    f.chmod(0o644)
    with pytest.raises(ConfigurationError, match=r"op\.key"):  # readable by others: refused
        load_operator_keys(RetentionConfig(operator_key_file=f))
    f.chmod(0o600)
    from_file = load_operator_keys(RetentionConfig(operator_key_file=f))
    from_env = load_operator_keys(RetentionConfig(operator_key_env="OP_KEY"), {"OP_KEY": text})
    assert from_file is not None and from_env is not None and from_file.current.id == from_env.current.id
    assert load_operator_keys(RetentionConfig()) is None
    with pytest.raises(ConfigurationError, match="not both"):
        load_operator_keys(RetentionConfig(operator_key_file=f, operator_key_env="OP_KEY"), {"OP_KEY": text})
    with pytest.raises(ConfigurationError, match="OP_KEY is not set"):
        load_operator_keys(RetentionConfig(operator_key_env="OP_KEY"), {})
    with pytest.raises(RetentionKeyError, match="previous"):
        load_operator_keys(RetentionConfig(previous_operator_key_env="OP_KEY"), {"OP_KEY": text})


@pytest.mark.parametrize(
    ("tenant", "policy", "server", "keyed", "expected"),
    [
        (7 * DAY, None, 30 * DAY, True, 7 * DAY),  # the tenant's default
        (7 * DAY, 12 * 3600.0, 30 * DAY, True, 12 * 3600.0),  # a policy shortens it
        (7 * DAY, 30 * DAY, 30 * DAY, True, 7 * DAY),  # ... never lengthens it
        (7 * DAY, 0.0, 30 * DAY, True, 0.0),  # ... or turns it off
        (None, 7 * DAY, 30 * DAY, True, 0.0),  # no tenant setting: nothing, whatever the policy says
        (0.0, 7 * DAY, 30 * DAY, True, 0.0),
        (60 * DAY, None, 30 * DAY, True, 30 * DAY),  # the server's maximum caps it
        (7 * DAY, None, 30 * DAY, False, 0.0),  # no operator key: nothing
    ],
)
def test_effective_retention(tenant, policy, server, keyed, expected) -> None:
    assert effective_seconds(tenant, policy, server, keyed) == expected


def test_retention_durations() -> None:
    assert retention_seconds("7d") == 7 * DAY and retention_seconds(" 12h ") == 12 * 3600
    assert retention_seconds("off") == retention_seconds("0") == retention_seconds(0) == 0.0
    assert retention_seconds(None) is None
    for bad in ("7 days", "-1d", True, [1], "9999d"):
        with pytest.raises(ValueError):
            retention_seconds(bad)


POLICY = """
name: p
description: d
version: "1.0"
settings:
  retention:
    inputs: {value}
"""


def test_the_dsl_takes_a_retention_duration_and_locates_a_bad_one() -> None:
    assert load_policy_text(POLICY.format(value="12h")).settings.retention.inputs_seconds() == 12 * 3600
    assert load_policy_text(POLICY.format(value="0")).settings.retention.inputs_seconds() == 0.0
    assert load_policy_text(POLICY.format(value="off")).settings.retention.inputs_seconds() == 0.0
    assert (
        load_policy_text(POLICY.replace("  retention:\n    inputs: {value}\n", "  timeout: 5\n")).settings.retention
        is None
    )
    with pytest.raises(PolicyValidationError) as e:
        load_policy_text(POLICY.format(value="a week"), "p.yaml")
    [issue] = e.value.issues
    assert issue.path == "settings.retention.inputs" and issue.line == 7, issue


def test_the_keys_file_takes_a_tenants_retention(tmp_path: Path) -> None:
    f = tmp_path / "keys.yaml"
    f.write_text(
        "tenants:\n"
        "  acme: {keys: [acme-key-0123456789abcdef], retention: {inputs: 7d}}\n"
        "  globex: [globex-key-0123456789abcdef]\n"
        "  initech: {keys: [initech-key-0123456789abcd], retention: {inputs: off}}\n"
    )
    f.chmod(0o600)
    assert load_tenants_file(f).grants.retention == {"acme": 7 * DAY}
    f.write_text("tenants:\n  acme: {keys: [acme-key-0123456789abcdef], retention: {inputs: forever}}\n")
    with pytest.raises(ConfigurationError, match=r"tenant 'acme': retention.inputs"):
        load_tenants_file(f)
    f.write_text("tenants:\n  acme: {keys: [acme-key-0123456789abcdef], retention: 7d}\n")
    with pytest.raises(ConfigurationError, match=r"retention must be \{inputs: DURATION\}"):
        load_tenants_file(f)
