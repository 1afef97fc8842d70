"""The guard proxy's configuration: a YAML file (``--config``), then command-line flags.

Who may call, and what a call may choose, is the operator's: each *caller* has its own proxy
keys, the CrossAudit key its decisions are made (and audited) under, and the policies it may
name. A caller's key is never a CrossAudit key and never goes upstream (unless
``upstream.forward_caller_authorization``); the upstream key is the operator's, read from the
environment or a file each time it is sent. docs/proxy.md describes every key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from crossaudit.api.limits import DEFAULT_ENVIRONMENT, DEFAULT_MAX_REQUEST_BYTES
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.configfile import check_private_file, read_yaml_file
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.listen import LOOPBACK_HOSTS
from crossaudit.sdk.options import API_KEY_ENV, SERVER_ENV
from orchestrator.secrets import MAX_SECRET_BYTES, SecretGrant

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
MIN_CALLER_KEY_LENGTH = 16  # the server's minimum for API keys, for the same reason (guessing)
MAX_CALLERS = 10_000
MAX_POLICIES_PER_CALLER = 1_000
ANY_POLICY = "*"  # in a caller's ``policies``: any policy of its CrossAudit tenant
DEFAULT_REFUSAL = "I can't help with that request."
DEV_CALLER = "dev"


@dataclass(frozen=True)
class ProxyLimits:
    """Every bound of the proxy (``limits:`` in the file; docs/proxy.md#limits)."""

    # A chat-completions request body; more is HTTP 413 (read no further). The same name and
    # default as the server's limits.max_request_bytes: one size limit for a request everywhere.
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # Messages in one request; more is HTTP 400.
    max_messages: int = 512
    # Choices asked for (``n``); each is evaluated at the output stage. More is HTTP 400.
    max_choices: int = 8
    # The upstream's whole answer: a JSON body, or a streamed answer buffered before it is
    # evaluated (every SSE byte counts). More is HTTP 502: an answer the guard cannot hold is not
    # returned unevaluated.
    max_upstream_response_bytes: int = 8 * 1024 * 1024
    # Seconds for the whole upstream call: connect, send, and the complete answer (a stream
    # included). More is HTTP 504.
    upstream_timeout_s: float = 300.0
    # Seconds to open a connection to the upstream. More is HTTP 502.
    upstream_connect_timeout_s: float = 10.0
    # Seconds CrossAudit has for each evaluation (the Evaluate call's deadline). More is
    # "CrossAudit unavailable": HTTP 503, or a pass with fail_open.
    evaluation_timeout_s: float = 30.0
    # Seconds the start check waits for CrossAudit to answer (a server started at the same time
    # is given this long to come up); then the proxy does not start.
    start_check_timeout_s: float = 10.0
    # Evaluations one call runs at once (input_messages: all evaluates each message; n choices
    # each answer): the rest wait, so one call cannot use up the tenant's in-flight evaluations.
    max_evaluations_per_call: int = 4
    # Requests served at once (uvicorn's limit_concurrency): more are answered HTTP 503.
    max_concurrent_requests: int = 128
    # Connections kept to the upstream (httpx pool).
    max_upstream_connections: int = 64
    # Seconds an idle client connection is kept open.
    keep_alive_s: float = 5.0
    # Seconds a client has to send a request's whole head (request line and headers), from the
    # connection's start or the previous answer; the connection is closed after that. Open
    # connections count against max_concurrent_requests: without this, a client holding them
    # open without a complete request would keep every other caller out for as long as it likes.
    header_timeout_s: float = 10.0
    # Seconds a client has to send a request's body once its head arrived; more is HTTP 408.
    body_timeout_s: float = 30.0
    # A streamed answer is evaluated in windows of at least this many new characters; each is
    # released once its output rules pass, so the first token waits for the first window
    # (docs/proxy.md#streaming). Per policy: policies.NAME.stream_window_chars.
    stream_window_chars: int = 256
    # Characters of the text already released that each window is evaluated with, and of each
    # window held back until the next one: a match of at most this many characters is evaluated
    # whole before any of it is released. Less than stream_window_chars.
    stream_context_chars: int = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """A secret by reference: exactly one of an environment variable or a file."""

    env: str | None = Field(default=None, min_length=1, description="A variable of the proxy's environment")
    file: str | None = Field(default=None, min_length=1, description="A file (relative: to the config file)")

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of {env: VAR} or {file: PATH}")
        return self


class UpstreamSection(_Strict):
    url: str | None = Field(default=None, description="Base URL of the OpenAI-compatible API, e.g. .../v1")
    api_key: SecretRef | None = Field(default=None, description="The operator's key for the upstream")
    headers: dict[str, str] = Field(default_factory=dict, description="Static headers sent upstream")
    forward_caller_authorization: bool = Field(
        default=False, description="Send the caller's own Authorization upstream instead of api_key"
    )

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if name.lower() in ("authorization", "host", "content-length", "content-type"):
                raise ValueError(f"header {name!r} is set by the proxy (use api_key for credentials)")
        return v


class AnthropicUpstreamSection(_Strict):
    """Anthropic's Messages API (``/v1/messages``), served when this is set."""

    url: str | None = Field(default=None, description="Base URL of the Anthropic-compatible API, e.g. .../v1")
    api_key: SecretRef | None = Field(default=None, description="The operator's key, sent as x-api-key")
    headers: dict[str, str] = Field(default_factory=dict, description="Static headers sent upstream")

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if name.lower() in ("x-api-key", "authorization", "host", "content-length", "content-type"):
                raise ValueError(f"header {name!r} is set by the proxy (use api_key for credentials)")
        return v


class CrossAuditSection(_Strict):
    server: str | None = Field(default=None, description=f"gRPC address (default: ${SERVER_ENV})")
    api_key: SecretRef | None = Field(default=None, description=f"Default CrossAudit key (default: ${API_KEY_ENV})")
    environment: str = Field(default=DEFAULT_ENVIRONMENT, description="Environment the policies are deployed in")
    tls: bool = Field(default=False, description="Connect with TLS (system roots)")
    ca_cert: str | None = Field(default=None, description="Connect with TLS trusting this CA certificate")


class CallerSection(_Strict):
    keys: list[str] = Field(min_length=1, description="The caller's proxy keys (Authorization: Bearer KEY)")
    crossaudit_api_key: SecretRef | None = Field(
        default=None, description="CrossAudit key (tenant) its decisions are made under (default: crossaudit.api_key)"
    )
    policies: list[str] = Field(min_length=1, description="Policies it may name ('*': any of its tenant's)")
    default_policy: str | None = Field(default=None, description="Used when a call names none")
    environment: str | None = Field(default=None, description="Overrides crossaudit.environment")
    on_block: Literal["error", "refusal"] | None = Field(default=None, description="Overrides on_block")
    fail_open: bool | None = Field(default=None, description="Overrides fail_open")

    @field_validator("keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        for k in v:
            if len(k) < MIN_CALLER_KEY_LENGTH or any(c.isspace() for c in k):
                raise ValueError(f"a caller key must be at least {MIN_CALLER_KEY_LENGTH} non-blank characters")
        return v

    @model_validator(mode="after")
    def _default_allowed(self) -> CallerSection:
        if len(self.policies) > MAX_POLICIES_PER_CALLER:
            raise ValueError(f"at most {MAX_POLICIES_PER_CALLER} policies per caller")
        if self.default_policy and ANY_POLICY not in self.policies and self.default_policy not in self.policies:
            raise ValueError(f"default_policy {self.default_policy!r} is not among the caller's policies")
        return self


class PolicySection(_Strict):
    """How the proxy runs one policy's calls (``policies: NAME: {...}``); unset: the proxy's own."""

    input_mode: Literal["blocking", "parallel"] | None = Field(default=None, description="Overrides input_mode")
    stream: Literal["windows", "buffered"] | None = Field(default=None, description="Overrides stream")
    stream_window_chars: int | None = Field(default=None, gt=0, description="Overrides limits.stream_window_chars")
    stream_context_chars: int | None = Field(default=None, gt=0, description="Overrides limits.stream_context_chars")


class ProxyFile(_Strict):
    """The configuration file, as written."""

    upstream: UpstreamSection = Field(default_factory=UpstreamSection)
    anthropic_upstream: AnthropicUpstreamSection = Field(default_factory=AnthropicUpstreamSection)
    crossaudit: CrossAuditSection = Field(default_factory=CrossAuditSection)
    callers: dict[str, CallerSection] = Field(default_factory=dict)
    on_block: Literal["error", "refusal"] = "error"
    refusal_message: str = Field(default=DEFAULT_REFUSAL, min_length=1, max_length=4096)
    fail_open: bool = False
    input_messages: Literal["last_user", "all"] = "last_user"
    # blocking: the upstream is called once the input stage passed; parallel: at once, alongside it
    input_mode: Literal["blocking", "parallel"] = "blocking"
    # windows: a stream is evaluated and released window by window; buffered: whole, then replayed
    stream: Literal["windows", "buffered"] = "windows"
    policies: dict[str, PolicySection] = Field(default_factory=dict)
    limits: dict[str, float] = Field(default_factory=dict)


@dataclass(frozen=True)
class Caller:
    """One caller as the proxy serves it."""

    name: str
    policies: frozenset[str]
    default_policy: str | None
    environment: str
    crossaudit_key: SecretGrant | None  # None: the default key ($CROSSAUDIT_API_KEY, or none)
    on_block: str = "error"  # "error" | "refusal"
    fail_open: bool = False

    def may_use(self, policy: str) -> bool:
        return ANY_POLICY in self.policies or policy in self.policies


@dataclass(frozen=True)
class PolicyRun:
    """How one policy's calls run: the input stage's mode and the stream's windows."""

    input_mode: str = "blocking"  # "blocking" | "parallel"
    stream: str = "windows"  # "windows" | "buffered"
    window_chars: int = ProxyLimits.stream_window_chars
    context_chars: int = ProxyLimits.stream_context_chars


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy runs with (file < flags)."""

    upstream_url: str
    upstream_key: SecretGrant | None = None
    upstream_headers: Mapping[str, str] = field(default_factory=dict)
    forward_caller_authorization: bool = False
    anthropic_url: str | None = None  # Anthropic's Messages API upstream; None: /v1/messages not served
    anthropic_key: SecretGrant | None = None
    anthropic_headers: Mapping[str, str] = field(default_factory=dict)
    server: str | None = None  # None: $CROSSAUDIT_SERVER, else the SDK's default
    crossaudit_key: SecretGrant | None = None  # the default CrossAudit key
    crossaudit_tls: bool | str = False
    environment: str = DEFAULT_ENVIRONMENT
    callers: Mapping[str, Caller] = field(default_factory=dict)  # sha256(key) -> caller
    dev: bool = False  # no caller keys: every call is the one local developer's
    dev_caller: Caller | None = None
    on_block: str = "error"
    refusal_message: str = DEFAULT_REFUSAL
    fail_open: bool = False
    input_messages: str = "last_user"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tls_cert: str | None = None
    tls_key: str | None = None
    limits: ProxyLimits = field(default_factory=ProxyLimits)
    run: PolicyRun = field(default_factory=PolicyRun)  # every policy's, unless policies names it
    policies: Mapping[str, PolicyRun] = field(default_factory=dict)

    def policy_run(self, policy: str) -> PolicyRun:
        return self.policies.get(policy, self.run)

    def caller(self, key: str | None) -> Caller | None:
        """The caller a bearer key belongs to (None: unknown). Keys are looked up by their SHA-256,
        so the lookup's time says nothing about how much of a real key a guess matched."""
        if self.dev:
            return self.dev_caller
        if not key:
            return None
        return self.callers.get(sha256_text(key))

    def callers_list(self) -> list[Caller]:
        seen: dict[str, Caller] = {}
        for c in self.callers.values():
            seen[c.name] = c
        if self.dev_caller is not None:
            seen[self.dev_caller.name] = self.dev_caller
        return list(seen.values())


def read_file(path: Path) -> ProxyFile:
    """The configuration file, validated; a file holding caller keys must be private (0600). It is
    read like the server's (size-capped, no duplicate keys, no aliases; errors say line:col)."""
    file = read_yaml_file(path, "proxy configuration")
    try:
        parsed = ProxyFile.model_validate(file.data)
    except ValidationError as e:
        errors = e.errors()
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in errors)
        raise ConfigurationError(f"{file.where(tuple(errors[0]['loc']))}: {problems}") from None
    if parsed.callers:
        check_private_file(path, "proxy configuration (it holds caller keys)")
    return parsed


def _grant(ref: SecretRef | None, name: str, base: Path | None) -> SecretGrant | None:
    if ref is None:
        return None
    if ref.env is not None:
        return SecretGrant(name, env=ref.env)
    assert ref.file is not None
    p = Path(ref.file)
    if not p.is_absolute() and base is not None:
        p = base / p
    return SecretGrant(name, file=p)


def read_secret(grant: SecretGrant | None, what: str) -> str | None:
    """The value of ``grant`` now (a file is re-read: rotation applies to the next call)."""
    if grant is None:
        return None
    value = grant.read(MAX_SECRET_BYTES)
    if value is None:
        raise ConfigurationError(f"{what}: {grant.describe()} is unset, unreadable or empty")
    return value


def _limits(values: Mapping[str, float], base: ProxyLimits) -> ProxyLimits:
    known = {f.name: f for f in fields(ProxyLimits)}
    changes: dict[str, Any] = {}
    for name, value in values.items():
        f = known.get(name)
        if f is None:
            raise ConfigurationError(f"limits.{name}: unknown limit (known: {', '.join(sorted(known))})")
        is_int = isinstance(getattr(base, name), int)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ConfigurationError(f"limits.{name}: a positive number, got {value!r}")
        if is_int and int(value) != value:
            raise ConfigurationError(f"limits.{name}: a whole number, got {value!r}")
        changes[name] = int(value) if is_int else float(value)
    return replace(base, **changes)


def _runs(f: ProxyFile, limits: ProxyLimits) -> tuple[PolicyRun, dict[str, PolicyRun]]:
    """The proxy's way of running a policy's calls, and each named policy's, checked."""
    base = PolicyRun(f.input_mode, f.stream, limits.stream_window_chars, limits.stream_context_chars)
    named: dict[str, PolicyRun] = {}
    for name, p in f.policies.items():
        named[name] = PolicyRun(
            p.input_mode or base.input_mode,
            p.stream or base.stream,
            p.stream_window_chars or base.window_chars,
            p.stream_context_chars or base.context_chars,
        )
    for where, run in [("limits", base), *((f"policies.{n}", r) for n, r in named.items())]:
        if run.context_chars >= run.window_chars:
            raise ConfigurationError(
                f"{where}: stream_context_chars ({run.context_chars}) must be less than stream_window_chars "
                f"({run.window_chars}), else a window releases nothing"
            )
    return base, named


def _callers(f: ProxyFile, defaults: Caller, config_dir: Path | None) -> dict[str, Caller]:
    """Callers by the digest of each of their keys; ``defaults`` holds what a caller leaves unset."""
    callers: dict[str, Caller] = {}
    if len(f.callers) > MAX_CALLERS:
        raise ConfigurationError(f"callers: at most {MAX_CALLERS}")
    for name, c in f.callers.items():
        caller = Caller(
            name=name,
            policies=frozenset(c.policies),
            default_policy=c.default_policy,
            environment=c.environment or defaults.environment,
            crossaudit_key=_grant(c.crossaudit_api_key, f"callers.{name}", config_dir) or defaults.crossaudit_key,
            on_block=c.on_block or defaults.on_block,
            fail_open=defaults.fail_open if c.fail_open is None else c.fail_open,
        )
        for k in c.keys:
            digest = sha256_text(k)
            if digest in callers:
                raise ConfigurationError(f"callers.{name}: a key is also given to caller {callers[digest].name!r}")
            callers[digest] = caller
    return callers


def _check_dev(f: ProxyFile, callers: Mapping[str, Caller], bind: str) -> None:
    """--dev has no caller keys, so it serves loopback only."""
    if callers:
        raise ConfigurationError("--dev serves without caller keys: remove callers from the configuration")
    if bind not in LOOPBACK_HOSTS:
        raise ConfigurationError(f"--dev serves loopback only, not {bind!r}")
    if f.upstream.forward_caller_authorization:
        raise ConfigurationError("--dev has no caller keys to forward")


def _check_tls(bind: str, tls_cert: str | None, tls_key: str | None) -> None:
    if bind not in LOOPBACK_HOSTS and not (tls_cert and tls_key):
        raise ConfigurationError(
            f"{bind!r} is beyond loopback: serve it with TLS (--tls-cert and --tls-key), or keep 127.0.0.1 "
            "behind a TLS-terminating front"
        )
    if bool(tls_cert) != bool(tls_key):
        raise ConfigurationError("--tls-cert and --tls-key go together")
    if tls_key:
        check_private_file(Path(tls_key), "TLS private key")


def _upstream(
    f: ProxyFile, upstream: str | None, upstream_key_env: str | None, config_dir: Path | None
) -> tuple[str, SecretGrant | None]:
    """The OpenAI-compatible upstream's URL (a flag over the file) and the operator's key for it."""
    url = upstream or f.upstream.url
    if not url:
        raise ConfigurationError("no upstream: give --upstream URL or upstream.url in the configuration")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"upstream {url!r}: an http:// or https:// URL")
    upstream_key = SecretGrant("upstream", env=upstream_key_env) if upstream_key_env else None
    upstream_key = upstream_key or _grant(f.upstream.api_key, "upstream", config_dir)
    if upstream_key is not None and f.upstream.forward_caller_authorization:
        raise ConfigurationError("upstream: api_key and forward_caller_authorization exclude each other")
    return url, upstream_key


