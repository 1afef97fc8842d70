"""Tenants and API keys: ``authorization: Bearer <key>`` metadata → tenant.

Keys come from a YAML file (``--api-keys FILE`` / ``CROSSAUDIT_API_KEYS_FILE``)::

    tenants:
      acme: [key-one-at-least-16-chars, ...]
      globex: [...]

or, with what the operator grants a tenant besides its keys (``crossaudit.service.grants``)::

    llm_base_url_hosts: [llm.internal.example]
    tenants:
      acme:
        keys: [key-one-at-least-16-chars]
        secrets: {OPENAI_API_KEY: {env: ACME_OPENAI_KEY}, HOOK_TOKEN: {file: /run/secrets/acme_hook}}

A ``keys:`` item is a plain string (role ``admin``: every method, as before roles existed) or
a mapping naming a principal with a role (``crossaudit.service.principals``)::

    tenants:
      acme:
        keys:
          - acme-admin-key-at-least-16-chars                  # admin
          - {key: acme-app-key-at-least-16-chars, role: service, name: checkout-app}
          - {key: alice-key-at-least-16-chars, role: reviewer, name: alice,
             reviewer_roles: [content_moderator, compliance_officer]}

``role`` is required in the mapping form (admin, reviewer or service); ``name`` (1-64 of
letters, digits, ``_ . @ + -``, unique within the tenant) is required for a reviewer and is
who a resolution records; ``reviewer_roles`` is a reviewer's only. Every problem is a
ConfigurationError naming the tenant and the item's position, never the key.

``--dev`` runs without keys: every call is the admin of the ``default`` tenant (loopback only),
named after the OS user running the server (:func:`dev_user`).
Keys are kept as SHA-256 digests; health checking and reflection need no key.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from crossaudit.api.errors import abort
from crossaudit.kernel.configfile import check_private_file
from crossaudit.kernel.errors import ConfigurationError, CrossAuditError, UnauthenticatedError
from crossaudit.kernel.errors import PermissionDeniedError as PermissionDeniedError
from crossaudit.kernel.files import read_capped_text
from crossaudit.service.config import DEV_TENANT, ServiceLimits
from crossaudit.service.grants import (
    LLM_HOSTS_KEY,
    TenantGrants,
    parse_hosts,
    parse_retention,
    parse_share,
    parse_tenant_entry,
)
from crossaudit.service.principals import (
    PRINCIPAL_NAME,
    Principal,
    Role,
    parse_reviewer_roles,
    parse_role,
)

log = logging.getLogger("crossaudit.service")
AUTH_HEADER = "authorization"
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Methods anyone may call: load balancers' health checks, and schema discovery.
KEY_ENTRY_FIELDS = frozenset({"key", "role", "name", "reviewer_roles"})  # a mapping item of ``keys:``
PUBLIC_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def dev_user() -> str:
    """Who acts on a ``--dev`` server: the OS user running it, marked ``(dev)`` (``alice (dev)``).

    A keyless server on loopback is one person's, so a review resolved through the console,
    ``crossaudit review resolve`` or ``Client.resolve_review`` records them rather than nobody
    ("approved by unknown"); the mark tells such a name from a keys file's principals."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no USER/LOGNAME and no passwd entry (a bare container)
        user = f"uid {os.getuid()}"
    # printable only: it is shown in pages and logs (the store's max_name_length caps its length)
    user = "".join(ch for ch in user if ch.isprintable()).strip() or f"uid {os.getuid()}"
    return f"{user} (dev)"


