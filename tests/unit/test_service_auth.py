"""API keys file, tenants, bearer metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit.kernel.errors import ConfigurationError, UnauthenticatedError
from crossaudit.service.auth import Authenticator, bearer_key, load_api_keys

K1, K2 = "k1-" + "a" * 20, "k2-" + "b" * 20


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "keys.yaml"
    p.write_text(text)
    p.chmod(0o600)
    return p


def test_keys_map_to_tenants(tmp_path: Path) -> None:
    auth = Authenticator.from_file(write(tmp_path, f"tenants:\n  acme: [{K1}]\n  globex: {K2}\n"))
    assert auth.tenant_for_key(K1) == "acme" and auth.tenant_for_key(K2) == "globex"
    assert auth.tenants == ["acme", "globex"]
    with pytest.raises(UnauthenticatedError, match="missing"):
        auth.tenant_for_key(None)
    with pytest.raises(UnauthenticatedError, match="invalid"):
        auth.tenant_for_key(K1 + "x")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("tenants: []\n", "must be a mapping"),
        ("nope: 1\n", "must be a mapping"),
        ("tenants:\n  acme: [short]\n", "at least 16"),
        (f"tenants:\n  acme: [{K1}]\n  other: [{K1}]\n", "one key is listed"),
        (f"tenants:\n  'bad name': [{K1}]\n", "invalid tenant name"),
        ("tenants: {a: [\n", "not valid YAML"),
    ],
)
def test_bad_key_files_are_configuration_errors(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        load_api_keys(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not found"):
        load_api_keys(tmp_path / "absent.yaml")


def test_bearer_metadata_parsing() -> None:
    assert bearer_key([("authorization", f"Bearer {K1}")]) == K1
    assert bearer_key([("Authorization", f"bearer  {K1} ")]) == K1
    assert bearer_key([("authorization", f"Basic {K1}")]) is None
    assert bearer_key([("x-other", "1")]) is None
    assert bearer_key(None) is None


def test_dev_mode_is_one_default_tenant() -> None:
    auth = Authenticator.dev_mode()
    assert auth.tenant_for_key(None) == "default" and auth.tenants == ["default"]
