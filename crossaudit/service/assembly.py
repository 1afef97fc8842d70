"""Assemble the gRPC server: store, sandbox, per-tenant engines, servicers, auth, health,
reflection, metrics, TLS, graceful shutdown. Shared by the one-process server
(crossaudit.service.server) and each worker of ``serve --workers N`` (crossaudit.service.workers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from crossaudit.api.limits import DEFAULT_ENVIRONMENT, TRANSPORT_MARGIN_BYTES
from crossaudit.governance.evidence import EvidenceLog, build_evidence, unsigned_log
from crossaudit.governance.records import engine_version
from crossaudit.governance.retention import with_dev_operator_key
from crossaudit.kernel.configfile import check_private_file
from crossaudit.kernel.errors import ConfigurationError, CrossAuditError
from crossaudit.kernel.limits import EngineLimits
from crossaudit.kernel.listen import LOOPBACK_HOSTS
from crossaudit.outbox.deliveries import DeliveryConfig
from crossaudit.service.auth import Authenticator
from crossaudit.service.config import ServerConfig
from crossaudit.service.core import CrossAuditService
from crossaudit.service.grants import TenantGrants
from crossaudit.service.health import LIVENESS_SERVICE, HealthServicer, StoreHealth
from crossaudit.service.metrics import ServiceMetrics
from crossaudit.service.ratelimits import store_limiters
from crossaudit.service.servicers import add_servicers
from crossaudit.service.tenants import DecisionEngine, EngineProvider, TenantFeedback, UploadedEvaluators
from crossaudit.service.tracing import Tracing, configure_tracing
from crossaudit.store import open_store
from crossaudit.store.base import Store
from crossaudit.store.postgres import mask_url
from crossaudit.store.sqlite import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, SQLiteStore
from orchestrator.engine.ratelimit import LimiterFactory
from sandbox.base import Sandbox

if TYPE_CHECKING:
    from orchestrator.evaluators.llm import UsageSink

log = logging.getLogger("crossaudit.service")
API_KEYS_ENV = "CROSSAUDIT_API_KEYS_FILE"
MAX_DATA_DIR_ENTRIES_FIXED = 100_000  # bound on the start-up permission walk of the data directory


def runtime_engines(
    sandbox: Sandbox,
    *,
    model_backend: Any = None,
    limits: EngineLimits | None = None,
    grants: TenantGrants | None = None,
    limiters: LimiterFactory | None = None,
    llm_usage: Callable[[str], UsageSink] | None = None,
) -> EngineProvider:
    """The real engine: one :class:`Engine` per tenant over one shared sandbox and model pool.
    A tenant's evaluators reach only its granted secrets and allowlisted LLM hosts;
    ``llm_usage(tenant)`` is told the tokens of that tenant's LLM calls."""
    from orchestrator.engine.engine import Engine
    from orchestrator.runtime import Runtime

    grants = grants if grants is not None else TenantGrants()

    def make(tenant: str, uploads: UploadedEvaluators, feedback: TenantFeedback) -> DecisionEngine:
        runtime = Runtime(
            sandbox,
            resolver=uploads,
            model_backend=model_backend,
            tenant=tenant,
            secrets=grants.source(tenant),
            llm_hosts=grants.hosts(tenant),
            llm_usage=llm_usage(tenant) if llm_usage is not None else None,
            llm_response_bytes=limits.max_llm_response_bytes if limits is not None else None,
        )
        if limiters is None:
            return Engine(runtime, limits=limits, feedback=feedback, scope=tenant)
        return Engine(runtime, limits=limits, feedback=feedback, scope=tenant, limiters=limiters)

    return make