# What a refused caller reads (the CLI prints it as is): what to do, for the CLI, the SDK (both
# read CROSSAUDIT_API_KEY) and other gRPC clients. The same for every caller, so it says nothing
# about which keys exist.
MISSING_KEY = (
    "missing API key: this server needs one (pass --api-key or set CROSSAUDIT_API_KEY; "
    "other gRPC clients send metadata 'authorization: Bearer <key>')"
)
INVALID_KEY = (
    "invalid API key: this server has no such key (pass one of its keys with --api-key or "
    "CROSSAUDIT_API_KEY; the server's --api-keys file lists them)"
)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Authenticator:
    """Maps API keys to principals (tenant and role). ``Authenticator.dev_mode()`` accepts every
    call as the admin of ``default``.

    ``principals`` (key → :class:`Principal`, from the keys file's mapping items) gives a key its
    role; a key without one is its tenant's admin. ``grants`` (from the same file) are what each
    tenant may use besides its keys; by default nothing (no secrets, only the LLM providers'
    default endpoints), or in dev mode the local environment.
    """

    def __init__(
        self,
        tenants: Mapping[str, list[str]] | None,
        *,
        dev: bool = False,
        grants: TenantGrants | None = None,
        principals: Mapping[str, Principal] | None = None,
    ) -> None:
        self.dev = dev
        self.grants = grants if grants is not None else (TenantGrants.dev() if dev else TenantGrants())
        self._by_digest: dict[bytes, Principal] = {}
        for tenant, keys in (tenants or {}).items():
            for key in keys:
                principal = (principals or {}).get(key) or Principal(tenant, Role.ADMIN)
                if principal.tenant != tenant:
                    raise ConfigurationError(f"a key of tenant {tenant!r} names a principal of another tenant")
                self._by_digest[_digest(key)] = principal
        self.tenants = sorted({DEV_TENANT} if dev else set((tenants or {}).keys()))
        self._dev_principal = Principal(DEV_TENANT, Role.ADMIN, name=dev_user() if dev else "")

    @classmethod
    def dev_mode(cls, retention_s: float = 0.0) -> Authenticator:
        """``--dev``; ``retention_s`` > 0 (``--retain-inputs``): the dev tenant's inputs are retained
        that long, as a tenant's ``retention: {inputs: ...}`` in an API-keys file says."""
        return cls(None, dev=True, grants=TenantGrants.dev({DEV_TENANT: retention_s} if retention_s > 0 else None))

    @classmethod
    def from_file(cls, path: str | Path, limits: ServiceLimits | None = None) -> Authenticator:
        tenants = load_tenants_file(path, limits)
        return cls(tenants.keys, grants=tenants.grants, principals=tenants.principals)

    def principal_for_key(self, key: str | None) -> Principal:
        if self.dev:
            return self._dev_principal
        if not key:
            raise UnauthenticatedError(MISSING_KEY)
        # looked up by SHA-256 digest: timing reveals nothing usable about stored keys
        principal = self._by_digest.get(_digest(key))
        if principal is None:
            raise UnauthenticatedError(INVALID_KEY)
        return principal

    def tenant_for_key(self, key: str | None) -> str:
        return self.principal_for_key(key).tenant

    def authorize_metadata(self, method: str, metadata: Any) -> None:
        """Admit a call of ``method`` (full name) or raise UnauthenticatedError / PermissionDeniedError:
        public methods (health, reflection) need no key; others a key whose role lists the method
        (``crossaudit.service.principals.PERMISSIONS``)."""
        if self.dev or method.startswith(PUBLIC_METHOD_PREFIXES):
            return
        self.principal_for_metadata(metadata).require(method)

    def authorize(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.authorize_metadata(method, context.invocation_metadata())

    def principal_for_metadata(self, metadata: Any) -> Principal:
        return self.principal_for_key(bearer_key(metadata))

    def tenant_for_metadata(self, metadata: Any) -> str:
        return self.principal_for_metadata(metadata).tenant

    def principal(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller; raises UnauthenticatedError (defence in depth behind the interceptor)."""
        return self.principal_for_metadata(context.invocation_metadata())

    def tenant(self, context: grpc.aio.ServicerContext) -> str:
        """The calling tenant; raises UnauthenticatedError (defence in depth behind the interceptor)."""
        return self.principal(context).tenant


def bearer_key(metadata: Any) -> str | None:
    for item in metadata or ():
        k, v = (item.key, item.value) if hasattr(item, "key") else item
        if k.lower() == AUTH_HEADER:
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            scheme, _, key = v.strip().partition(" ")
            if scheme.lower() != "bearer":
                return None
            return key.strip() or None
    return None


@dataclass(frozen=True)
class TenantsFile:
    keys: dict[str, list[str]]
    grants: TenantGrants
    principals: dict[str, Principal] = field(default_factory=dict)  # key → principal (every key)


def load_api_keys(path: str | Path, limits: ServiceLimits | None = None) -> dict[str, list[str]]:
    """The tenants' keys of the API-keys file (see :func:`load_tenants_file`)."""
    return load_tenants_file(path, limits).keys


def load_tenants_file(path: str | Path, limits: ServiceLimits | None = None) -> TenantsFile:
    """Read and validate the tenants file (keys and grants); every problem is a
    ConfigurationError naming it, never a key's or a secret's value."""
    limits = limits or ServiceLimits()
    p = Path(path)
    try:
        check_private_file(p, "API keys file")
        text = read_capped_text(p, limits.max_api_keys_file_bytes, "API keys file", ConfigurationError)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigurationError(f"API keys file {p} is not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tenants"), dict) or not doc["tenants"]:
        raise ConfigurationError(f"API keys file {p} must be a mapping 'tenants: {{name: [key, ...]}}'")
    unknown = sorted(str(k) for k in set(doc) - {"tenants", LLM_HOSTS_KEY})
    if unknown:
        raise ConfigurationError(f"API keys file {p}: unknown field(s) {unknown} (expected tenants, {LLM_HOSTS_KEY})")
    seen: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    principals: dict[str, Principal] = {}
    secrets: dict[str, Any] = {}
    tenant_hosts: dict[str, tuple[str, ...]] = {}
    webhooks: dict[str, Any] = {}
    shares: dict[str, float] = {}
    retention: dict[str, float] = {}
    for tenant, entry in doc["tenants"].items():
        if not isinstance(tenant, str) or not TENANT_NAME.match(tenant):
            raise ConfigurationError(f"API keys file {p}: invalid tenant name {tenant!r}")
        keys, secrets[tenant], tenant_hosts[tenant], webhooks[tenant] = parse_tenant_entry(
            entry, f"API keys file {p}: tenant {tenant!r}", p.parent
        )
        shares[tenant] = parse_share(entry, f"API keys file {p}: tenant {tenant!r}")
        retention[tenant] = parse_retention(entry, f"API keys file {p}: tenant {tenant!r}")
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, list) or not keys:
            raise ConfigurationError(f"API keys file {p}: tenant {tenant!r} needs a list of keys")
        names: set[str] = set()
        tenant_keys: list[str] = []
        for n, item in enumerate(keys):
            key, principal = _key_entry(item, tenant, f"API keys file {p}: tenant {tenant!r} keys[{n}]", limits)
            if key in seen and seen[key] != tenant:
                raise ConfigurationError(
                    f"API keys file {p}: one key is listed for tenants {seen[key]!r} and {tenant!r}"
                )
            if key in principals and principals[key] != principal:
                raise ConfigurationError(
                    f"API keys file {p}: tenant {tenant!r} keys[{n}]: a key is listed twice with different roles"
                )
            if principal.name and key not in principals:
                if principal.name in names:
                    raise ConfigurationError(
                        f"API keys file {p}: tenant {tenant!r} keys[{n}]: name {principal.name!r} is used twice"
                    )
                names.add(principal.name)
            seen[key] = tenant
            principals[key] = principal
            tenant_keys.append(key)
        out[tenant] = tenant_keys
    grants = TenantGrants(
        secrets=secrets,
        llm_hosts=parse_hosts(doc.get(LLM_HOSTS_KEY), f"API keys file {p}"),
        tenant_llm_hosts=tenant_hosts,
        webhooks=webhooks,
        shares=shares,
        retention={t: s for t, s in retention.items() if s > 0},
    )
    return TenantsFile(out, grants, principals)


