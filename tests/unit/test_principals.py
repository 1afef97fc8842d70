"""Roles for API keys: the keys file's principal items, the permission table, reviewer roles."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from crossaudit.kernel.errors import ConfigurationError, PermissionDeniedError
from crossaudit.service.auth import Authenticator, load_tenants_file
from crossaudit.service.principals import (
    CONSOLE_ROLES,
    EVALUATE,
    GET_DECISION,
    LIST_REVIEWS,
    RESOLVE_REVIEW,
    Principal,
    Role,
    allowed,
    rpc,
)

ADMIN = "acme-admin-" + "a" * 16
APP = "acme-app-" + "b" * 16
ALICE = "acme-alice-" + "c" * 16
BOB = "acme-bob-" + "d" * 16
GLOBEX = "globex-" + "e" * 16

KEYS = f"""
tenants:
  acme:
    keys:
      - {ADMIN}
      - {{key: {APP}, role: service, name: checkout}}
      - {{key: {ALICE}, role: reviewer, name: alice, reviewer_roles: [content_moderator, legal]}}
      - {{key: {BOB}, role: reviewer, name: bob}}
  globex: [{GLOBEX}]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "keys.yaml"
    p.write_text(text)
    p.chmod(0o600)
    return p


def test_plain_keys_are_admins_and_mappings_carry_roles(tmp_path: Path) -> None:
    auth = Authenticator.from_file(write(tmp_path, KEYS))
    assert auth.principal_for_key(ADMIN) == Principal("acme", Role.ADMIN)
    assert auth.principal_for_key(APP) == Principal("acme", Role.SERVICE, "checkout")
    alice = auth.principal_for_key(ALICE)
    assert alice == Principal("acme", Role.REVIEWER, "alice", frozenset({"content_moderator", "legal"}))
    assert auth.principal_for_key(BOB).reviewer_roles == frozenset()
    assert auth.principal_for_key(GLOBEX) == Principal("globex", Role.ADMIN)
    assert auth.principal_for_metadata([("authorization", f"Bearer {ALICE}")]) == alice
    assert auth.tenant_for_key(APP) == "acme" and auth.tenants == ["acme", "globex"]
    # the keys of the file, as before roles existed
    assert load_tenants_file(write(tmp_path, KEYS)).keys["acme"] == [ADMIN, APP, ALICE, BOB]


def test_dev_mode_is_the_admin_of_default_named_after_the_local_user() -> None:
    """A --dev resolution records who ran the server, not "unknown" (issue 19)."""
    dev = Authenticator.dev_mode().principal_for_key(None)
    assert dev == Principal("default", Role.ADMIN, name=f"{getpass.getuser()} (dev)")
    assert dev.reviewer_identity("") == dev.reviewer_identity("someone-else") == dev.name


@pytest.mark.parametrize(
    ("item", "match"),
    [
        (f"{{key: {APP}}}", "needs 'role'"),
        ("{role: admin}", "needs 'key'"),
        (f"{{key: {APP}, role: root}}", "role must be one of admin, reviewer, service"),
        (f"{{key: {APP}, role: reviewer}}", "a reviewer key needs a name"),
        (f"{{key: {APP}, role: reviewer, name: 'has space'}}", "name must be"),
        (f"{{key: {APP}, role: service, reviewer_roles: [x]}}", "reviewer_roles belong to role reviewer"),
        (f"{{key: {APP}, role: reviewer, name: a, reviewer_roles: moderator}}", "must be a list"),
        (f"{{key: {APP}, role: reviewer, name: a, reviewer_roles: ['bad role']}}", "a reviewer role must be"),
        (f"{{key: {APP}, role: admin, scope: all}}", r"unknown field\(s\) \['scope'\]"),
        ("{key: short, role: admin}", "at least 16"),
        ("{key: [1, 2], role: admin}", "at least 16"),
    ],
)
def test_bad_key_items_are_configuration_errors_that_never_show_the_key(tmp_path: Path, item: str, match: str) -> None:
    text = f"tenants:\n  acme:\n    keys:\n      - {ADMIN}\n      - {item}\n"
    with pytest.raises(ConfigurationError, match=match) as info:
        load_tenants_file(write(tmp_path, text))
    assert "tenant 'acme' keys[1]" in info.value.message
    assert APP not in info.value.message and ADMIN not in info.value.message


def test_a_key_twice_with_different_roles_and_a_name_twice_are_refused(tmp_path: Path) -> None:
    twice = f"tenants:\n  acme:\n    keys: [{APP}, {{key: {APP}, role: service}}]\n"
    with pytest.raises(ConfigurationError, match="listed twice with different roles") as info:
        load_tenants_file(write(tmp_path, twice))
    assert APP not in info.value.message
    names = (
        f"tenants:\n  acme:\n    keys: [{{key: {APP}, role: reviewer, name: al}}, "
        f"{{key: {ALICE}, role: reviewer, name: al}}]\n"
    )
    with pytest.raises(ConfigurationError, match="name 'al' is used twice"):
        load_tenants_file(write(tmp_path, names))
    other = f"tenants:\n  acme: [{{key: {APP}, role: service}}]\n  globex: [{APP}]\n"
    with pytest.raises(ConfigurationError, match="one key is listed for tenants"):
        load_tenants_file(write(tmp_path, other))


def test_the_permission_table() -> None:
    everything = [rpc("PolicyService", "DeployPolicy"), rpc("DeliveryService", "RedeliverDelivery"), EVALUATE]
    assert all(allowed(Role.ADMIN, m) for m in everything)
    assert allowed(Role.SERVICE, EVALUATE) and not allowed(Role.SERVICE, rpc("PolicyService", "DeployPolicy"))
    assert not allowed(Role.SERVICE, LIST_REVIEWS) and not allowed(Role.SERVICE, GET_DECISION)
    assert not allowed(Role.SERVICE, rpc("EvaluatorService", "UploadEvaluator"))
    assert allowed(Role.REVIEWER, RESOLVE_REVIEW) and not allowed(Role.REVIEWER, EVALUATE)
    # a method nobody listed (a service added later) is admin-only
    future = rpc("WebhookService", "ListWebhooks")
    assert allowed(Role.ADMIN, future) and not allowed(Role.SERVICE, future) and not allowed(Role.REVIEWER, future)
    assert Role.SERVICE not in CONSOLE_ROLES and Role.REVIEWER in CONSOLE_ROLES


def test_reviewer_roles_decide_what_a_reviewer_may_resolve() -> None:
    alice = Principal("acme", Role.REVIEWER, "alice", frozenset({"content_moderator"}))
    bob = Principal("acme", Role.REVIEWER, "bob")
    app = Principal("acme", Role.SERVICE, "checkout")
    assert alice.may_resolve("content_moderator") and alice.may_resolve(None) and not alice.may_resolve("legal")
    assert bob.may_resolve(None) and not bob.may_resolve("content_moderator")
    assert Principal("acme").may_resolve("anything")
    assert not app.may_resolve(None)
    with pytest.raises(PermissionDeniedError, match=r"needs reviewer_role 'content_moderator'.*reviewer 'bob'"):
        bob.require_resolve("r1", "content_moderator")
    with pytest.raises(PermissionDeniedError, match=r"role 'service' may not call ReviewService\.ResolveReview"):
        app.require_resolve("r1", None)
    assert alice.reviewer_identity("someone else") == "alice"
    assert Principal("acme").reviewer_identity("ops") == "ops"
