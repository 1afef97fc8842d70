"""What the operator grants each tenant besides its keys: secrets, LLM endpoint hosts, webhooks.

Both live in the API-keys file, next to each tenant's keys::

    llm_base_url_hosts: ["llm.internal.example", "*.openai.azure.com"]   # every tenant
    tenants:
      acme:
        keys: [acme-key-at-least-16-chars]
        secrets:
          OPENAI_API_KEY: {env: ACME_OPENAI_KEY}           # a variable of the server's environment
          HOOK_TOKEN: {file: /run/secrets/acme_hook}       # read at each call (rotation applies at once)
        llm_base_url_hosts: ["vllm.acme.internal:8000"]   # this tenant only
        webhooks: {allow: ["https://hooks.acme.example"], signing_secret: {env: ACME_HOOK_SIGNING}}
        share: 2                                           # its weight in fair admission (default 1)
        retention: {inputs: 7d}                            # retained inputs' ceiling (docs/retention.md)
      globex: [globex-key-at-least-16-chars]               # the short form: keys only

A tenant's ``${NAME}`` (and an LLM provider's standard variable such as ``OPENAI_API_KEY``)
resolves only through its own ``secrets``; nothing else of the server's environment is
reachable. With API keys, an LLM ``base_url`` must name a listed host (top-level, this
tenant's, or ``--llm-base-url-host``); with no list only the providers' default endpoints
are used. ``--dev`` (one local user) reads the local environment and allows any endpoint
unless hosts are listed. Webhook grants: :mod:`crossaudit.outbox.destinations`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from crossaudit.kernel.dsl import retention_seconds
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.outbox.destinations import WEBHOOKS_KEY, WebhookGrant, parse_webhooks
from orchestrator.secrets import (
    MAX_SECRET_BYTES,
    SECRET_NAME,
    EnvironmentSecrets,
    HostAllowlist,
    SecretGrant,
    SecretSource,
    TenantSecrets,
    host_pattern_problem,
)

LLM_HOSTS_KEY = "llm_base_url_hosts"
SHARE_KEY = "share"
RETENTION_KEY = "retention"
MAX_SHARE = 1_000.0  # a tenant's share is a weight in (0, MAX_SHARE]: see crossaudit.service.fairness
TENANT_ENTRY_KEYS = frozenset({"keys", "secrets", LLM_HOSTS_KEY, WEBHOOKS_KEY, SHARE_KEY, RETENTION_KEY})
MAX_SECRETS_PER_TENANT = 256  # secrets one tenant may be granted
MAX_LLM_HOSTS = 1_000  # host patterns in one list


@dataclass(frozen=True)
class TenantGrants:
    secrets: Mapping[str, Mapping[str, SecretGrant]] = field(default_factory=dict)
    llm_hosts: tuple[str, ...] = ()  # for every tenant
    tenant_llm_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    development: bool = False  # --dev: the local environment; any endpoint unless hosts are listed
    max_secret_bytes: int = MAX_SECRET_BYTES
    webhooks: Mapping[str, WebhookGrant] = field(default_factory=dict)  # where each tenant's webhooks may go
    shares: Mapping[str, float] = field(default_factory=dict)  # weights in fair admission; unlisted = 1
    # seconds each tenant's inputs may be retained (its ceiling and default); unlisted = never
    retention: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def dev(cls, retention: Mapping[str, float] | None = None) -> TenantGrants:
        """``--dev``'s grants: the local environment, and ``retention`` (``--retain-inputs``) if given."""
        return cls(development=True, retention=dict(retention or {}))

    def source(self, tenant: str) -> SecretSource:
        """Where ``tenant``'s ``${NAME}`` references resolve (values are read at call time)."""
        if self.development:
            return EnvironmentSecrets()
        return TenantSecrets(tenant, self.secrets.get(tenant, {}), max_bytes=self.max_secret_bytes)

    def webhook(self, tenant: str) -> WebhookGrant:
        """Where ``tenant``'s webhooks may go and how they are signed (``crossaudit.outbox``)."""
        if self.development:
            return WebhookGrant(development=True)
        return self.webhooks.get(tenant) or WebhookGrant()

    def hosts(self, tenant: str) -> HostAllowlist | None:
        """The hosts ``tenant``'s LLM endpoints may name; None = unrestricted (dev, none listed)."""
        patterns = (*self.llm_hosts, *self.tenant_llm_hosts.get(tenant, ()))
        if self.development and not patterns:
            return None
        return HostAllowlist(patterns)

    def with_hosts(self, hosts: Iterable[str]) -> TenantGrants:
        """Add hosts for every tenant (``--llm-base-url-host``)."""
        extra = tuple(hosts)
        for h in extra:
            problem = host_pattern_problem(h)
            if problem:
                raise ConfigurationError(f"--llm-base-url-host: {problem}")
        return replace(self, llm_hosts=(*self.llm_hosts, *extra)) if extra else self

    def describe(self, tenant: str) -> str:
        """Names and sources only, for the operator's start-up log."""
        grants = self.secrets.get(tenant, {})
        return ", ".join(f"{n} ({g.describe()})" for n, g in sorted(grants.items())) or "none"


