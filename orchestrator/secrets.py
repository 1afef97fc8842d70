"""Where ``${NAME}`` values come from, and how they are kept out of what a call returns.

A :class:`SecretSource` answers two questions: may a policy reference ``NAME`` (asked when a
policy is validated) and what is ``NAME``'s value *now* (asked at call time only, so a
rotated file secret takes effect on the next call). Two sources exist:

- :class:`EnvironmentSecrets`, the local process environment: ``PolicyTester``,
  ``crossaudit policy test`` and ``crossaudit serve --dev`` (one local user, who owns that
  environment anyway). An unset name is a validation *warning*.
- :class:`TenantSecrets`, what the operator granted one tenant in the API-keys file: per name,
  an environment variable of the server or a file. Nothing else is reachable, and a name that
  is not granted is a validation *error*.

:class:`SecretUse` collects the values one call expanded and masks them (``***``) out of the
call's verdict, error messages and diagnostics before they leave the evaluator, as CI systems
mask secrets in logs. Masking catches echoes, not deliberate encodings: the tenant owns the
secrets granted to it; masking keeps them out of decisions, the audit log, logs and metrics.

:class:`HostAllowlist` is the operator's list of hosts an LLM evaluator's ``base_url`` may
name in multi-tenant mode (the providers' default endpoints need no entry).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

log = logging.getLogger("crossaudit.secrets")

SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # the names ``${NAME}`` can spell
MASK = "***"
MAX_SECRET_BYTES = 64 * 1024  # a file secret larger than this is unavailable (never read whole)
MIN_MASKED_LINE_CHARS = 4  # lines of a multi-line secret shorter than this are not masked alone
MIN_PARTIAL_MASK_CHARS = 8  # a capped message ending in a secret's first 8+ characters has them masked
CUT_TAIL_CHARS = " .…'\")]}\n"  # what a cap may leave after the cut: ellipses, closing quotes, brackets
DEFAULT_PORTS = {"http": 80, "https": 443}  # the schemes an LLM base_url may use, and their ports
ALLOWED_URL_SCHEMES = frozenset(DEFAULT_PORTS)


@runtime_checkable
class SecretSource(Protocol):
    """What ``${NAME}`` may refer to and what it is worth now."""

    kind: str  # how messages call a name: "environment variable" or "secret"
    strict: bool  # a reference to a name that is not granted is a validation error (else a warning)

    def granted(self, name: str) -> bool:
        """May a policy reference ``name``? Answered without reading a secret's value."""
        ...

    def get(self, name: str) -> str | None:
        """The value now, or None when it is unavailable (unset, empty, unreadable, not granted)."""
        ...


class EnvironmentSecrets:
    """The process environment (live: ``os.environ`` when no mapping is given).

    An empty value counts as unset everywhere: an empty secret is never what a policy meant.
    """

    kind = "environment variable"
    strict = False

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def granted(self, name: str) -> bool:
        return bool(self.environ.get(name))

    def get(self, name: str) -> str | None:
        return self.environ.get(name) or None


@dataclass(frozen=True)
class SecretGrant:
    """One secret the operator grants a tenant: exactly one of ``env`` (a variable of the
    server's environment) or ``file`` (read at each call; one trailing newline is dropped)."""

    name: str
    env: str | None = None
    file: Path | None = None

    def describe(self) -> str:
        """For the operator's log only (never sent to a tenant)."""
        return f"environment variable {self.env}" if self.env else f"file {self.file}"

    def read(self, max_bytes: int = MAX_SECRET_BYTES) -> str | None:
        if self.env:
            return os.environ.get(self.env) or None
        assert self.file is not None
        try:
            with open(self.file, "rb") as fh:
                raw = fh.read(max_bytes + 1)
        except OSError:
            return None
        if len(raw) > max_bytes:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if text.endswith("\r\n"):
            text = text[:-2]
        elif text.endswith("\n"):
            text = text[:-1]
        return text or None


class TenantSecrets:
    """The secrets granted to one tenant; each value is read when a call needs it."""

    kind = "secret"
    strict = True

    def __init__(
        self, tenant: str, grants: Mapping[str, SecretGrant] | None = None, *, max_bytes: int = MAX_SECRET_BYTES
    ) -> None:
        self.tenant = tenant
        self.grants = dict(grants or {})
        self.max_bytes = max_bytes

    def granted(self, name: str) -> bool:
        return name in self.grants

    def get(self, name: str) -> str | None:
        grant = self.grants.get(name)
        if grant is None:
            return None
        value = grant.read(self.max_bytes)
        if value is None:
            log.warning(
                "tenant %s: secret %s (%s) is unavailable (unset, empty, unreadable or over %d bytes)",
                self.tenant,
                name,
                grant.describe(),
                self.max_bytes,
            )
        return value


def as_secret_source(value: Mapping[str, str] | SecretSource | None) -> SecretSource:
    """A mapping (or None: ``os.environ``) is read as an environment; a source is kept."""
    if value is None or isinstance(value, Mapping):
        return EnvironmentSecrets(value)
    return value


# --- masking ------------------------------------------------------------------------------------