def build(
    file: ProxyFile | None,
    *,
    config_dir: Path | None = None,
    upstream: str | None = None,
    upstream_key_env: str | None = None,
    anthropic_upstream: str | None = None,
    anthropic_key_env: str | None = None,
    server: str | None = None,
    environment: str | None = None,
    policy: str | None = None,
    on_block: str | None = None,
    fail_open: bool | None = None,
    input_messages: str | None = None,
    dev: bool = False,
    host: str | None = None,
    port: int | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    crossaudit_tls: bool | str | None = None,
) -> ProxyConfig:
    """The file's settings with the flags given (not None) on top, checked as a whole."""
    f = file or ProxyFile()
    url, upstream_key = _upstream(f, upstream, upstream_key_env, config_dir)
    anthropic_url = anthropic_upstream or f.anthropic_upstream.url
    if anthropic_url is not None and not anthropic_url.startswith(("http://", "https://")):
        raise ConfigurationError(f"anthropic upstream {anthropic_url!r}: an http:// or https:// URL")
    anthropic_key = SecretGrant("anthropic_upstream", env=anthropic_key_env) if anthropic_key_env else None
    anthropic_key = anthropic_key or _grant(f.anthropic_upstream.api_key, "anthropic_upstream", config_dir)
    env = environment or f.crossaudit.environment
    block_as = on_block or f.on_block
    open_on_failure = f.fail_open if fail_open is None else fail_open
    default_key = _grant(f.crossaudit.api_key, "crossaudit", config_dir)
    defaults = Caller("", frozenset(), None, env, default_key, block_as, open_on_failure)
    callers = _callers(f, defaults, config_dir)
    bind = host or DEFAULT_HOST
    dev_caller = None
    if dev:
        _check_dev(f, callers, bind)
        dev_caller = Caller(DEV_CALLER, frozenset({ANY_POLICY}), policy, env, default_key, block_as, open_on_failure)
    elif not callers:
        raise ConfigurationError(
            "no callers: list them in the configuration (callers: NAME: {keys, policies}), or run with --dev"
        )
    elif policy:
        raise ConfigurationError("--policy is the --dev default policy; callers have default_policy in the file")
    _check_tls(bind, tls_cert, tls_key)
    limits = _limits(f.limits, ProxyLimits())
    run, runs = _runs(f, limits)
    ca_tls: bool | str = f.crossaudit.ca_cert or f.crossaudit.tls
    if crossaudit_tls is not None and crossaudit_tls is not False:
        ca_tls = crossaudit_tls
    return ProxyConfig(
        upstream_url=url.rstrip("/"),
        upstream_key=upstream_key,
        upstream_headers=dict(f.upstream.headers),
        forward_caller_authorization=f.upstream.forward_caller_authorization,
        anthropic_url=anthropic_url.rstrip("/") if anthropic_url else None,
        anthropic_key=anthropic_key,
        anthropic_headers=dict(f.anthropic_upstream.headers),
        server=server or f.crossaudit.server or os.environ.get(SERVER_ENV) or None,
        crossaudit_key=default_key,
        crossaudit_tls=ca_tls,
        environment=env,
        callers=callers,
        dev=dev,
        dev_caller=dev_caller,
        on_block=block_as,
        refusal_message=f.refusal_message,
        fail_open=open_on_failure,
        input_messages=input_messages or f.input_messages,
        host=bind,
        port=DEFAULT_PORT if port is None else port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        limits=limits,
        run=run,
        policies=runs,
    )