def parse_hosts(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise ConfigurationError(f"{where}: {LLM_HOSTS_KEY} must be a list of host names")
    if len(value) > MAX_LLM_HOSTS:
        raise ConfigurationError(f"{where}: more than {MAX_LLM_HOSTS} {LLM_HOSTS_KEY}")
    for h in value:
        problem = host_pattern_problem(h)
        if problem:
            raise ConfigurationError(f"{where}: {problem}")
    return tuple(value)


def parse_secrets(value: Any, where: str, base_dir: Path) -> dict[str, SecretGrant]:
    """``{NAME: {env: VAR} | {file: PATH}}``; a relative PATH is relative to the keys file."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}: secrets must map names to {{env: VAR}} or {{file: PATH}}")
    if len(value) > MAX_SECRETS_PER_TENANT:
        raise ConfigurationError(f"{where}: more than {MAX_SECRETS_PER_TENANT} secrets")
    out: dict[str, SecretGrant] = {}
    for name, source in value.items():
        if not isinstance(name, str) or not SECRET_NAME.match(name):
            raise ConfigurationError(f"{where}: invalid secret name {name!r} (letters, digits and '_')")
        if not isinstance(source, dict) or len(source) != 1 or set(source) - {"env", "file"}:
            raise ConfigurationError(f"{where}: secret {name} needs exactly one of {{env: VAR}} or {{file: PATH}}")
        if "env" in source:
            var = source["env"]
            if not isinstance(var, str) or not SECRET_NAME.match(var):
                raise ConfigurationError(f"{where}: secret {name}: env must be an environment variable name")
            out[name] = SecretGrant(name, env=var)
        else:
            path = source["file"]
            if not isinstance(path, str) or not path.strip():
                raise ConfigurationError(f"{where}: secret {name}: file must be a path")
            out[name] = SecretGrant(name, file=(base_dir / Path(path).expanduser()).resolve())
    return out


def parse_share(entry: Any, where: str) -> float:
    """A tenant's ``share:`` (its weight when the server's evaluation slots are contended), 1 when unset."""
    value = entry.get(SHARE_KEY, 1.0) if isinstance(entry, dict) else 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_SHARE:
        raise ConfigurationError(f"{where}: share must be a number above 0 and at most {MAX_SHARE:g}")
    return float(value)


def parse_retention(entry: Any, where: str) -> float:
    """A tenant's ``retention: {inputs: 7d}`` in seconds (0 when absent or ``off``)."""
    value = entry.get(RETENTION_KEY) if isinstance(entry, dict) else None
    if value is None:
        return 0.0
    if not isinstance(value, dict) or set(value) - {"inputs"}:
        raise ConfigurationError(f"{where}: retention must be {{inputs: DURATION}} (e.g. 7d, 12h, or off)")
    try:
        return retention_seconds(value.get("inputs")) or 0.0
    except ValueError as exc:
        raise ConfigurationError(f"{where}: retention.inputs: {exc}") from None


def parse_tenant_entry(
    entry: Any, where: str, base_dir: Path
) -> tuple[Any, dict[str, SecretGrant], tuple[str, ...], WebhookGrant]:
    """(keys as written, secrets, hosts, webhooks) of one tenant: a list of keys, or the mapping form."""
    if not isinstance(entry, dict):
        return entry, {}, (), WebhookGrant()
    unknown = sorted(set(entry) - TENANT_ENTRY_KEYS)
    if unknown:
        raise ConfigurationError(f"{where}: unknown field(s) {unknown} (expected {sorted(TENANT_ENTRY_KEYS)})")

    def secret(source: Any, at: str) -> SecretGrant:
        return parse_secrets({"signing_secret": source}, at, base_dir)["signing_secret"]

    return (
        entry.get("keys"),
        parse_secrets(entry.get("secrets"), where, base_dir),
        parse_hosts(entry.get(LLM_HOSTS_KEY), where),
        parse_webhooks(entry.get(WEBHOOKS_KEY), where, secret),
    )
