"""Service configuration: every limit of the gRPC layer is a named, documented value here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from crossaudit.kernel.limits import DependencyLimits, EngineLimits, PoolLimits, SandboxLimits
from crossaudit.modelserver.pool import ModelServerLimits
from crossaudit.service.outbox.limits import DeliveryLimits
from crossaudit.service.pricing import DEFAULT_LLM_PRICES, LLMPrice
from crossaudit.store.postgres import PostgresLimits

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "[::1]"})
# The one default environment: what the server assumes when a request names none, what the CLI
# and the SDK send by default, and where policies/*.yaml are deployed on a data dir's first
# start. One value, so `crossaudit serve --dev` then `crossaudit evaluate NAME --server` finds
# the policy (docs/service.md, "Environments").
DEFAULT_ENVIRONMENT = "production"
DEV_TENANT = "default"
# --dev serves the review console here unless console_port says otherwise (with --port 0, on an
# ephemeral port too, so parallel dev servers never collide).
DEV_CONSOLE_PORT = 8081
CONSOLE_OFF = "off"  # console_port: never serve the console, not even with --dev


REQUEST_LIMIT_KEY = "limits.max_request_bytes"  # ServiceLimits.max_request_bytes as a setting
REQUEST_LIMIT_ENV = "CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES"  # ... and its variable (server, SDK, CLI)
# gRPC's own cap on a received message is set this far above max_request_bytes, so a request a
# little too large reaches the handler and gets the typed refusal naming the setting rather
# than grpc's "Received message larger than max" (which names nothing).
TRANSPORT_MARGIN_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ServiceLimits:
    """Caps of the gRPC layer (see docs/service.md)."""

    # The largest request, one setting everywhere: the server refuses a larger message
    # (INVALID_ARGUMENT naming it), the SDK and the CLI check it before sending (the SDK reads
    # REQUEST_LIMIT_ENV, else this default), and it is the guard proxy's default body limit.
    max_request_bytes: int = 4 * 1024 * 1024
    max_send_message_bytes: int = 8 * 1024 * 1024  # one answer message
    max_concurrent_rpcs: int = 1024  # grpc.aio maximum_concurrent_rpcs; more = RESOURCE_EXHAUSTED
    max_inflight_evaluations_per_tenant: int = 256  # concurrent decisions of one tenant (rate limit)
    # Decisions evaluated at once, all tenants together; beyond, calls wait (within their
    # deadline) and each freed slot goes to the waiting tenant holding the least for its share
    # (weighted fair queueing, crossaudit.service.fairness; shares in the API-keys file).
    max_concurrent_evaluations: int = 64
    # ... of which one tenant holds at most this fraction (at least one slot), even when the rest
    # are free: the rest stay open to other tenants, admitted at once beside a flood rather than
    # at its next freed slot.
    max_concurrent_evaluations_tenant_fraction: float = 0.75
    max_stream_inflight: int = 16  # items of one EvaluateStream evaluated concurrently
    max_stream_items: int = 1_000_000  # items one EvaluateStream may carry
    default_deadline_s: float = 30.0  # decision budget when the caller sets no deadline
    answer_margin_s: float = 0.05  # kept back from the caller's deadline: engine grace + audit write + answer
    answer_margin_fraction: float = 0.25  # ... but never more than this share of a short deadline
    cutoff_margin_s: float = 0.02  # the engine is cancelled this long before the caller's deadline
    cutoff_margin_fraction: float = 0.1  # ... but never more than this share of a short deadline
    shutdown_grace_s: float = 5.0  # in-flight calls get this long on SIGTERM
    # Health follows the store: it is checked this often (a query on a connection of its own);
    # NOT_SERVING from the first failed check, SERVING again from the first that succeeds, which
    # also replaces a PostgreSQL pool left backing off: the recovery lag after the database returns.
    store_check_interval_s: float = 1.0
    store_check_timeout_s: float = 2.0  # a check not answered within this counts as failed
    max_list_items: int = 1_000  # list answers are capped at this many items
    max_name_length: int = 200  # policy/evaluator names, environments, labels
    max_code_bytes: int = 256 * 1024  # uploaded evaluator source
    # Uploaded evaluators a tenant keeps (every stored version counts: each holds its code) and
    # their code together; an upload beyond is RESOURCE_EXHAUSTED naming the setting.
    max_evaluators_per_tenant: int = 1_000
    max_evaluator_code_bytes_per_tenant: int = 64 * 1024 * 1024
    # Open review items of one tenant: a decision whose reviews would pass it is still answered
    # and audited, its reviews not opened (the audit's rules say so: review_not_opened).
    max_open_reviews_per_tenant: int = 10_000
    max_dependencies: int = 20
    max_feedback_comment_bytes: int = 4_096
    max_api_keys_file_bytes: int = 1024 * 1024
    min_api_key_length: int = 16
    policy_cache_entries: int = 256  # parsed policies kept per process
    # How long a process trusts the deployed version it last read: a deploy or rollback made by
    # another replica sharing the store is in effect here within this bound (one indexed read
    # per policy and environment per interval).
    deployment_recheck_s: float = 1.0
    upload_timeout_s: float = 1_800.0  # validation + image build of one upload
    max_concurrent_uploads_per_tenant: int = 2  # image builds are heavy: more = RESOURCE_EXHAUSTED
    # Struct/list nesting of a request's Struct (Evaluate context); deeper is INVALID_ARGUMENT.
    # The protobuf runtime cannot decode much deeper anyway (its recursion limit: ~33 levels).
    max_struct_depth: int = 32
    # Audit quotas (docs/threat-model.md, "Noisy neighbours"). One decision's audit record: a
    # larger one is stored cut down (violations, then raw texts, reasons, evaluators, rules), its
    # ``truncated`` field naming this setting and what went; the verdict is always kept.
    max_audit_bytes_per_decision: int = 256 * 1024
    # A tenant's audit bytes per UTC day, every replica together: once reached, its evaluations
    # are refused (RESOURCE_EXHAUSTED naming this setting) before anything is evaluated, so no
    # answered decision goes unaudited. Concurrent calls admitted just before may overshoot by
    # at most max_inflight_evaluations_per_tenant x max_audit_bytes_per_decision per replica.
    max_audit_bytes_per_tenant_per_day: int = 1024 * 1024 * 1024
    # How long a replica trusts its count of a tenant's audit bytes today before reading the
    # store's again (one read per tenant per interval; its own writes are counted at once).
    audit_usage_recheck_s: float = 1.0


@dataclass(frozen=True)
class ConsoleLimits:
    """Caps of the review console (``--console-port``; docs/review-console.md)."""

    session_idle_s: float = 15 * 60  # a session unused this long is signed out
    session_max_age_s: float = 8 * 3600  # ... and any session this long after sign-in
    # Sessions held in memory, all tenants together. When full, a new sign-in is refused (HTTP
    # 503) rather than signing out someone else: one tenant's sign-ins never end another's.
    max_sessions: int = 10_000
    max_sessions_per_key: int = 20  # of one API key: beyond, that key's least recently used is signed out
    max_sessions_per_tenant: int = 1_000  # of one tenant's keys: beyond, that tenant's least recently used
    signin_failures_per_minute: int = 10  # failed sign-ins per client address; more = HTTP 429
    signins_per_minute_per_key: int = 10  # successful sign-ins of one API key; more = HTTP 429
    signins_per_minute_per_client: int = 30  # successful sign-ins from one client address; more = HTTP 429
    max_form_bytes: int = 64 * 1024  # one POSTed form
    page_items: int = 200  # rows on a queue or audit-log page
    max_concurrent_requests: int = 64  # requests in flight (not open connections); more = HTTP 503
    # Open connections, and of one client address (an IPv6 client: its /64). A new connection
    # beyond either closes the oldest one still waiting for its request (beyond all: of the
    # client holding the most), else it is closed itself: idle sockets never lock others out.
    max_connections: int = 512
    max_connections_per_client: int = 16
    # Seconds a client has to send a request's head (request line and headers), from the
    # connection's start or the previous answer; then the connection is closed.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0  # seconds a POSTed form has to arrive once its head did; more = HTTP 408


@dataclass(frozen=True)
class MetricsLimits:
    """Label cardinality of the Prometheus metrics (``--metrics-port``; docs/configuration.md)."""

    # The first this many tenants seen keep their name in the ``tenant`` label; later ones are
    # counted as ``other``, so a deployment with many tenants cannot grow the series without bound.
    max_tenant_labels: int = 100
    # LLM models named in a policy (tenant-controlled text) keep their name in the ``model`` label
    # up to this many distinct names besides those of the price table; the rest are ``other``.
    max_model_labels: int = 50


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``crossaudit serve`` runs with; built from the layered settings
    (``crossaudit.service.settings``: defaults < file < environment < flags)."""

    host: str = "127.0.0.1"
    port: int = 50051  # 0 = an ephemeral port (printed on start)
    data_dir: Path = Path(".crossaudit")
    sandbox: str = "auto"  # docker | process | auto
    # How frames reach Docker sandbox agents: socket (a private unix socket per container, no
    # daemon in the path), attach (the container's attach stream, through the daemon), or auto
    # (socket where the daemon is local and can bind our paths; docs/sandbox-docker.md).
    docker_channel: str = "auto"
    allow_process_sandbox: bool = False  # with API keys, the weaker process sandbox is an explicit opt-in
    model_servers: str | None = None  # subprocess | docker (hardened containers); None = $CROSSAUDIT_MODEL_SERVERS
    api_keys_file: Path | None = None
    dev: bool = False
    metrics_port: int | None = None  # None = no metrics endpoint; 0 = ephemeral
    metrics_host: str = "127.0.0.1"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    policies_dir: Path | None = Path("policies")
    audit_raw_text: bool = False  # store prompt/response text in the audit log (else hashes only)
    llm_base_url_hosts: tuple[str, ...] = ()  # LLM hosts every tenant may use (besides the API-keys file's)
    store_synchronous: str = "NORMAL"  # SQLite synchronous: NORMAL survives kill -9, FULL power loss
    store_url: str | None = None  # postgresql://… shares the state between replicas; None = SQLite in data_dir
    decision_log_url: str | None = None  # push every decision to this HTTP endpoint, in batches (docs/decision-log.md)
    decision_log_dir: Path | None = None  # ... and/or append it to JSONL files in this directory
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    # The review console's HTTP port: 0 = ephemeral, "off" = never; None (unset) = off, except
    # with --dev: DEV_CONSOLE_PORT. ``console_listen_port`` is the port in effect.
    console_port: int | Literal["off"] | None = None
    console_host: str = "127.0.0.1"  # beyond loopback only with TLS (--tls-cert/--tls-key)
    console_limits: ConsoleLimits = field(default_factory=ConsoleLimits)
    engine_limits: EngineLimits = field(default_factory=EngineLimits)
    sandbox_limits: SandboxLimits = field(default_factory=SandboxLimits)
    pool_limits: PoolLimits = field(default_factory=PoolLimits)
    dependency_limits: DependencyLimits = field(default_factory=DependencyLimits)
    delivery_limits: DeliveryLimits = field(default_factory=DeliveryLimits)
    postgres_limits: PostgresLimits = field(default_factory=PostgresLimits)
    model_server_limits: ModelServerLimits = field(default_factory=ModelServerLimits)
    metrics_limits: MetricsLimits = field(default_factory=MetricsLimits)
    # USD per million tokens by model, for crossaudit_llm_cost_usd_total; entries given in the
    # configuration are added to (or replace) these; models not listed count tokens, no cost.
    llm_prices: dict[str, LLMPrice] = field(default_factory=lambda: dict(DEFAULT_LLM_PRICES))
    log_level: str = "INFO"  # DEBUG | INFO | WARNING | ERROR
    log_format: str = "text"  # text | json (one JSON object per line)

    @property
    def database_path(self) -> Path:
        return self.data_dir / "crossaudit.db"

    @property
    def console_default_port(self) -> bool:
        """True when the console port comes from --dev's default rather than from the operator."""
        return self.console_port is None and self.dev

    @property
    def console_listen_port(self) -> int | None:
        """The console's port in effect (None: no console). A new user's ``serve --dev`` gets the
        console without knowing the flag; an operator's server serves it only when asked."""
        if self.console_port == CONSOLE_OFF:
            return None
        if isinstance(self.console_port, int):
            return self.console_port
        if self.console_default_port:
            return DEV_CONSOLE_PORT if self.port else 0
        return None