class SecretUse:
    """The secret values one call used; :meth:`mask` / :meth:`scrub` replace them with ``***``.

    Besides the value itself it masks its JSON- and repr-escaped forms (how a value shows up
    inside an error message or a serialised document) and each line of a multi-line value.
    """

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._forms: list[str] | None = []

    def add(self, value: str) -> None:
        if value and value not in self._values:
            self._values.add(value)
            self._forms = None

    def __bool__(self) -> bool:
        return bool(self._values)

    def _patterns(self) -> list[str]:
        if self._forms is None:
            forms: set[str] = set()
            for v in self._values:
                forms |= {v, json.dumps(v)[1:-1], repr(v)[1:-1]}
                if "\n" in v:
                    forms |= {ln.strip() for ln in v.splitlines() if len(ln.strip()) >= MIN_MASKED_LINE_CHARS}
            self._forms = sorted((f for f in forms if f), key=len, reverse=True)  # longest first
        return self._forms

    def mask(self, text: str) -> str:
        if not self._values or not text:
            return text
        for form in self._patterns():
            if form in text:
                text = text.replace(form, MASK)
        for form in self._patterns():
            text = _mask_cut_tail(text, form)
        return text

    def scrub(self, value: Any) -> Any:
        """``value`` with every string in it (mapping keys included) masked."""
        if not self._values:
            return value
        if isinstance(value, str):
            return self.mask(value)
        if isinstance(value, Mapping):
            return {self.scrub(k): self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub(v) for v in value)
        return value

    def mask_error(self, exc: BaseException) -> BaseException:
        """Mask the message (and any attached diagnostics) of ``exc`` in place; returns it."""
        if not self._values:
            return exc
        message = getattr(exc, "message", None)
        if isinstance(message, str):
            exc.message = self.mask(message)  # type: ignore[attr-defined]
        exc.args = tuple(self.mask(a) if isinstance(a, str) else a for a in exc.args)
        diagnostics = getattr(exc, "diagnostics", None)
        if diagnostics is not None:
            for field in ("stdout", "stderr"):
                text = getattr(diagnostics, field, None)
                if isinstance(text, str):
                    setattr(diagnostics, field, self.mask(text))
        return exc


def _mask_cut_tail(text: str, form: str) -> str:
    """Mask a secret that a length cap cut off: text that ends (before closing dots, quotes or
    spaces) with the first ``MIN_PARTIAL_MASK_CHARS``+ characters of a secret. Error messages are
    capped where they are made (SDKs, the sandbox), before they reach the masking."""
    body = text.rstrip(CUT_TAIL_CHARS)
    for k in range(min(len(form) - 1, len(body)), MIN_PARTIAL_MASK_CHARS - 1, -1):
        if body.endswith(form[:k]):
            return body[:-k] + MASK + text[len(body) :]
    return text


# --- LLM endpoints -------------------------------------------------------------------------------


class HostAllowlist:
    """Hosts an LLM ``base_url`` may name: exact names or IP addresses, ``*.example.com`` for any
    subdomain, optionally with ``:port``. Empty = only the providers' default endpoints."""

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self.patterns = tuple(dict.fromkeys(p.strip().lower() for p in patterns if p and p.strip()))
        for p in self.patterns:
            problem = host_pattern_problem(p)
            if problem:
                raise ValueError(problem)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def allows(self, host: str, port: int | None) -> bool:
        host = host.lower().rstrip(".")
        for pattern in self.patterns:
            name, _, want_port = _split_pattern(pattern)
            if want_port and str(port) != want_port:
                continue
            if name.startswith("*."):
                if host.endswith(name[1:]) and host != name[2:]:
                    return True
            elif host == name:
                return True
        return False

    def url_problem(self, url: str, *, show_host: bool = True) -> str | None:
        """Why ``url`` may not be used as a base_url, or None. Never echoes the URL's path, nor
        its host unless ``show_host`` (off at call time: the URL may come from a secret)."""
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError:
            return "base_url is not a valid URL"
        if parts.scheme.lower() not in ALLOWED_URL_SCHEMES:
            return "base_url must be an http or https URL"
        if not parts.hostname:
            return "base_url has no host"
        if not self.allows(parts.hostname, port or DEFAULT_PORTS[parts.scheme.lower()]):
            host = f" {parts.hostname!r}" if show_host else ""
            return (
                f"base_url host{host} is not allowed for this tenant (the operator lists LLM "
                "hosts in llm_base_url_hosts of the API-keys file or with --llm-base-url-host)"
            )
        return None


def _split_pattern(pattern: str) -> tuple[str, str, str]:
    if pattern.startswith("["):  # [v6]:port
        host, _, rest = pattern[1:].partition("]")
        return host, ":", rest.lstrip(":")
    if pattern.count(":") == 1:
        return pattern.partition(":")
    return pattern, "", ""


def host_pattern_problem(pattern: str) -> str | None:
    name, _, port = _split_pattern(pattern.strip().lower())
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        return f"invalid port in LLM host {pattern!r}"
    bare = name[2:] if name.startswith("*.") else name
    try:
        ipaddress.ip_address(bare)
        return None if not name.startswith("*.") else f"a wildcard cannot apply to an IP address: {pattern!r}"
    except ValueError:
        pass
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", bare):
        return f"invalid LLM host {pattern!r}: a host name or IP address, '*.domain' or with ':port'"
    return None