def _key_entry(item: Any, tenant: str, where: str, limits: ServiceLimits) -> tuple[str, Principal]:
    """One ``keys:`` item: a plain key (an admin) or ``{key, role, name, reviewer_roles}``.
    Messages name ``where`` (tenant and position), never the key."""
    if isinstance(item, dict):
        unknown = sorted(str(k) for k in set(item) - KEY_ENTRY_FIELDS)
        if unknown:
            raise ConfigurationError(f"{where}: unknown field(s) {unknown} (expected {sorted(KEY_ENTRY_FIELDS)})")
        if "key" not in item:
            raise ConfigurationError(f"{where}: a key mapping needs 'key'")
        if "role" not in item:
            raise ConfigurationError(f"{where}: a key mapping needs 'role' (admin, reviewer or service)")
        key = item["key"]
        role = parse_role(item["role"], where)
        name = item.get("name")
        if name is not None and (not isinstance(name, str) or not PRINCIPAL_NAME.match(name)):
            raise ConfigurationError(f"{where}: name must be 1-64 letters, digits, '_', '.', '@', '+' or '-'")
        if role is Role.REVIEWER and not name:
            raise ConfigurationError(f"{where}: a reviewer key needs a name (it is recorded on each resolution)")
        if item.get("reviewer_roles") is not None and role is not Role.REVIEWER:
            raise ConfigurationError(f"{where}: reviewer_roles belong to role reviewer only (an admin resolves any)")
        reviewer_roles = parse_reviewer_roles(item.get("reviewer_roles"), where)
        principal = Principal(tenant, role, name or "", reviewer_roles)
    else:
        key, principal = item, Principal(tenant, Role.ADMIN)
    if not isinstance(key, str) or len(key) < limits.min_api_key_length or any(c.isspace() for c in key):
        raise ConfigurationError(
            f"{where}: a key must be a string of at least {limits.min_api_key_length} non-blank characters"
        )
    return key, principal


class UnknownMethodGate(grpc.GenericRpcHandler):
    """Consulted only for methods no service registered: a caller without a valid key learns
    nothing about which methods exist (UNAUTHENTICATED, not UNIMPLEMENTED). Registered methods
    are authorized by their handler wrappers (:class:`crossaudit.service.decoding.DecodingGuard`)."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method or ""
        try:
            self.auth.authorize_metadata(method, handler_call_details.invocation_metadata)
        except (UnauthenticatedError, PermissionDeniedError) as exc:
            return _rejecting(None, exc)
        return None  # other generic handlers (health, reflection), then UNIMPLEMENTED


def _rejecting(handler: grpc.RpcMethodHandler | None, exc: CrossAuditError) -> grpc.RpcMethodHandler:
    async def reject(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await abort(context, exc)  # the one codec: the client rebuilds the typed error

    if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED... after auth
        return grpc.unary_unary_rpc_method_handler(reject)
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject, **kwargs)
    return grpc.unary_unary_rpc_method_handler(reject, **kwargs)