def host_port(host: str, port: int) -> str:
    """``host:port`` for gRPC and printing (an IPv6 host in brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def check_config(config: ServerConfig) -> None:
    """Refuse unsafe or incomplete configurations before anything starts."""
    if config.dev and config.host not in LOOPBACK_HOSTS:
        raise ConfigurationError(f"--dev runs without API keys and only on loopback, not on {config.host!r}")
    if config.dev and config.api_keys_file:
        raise ConfigurationError(
            "--dev and --api-keys exclude each other (to keep the dev tenant's inputs for replay: "
            "--dev --retain-inputs 7d)"
        )
    check_retain_inputs(config)
    if not config.dev and not config.api_keys_file:
        raise ConfigurationError(f"give --api-keys FILE (or {API_KEYS_ENV}), or --dev for a local keyless server")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ConfigurationError("--tls-cert and --tls-key go together")
    if not 0 <= config.port <= 65535:
        raise ConfigurationError(f"invalid port {config.port}")
    if config.sandbox == "process":
        check_process_sandbox_allowed(config)
    from crossaudit.modelserver.pool import isolation_setting

    isolation_setting(config.model_servers)  # an unknown value fails here, not at the first builtin call
    if config.tls_key:
        check_private_file(config.tls_key, "TLS private key")
    if config.api_keys_file:
        check_private_file(config.api_keys_file, "API keys file")  # before anything starts
    from crossaudit.console import check_console_config

    check_console_config(config)  # the review console (--console-port)
    from crossaudit.governance.retention import load_operator_keys

    load_operator_keys(config.retention)  # a missing or malformed operator key fails here, nothing opened yet
    from crossaudit.governance.evidence import check_keys

    check_keys(config.evidence)  # likewise a configured signing key


def check_retain_inputs(config: ServerConfig) -> None:
    """``--retain-inputs`` is ``--dev``'s: one local tenant, its key made in the private data directory.

    With API keys every tenant's retention is the operator's decision, written where it is reviewed
    (the API-keys file's ``retention:``), under a key the operator generates, keeps and backs up; a
    flag that turned it on for every tenant, under a key made up on the spot, would decide neither.
    """
    if config.retain_inputs is None:
        return
    if not config.dev:
        raise ConfigurationError(
            "--retain-inputs is for --dev (one local tenant, an operator key generated in the data directory); "
            "with API keys give each tenant `retention: {inputs: 7d}` in the API-keys file and the server a "
            "real operator key: --set retention.operator_key_file=FILE (docs/retention.md)"
        )
    if config.retain_inputs_s > config.retention.max_inputs_s:
        raise ConfigurationError(
            f"--retain-inputs {config.retain_inputs} is longer than retention.max_inputs_s "
            f"({config.retention.max_inputs_s:g} s): give a shorter duration or raise that setting"
        )


def check_process_sandbox_allowed(config: ServerConfig) -> None:
    """With API keys (several tenants), custom code in the weaker process sandbox is an opt-in.

    A RestrictedPython or kernel escape there reaches the server's user, so an operator must
    say so explicitly (``--allow-process-sandbox``); ``--dev`` (one local tenant) may use it.
    """
    if not config.dev and not config.allow_process_sandbox:
        raise ConfigurationError(
            "custom code would run in the process sandbox, which isolates tenants less than docker "
            "(no container: a RestrictedPython or kernel escape reaches the server's user); start a "
            "Docker daemon, or accept this with --allow-process-sandbox"
        )


def secure_data_dir(data_dir: Path) -> None:
    """The data directory 0700 and everything in it 0600 (dirs 0700), whatever the umask.

    It holds every tenant's uploaded code, policies and audit log; an operator's laxer umask,
    or an older install, must not leave it readable by other local users.
    """
    data_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    data_dir.chmod(PRIVATE_DIR_MODE)
    for n, path in enumerate(data_dir.rglob("*")):
        if n >= MAX_DATA_DIR_ENTRIES_FIXED:
            log.warning("data directory %s: stopped fixing permissions after %d entries", data_dir, n)
            break
        with contextlib.suppress(OSError):
            if path.is_symlink():
                continue
            path.chmod(PRIVATE_DIR_MODE if path.is_dir() else PRIVATE_FILE_MODE)


def lock_data_dir(data_dir: Path) -> Any:
    """One server per data directory: an exclusive ``flock`` (released when the process dies)."""
    import fcntl

    try:
        secure_data_dir(data_dir)
        fd = os.open(data_dir / "server.lock", os.O_CREAT | os.O_WRONLY | os.O_APPEND, PRIVATE_FILE_MODE)
    except OSError as e:
        raise ConfigurationError(f"cannot use data directory {data_dir}: {e.strerror}") from None
    fh = os.fdopen(fd, "a")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise ConfigurationError(f"another crossaudit server is using data directory {data_dir}") from None
    return fh


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigurationError(f"cannot read {what} {path}: {e.strerror}") from None


def policy_files(directory: Path | None) -> list[tuple[str, str]]:
    """``policies/*.yaml`` (and .yml) as (filename, text), sorted. They are the operator's files:
    their ``code_file`` and ``evaluators/<name>.py`` are inlined here, as the CLI does, because
    the service itself never reads a file that a policy names."""
    from orchestrator.policy.inline import inline_local_code

    if directory is None or not Path(directory).is_dir():
        return []
    out = []
    for p in sorted([*Path(directory).glob("*.yaml"), *Path(directory).glob("*.yml")]):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = p.read_text(encoding="utf-8")
            with contextlib.suppress(CrossAuditError):  # left as is: the deploy reports the problem
                text = inline_local_code(text, p.parent).text
            out.append((p.name, text))
    return out


def _log_grants(grants: TenantGrants, tenants: list[str]) -> None:
    """Names and sources of each tenant's secrets (never values); unavailable ones as warnings."""
    if grants.development:
        log.info("dev mode: ${NAME} in policies reads this process's environment")
        return
    for tenant in tenants:
        names = grants.secrets.get(tenant, {})
        if names:
            log.info("tenant %s is granted secrets: %s", tenant, grants.describe(tenant))
        source = grants.source(tenant)
        for name in names:
            source.get(name)  # logs a warning naming the secret and its source when unavailable
        hosts = grants.hosts(tenant)
        allowed = ", ".join(hosts.patterns) if hosts else "the providers' default endpoints only"
        log.info("tenant %s: LLM base_url hosts: %s", tenant, allowed)


@dataclass(frozen=True)
class WorkerRole:
    """What a worker of ``serve --workers N`` is told (crossaudit.service.workers): its index and
    the shared slots where it counts its decisions in flight (read by the supervisor if it dies).
    A worker shares the port (SO_REUSEPORT) and the store, and takes no data-dir lock (its
    supervisor holds it)."""

    index: int
    inflight: Any
    console_socket: Any = None  # worker 0: the review console's listening socket, the supervisor's


@dataclass
class RunningServer:
    config: ServerConfig
    server: grpc.aio.Server
    port: int
    service: CrossAuditService
    store: Store
    sandbox: Sandbox | None
    health: health.aio.HealthServicer
    metrics: ServiceMetrics
    metrics_port: int | None = None
    model_backend: Any = None
    auth: Authenticator | None = None
    owned: list[Any] = field(default_factory=list)
    warmer: asyncio.Task[int] | None = None
    lock: Any = None
    console: Any = None  # the review console (crossaudit.console.ConsoleServer), if served
    store_health: StoreHealth | None = None  # health follows the store (NOT_SERVING while unreachable)
    tracing: Tracing = field(default_factory=Tracing)  # the tracer provider this process set, if any
    _stopped: bool = False

    @property
    def address(self) -> str:
        return host_port(self.config.host, self.port)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful: NOT_SERVING, finish in-flight calls (up to ``grace`` s), release everything."""
        if self._stopped:
            return
        self._stopped = True
        if self.warmer is not None and not self.warmer.done():
            self.warmer.cancel()
            with contextlib.suppress(BaseException):
                await self.warmer
        grace = self.config.limits.shutdown_grace_s if grace is None else grace
        if self.store_health is not None:
            await self.store_health.stop()
        if self.console is not None:
            await self.console.stop()
        with contextlib.suppress(Exception):
            await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await self.service.aclose()
        for closer in self.owned:  # what start_server built (not what was injected)
            try:
                await closer.aclose()
            except Exception:
                log.exception("closing %s failed", type(closer).__name__)
        await self.store.aclose()
        self.metrics.close()
        if self.lock is not None:
            self.lock.close()
        await asyncio.to_thread(self.tracing.shutdown)  # the spans still queued are exported

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def start_server(
    config: ServerConfig,
    *,
    engines: EngineProvider | None = None,
    sandbox: Sandbox | None = None,
    store: Store | None = None,
    auth: Authenticator | None = None,
    engine_limits: EngineLimits | None = None,
    worker: WorkerRole | None = None,
) -> RunningServer:
    """Start serving (returns once the port is bound). Injected parts are not closed by stop()
    except the store; parts built here (sandbox, model pool) are.

    The steps, in order: check the configuration, authenticate (keys file or --dev), open the
    store (locking the data directory), build the engines (sandbox, model servers), the service,
    the gRPC server, bind its port, then start what runs beside it (metrics, console, first
    deploys, delivery, health)."""
    check_config(config)
    tracer = configure_tracing(config.tracing, engine_version())  # before anything makes a span
    if auth is None:
        auth = build_authenticator(config)
    grants = auth.grants.with_hosts(config.llm_base_url_hosts)
    _log_grants(grants, auth.tenants)
    lock = None
    if store is None and worker is not None:
        store = open_config_store(config, owner=False)
    elif store is None:
        lock, store = open_locked_store(config)
    try:
        config = with_dev_operator_key(config)  # after the lock: the data directory is private by now
        evidence = build_evidence(config.evidence, store, Path(config.data_dir), shared_store=bool(config.store_url))
    except BaseException:
        await _close_owned_store(store, lock)
        raise
    metrics = ServiceMetrics(config.metrics_limits, config.llm_prices)
    if worker is not None:
        metrics.count_inflight_in(worker.inflight, worker.index)
    built = Engines(engines, sandbox)
    if engines is None:
        try:
            built = await build_engines(config, store, grants, metrics, sandbox=sandbox, engine_limits=engine_limits)
        except BaseException:
            await _close_owned_store(store, lock)
            raise
    if built.sandbox is not None:
        metrics.watch_sandbox(built.sandbox.info)
    service = build_service(
        config, store, built.engines, built.sandbox, metrics, grants, evidence, model_backend=built.model_backend
    )
    server, names, health_servicer = build_grpc_server(config, service, auth, reuse_port=worker is not None)
    port = bind(config, server)
    if not port:
        await store.aclose()
        if lock is not None:
            lock.close()
        address = host_port(config.host, config.port)
        raise ConfigurationError(f"cannot listen on {address} (in use, or not a local address)")
    await server.start()
    running = RunningServer(
        config,
        server,
        port,
        service,
        store,
        built.sandbox,
        health_servicer,
        metrics,
        model_backend=built.model_backend,
        auth=auth,
        owned=built.owned,
        lock=lock,
        tracing=tracer,
    )
    try:
        await start_beside(running, names, worker.console_socket if worker is not None else None)
    except BaseException:
        await running.stop(0)
        raise
    return running


async def _close_owned_store(store: Store, lock: Any) -> None:
    """A start that failed closes the store it opened here (with the data directory's lock), never an injected one."""
    if lock is not None:
        await store.aclose()
        lock.close()


def build_authenticator(config: ServerConfig) -> Authenticator:
    """--dev: one tenant, no keys; else the API-keys file."""
    if config.dev:
        return Authenticator.dev_mode(retention_s=config.retain_inputs_s)
    return Authenticator.from_file(config.api_keys_file, config.limits)  # type: ignore[arg-type]


def open_locked_store(config: ServerConfig) -> tuple[Any, Store]:
    """Lock the data directory, then open the store: PostgreSQL when ``store_url`` names one, else
    SQLite in the data directory. One server per data directory (the SQLite file, the model
    store); replicas sharing a PostgreSQL store each have their own."""
    lock = lock_data_dir(config.data_dir)
    try:
        return lock, open_config_store(config)
    except BaseException:
        lock.close()
        raise


def open_config_store(config: ServerConfig, *, owner: bool = True) -> Store:
    """The store ``config`` names. ``owner``: this process alone serves the data dir (a worker of
    ``serve --workers N`` is not: its siblings' outbox leases are alive)."""
    if config.store_url:
        return open_store(config.store_url, postgres_limits=config.postgres_limits)
    return SQLiteStore(
        config.database_path, synchronous=config.store_synchronous, release_leases=owner, shared=not owner
    )


@dataclass
class Engines:
    """What :func:`build_engines` made: the engines, the sandbox they run custom code in, the model
    pool, and the parts the server owns (closed by ``stop``)."""

    engines: EngineProvider | None
    sandbox: Sandbox | None
    model_backend: Any = None
    owned: list[Any] = field(default_factory=list)


async def build_engines(
    config: ServerConfig,
    store: Store,
    grants: TenantGrants,
    metrics: ServiceMetrics,
    *,
    sandbox: Sandbox | None = None,
    engine_limits: EngineLimits | None = None,
) -> Engines:
    """The real engines: a sandbox (unless one is injected), the model server pool, one engine per
    tenant over both. A sandbox built here that fell back to the process backend where it is not
    allowed is closed again and the start refused."""
    owned: list[Any] = []
    if sandbox is None:
        from orchestrator.runtime import make_sandbox

        sandbox = make_sandbox(
            config.sandbox,
            config.sandbox_limits,
            pool_limits=config.pool_limits,
            dep_limits=config.dependency_limits,
            channel=config.docker_channel,
        )
        owned.append(sandbox)
        if sandbox.name == "process":  # "auto" fell back: no Docker daemon answered
            try:
                check_process_sandbox_allowed(config)
            except ConfigurationError:
                await sandbox.aclose()
                raise
    from crossaudit.modelserver.pool import ModelServerPool

    model_backend = ModelServerPool(config.model_server_limits, isolation=config.model_servers)
    owned.append(model_backend)
    # Replicas sharing a PostgreSQL store, and the workers of `serve --workers N` on either
    # store, share their rate_limit buckets through it.
    limiters = store_limiters(store) if config.store_url or config.worker_count > 1 else None
    engines = runtime_engines(
        sandbox,
        model_backend=model_backend,
        limits=engine_limits or config.engine_limits,
        grants=grants,
        limiters=limiters,
        llm_usage=metrics.llm_usage,
    )
    return Engines(engines, sandbox, model_backend, owned)


def build_service(
    config: ServerConfig,
    store: Store,
    engines: EngineProvider | None,
    sandbox: Sandbox | None,
    metrics: ServiceMetrics,
    grants: TenantGrants,
    evidence: EvidenceLog | None = None,
    *,
    model_backend: Any = None,
) -> CrossAuditService:
    """The service behind every servicer: store, engines, audit, delivery; ``model_backend``: the
    builtins' model servers, which a deploy starts before it answers."""
    return CrossAuditService(
        store,
        engines,  # type: ignore[arg-type]
        sandbox=sandbox,
        model_backend=model_backend,
        limits=config.limits,
        metrics=metrics,
        audit_raw_text=config.audit_raw_text,
        grants=grants,
        dependency_limits=config.dependency_limits,
        rollout_limits=config.rollout_limits,
        delivery=DeliveryConfig(
            decision_log_url=config.decision_log_url,
            decision_log_dir=config.decision_log_dir,
            limits=config.delivery_limits,
        ),
        retention=config.retention,
        evidence=evidence,
        data_dir=Path(config.data_dir),
    )


def build_grpc_server(
    config: ServerConfig, service: CrossAuditService, auth: Authenticator, *, reuse_port: bool = False
) -> tuple[grpc.aio.Server, list[str], HealthServicer]:
    """The grpc.aio server with the service's servicers, health and reflection (not yet bound).
    ``reuse_port``: a worker of ``serve --workers N``, sharing the port with its siblings; else a
    second server on a port in use fails to bind rather than sharing it unnoticed."""
    limits = config.limits
    options = [
        # above the named limit: the handler's refusal names it (crossaudit.service.decoding)
        ("grpc.max_receive_message_length", limits.max_request_bytes + TRANSPORT_MARGIN_BYTES),
        ("grpc.max_send_message_length", limits.max_send_message_bytes),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]
    # No server interceptors: they put every call on grpc.aio's slow dispatch path. Calls are
    # authorized by the handler wrappers add_servicers installs (crossaudit.service.decoding).
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=limits.max_concurrent_rpcs)
    names = add_servicers(server, service, auth)
    health_servicer = HealthServicer()  # Check, Watch and List (the library's lacks List)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    return server, names, health_servicer


def bind(config: ServerConfig, server: grpc.aio.Server) -> int:
    """Bind the gRPC port (TLS when a certificate and key are given); 0 when it cannot be bound."""
    address = host_port(config.host, config.port)
    try:
        if config.tls_cert and config.tls_key:
            creds = grpc.ssl_server_credentials(
                [(_read(config.tls_key, "TLS key"), _read(config.tls_cert, "TLS cert"))]
            )
            return server.add_secure_port(address, creds)
        return server.add_insecure_port(address)
    except RuntimeError as e:
        log.debug("bind failed: %s", e)
        return 0


async def start_beside(running: RunningServer, names: list[str], console_socket: Any = None) -> None:
    """What runs beside the gRPC port once it serves: metrics, the review console (on
    ``console_socket`` when a supervisor holds it), the first start's deploys, warming, delivery,
    and health following the store."""
    config, service, auth = running.config, running.service, running.auth
    assert auth is not None
    if config.metrics_port is not None:
        running.metrics_port = running.metrics.serve(config.metrics_host, config.metrics_port)
    if config.console_listen_port is not None:
        # before the first start's deploys (which may build images): a busy port fails at once
        from crossaudit.console import start_console

        running.console = await start_console(
            config, service.records, auth, service.rollout, service.labels, sock=console_socket
        )
    problems = await service.bootstrap(auth.tenants, policy_files(config.policies_dir), DEFAULT_ENVIRONMENT)
    for line in problems:
        log.warning("%s", line)
    running.warmer = asyncio.create_task(service.warm(auth.tenants), name="warm-deployed-policies")
    service.start()  # webhook and decision-log delivery: messages a previous run left are sent now
    for name in ["", *names, LIVENESS_SERVICE]:
        await running.health.set(name, health_pb2.HealthCheckResponse.SERVING)
    running.store_health = StoreHealth(
        running.health,
        running.store,
        ["", *names],
        interval_s=config.limits.store_check_interval_s,
        timeout_s=config.limits.store_check_timeout_s,
    )
    running.store_health.start()


def where_data_lives(config: ServerConfig) -> str:
    """The store of the start line: the SQLite file, or the PostgreSQL URL with its password masked."""
    if config.store_url:
        return mask_url(config.store_url)
    return f"sqlite {Path(config.database_path).resolve()}"


def sandbox_backend(running: RunningServer) -> str | None:
    """The sandbox backend for the start line; the process sandbox's weaker isolation is logged."""
    info = running.sandbox.info() if running.sandbox is not None else {}
    backend = info.get("backend", "?") if info else None
    if backend == "process":
        log.warning("custom code runs in the process sandbox (weaker isolation): %s", info.get("isolation", ""))
    return backend


def start_line(
    config: ServerConfig,
    port: int,
    tenants: int,
    sandbox: str | None,
    console_url: str | None,
    metrics_port: int | None,
    workers: int = 1,
) -> str:
    """The line a started server prints (tests and scripts read the address from its 4th word)."""
    parts = [f"crossaudit serving on {host_port(config.host, port)}"]
    parts.append("tls" if config.tls_cert else "plaintext")
    parts.append("dev: tenant 'default', no keys" if config.dev else f"{tenants} tenant(s)")
    if workers > 1:
        parts.append(f"workers {workers}")
    if sandbox:
        parts.append(f"sandbox {sandbox}" + (" (WEAKER isolation than docker)" if sandbox == "process" else ""))
    unsigned = unsigned_log(config.evidence, shared_store=bool(config.store_url))
    if unsigned is not None:
        parts.append(unsigned)
    parts.append(f"data dir {Path(config.data_dir).resolve()}")
    parts.append(f"store {where_data_lives(config)}")
    if console_url is not None:
        parts.append(f"review console on {console_url}")
        if config.dev:
            parts.append("console sign-in: any string (--dev)")
    if metrics_port is not None:
        parts.append(f"metrics on {host_port(config.metrics_host, metrics_port)}")
    return ", ".join(parts)
