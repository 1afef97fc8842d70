"""``crossaudit serve --workers N``: N server processes on one port, supervised.

One Python process serves on about one core (the GIL), so N > 1 runs N servers, as gRPC's
``multiprocessing`` example does: this process, the supervisor, holds the data-dir lock, opens the
store once (migrations, the generated evidence key, the outbox leases a previous run left),
reserves the port with an ``SO_REUSEPORT`` socket (port 0 resolved to a real one, kept bound) and
starts the workers with the ``spawn`` start method (a fresh interpreter: nothing forked with
threads or event loops). Each worker runs the whole server on that port with ``grpc.so_reuseport``
and the kernel spreads new connections over them.

Across processes (docs/service.md, "Workers"): the store is shared (SQLite in WAL mode, every
write a ``BEGIN IMMEDIATE`` transaction, a group commit per worker; or PostgreSQL) and every
worker is a replica of the store as PostgreSQL replicas are: deployments and candidates are
re-read after ``deployment_recheck_s``, log sequence numbers are taken inside the write
transaction, outbox messages are leased, rate_limit buckets live in the store. Worker 0 starts
first and alone deploys ``policies/*.yaml`` on a data dir's first start and serves the review
console; the supervisor serves ``/metrics`` for all (prometheus_client's multiprocess mode).

A worker that dies is restarted after a backoff; the decisions it had in flight (its slot of a
shared array) failed UNAVAILABLE at their callers and are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from crossaudit.governance.evidence import build_evidence
from crossaudit.governance.retention import with_dev_operator_key
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.service import metricsdir
from crossaudit.service.assembly import (
    WorkerRole,
    build_authenticator,
    check_config,
    host_port,
    open_locked_store,
    sandbox_backend,
    start_line,
    start_server,
)
from crossaudit.service.config import CONSOLE_OFF, ServerConfig
from crossaudit.service.metrics import WorkerMetrics

log = logging.getLogger("crossaudit.service.workers")

WORKER_POLL_S = 0.1  # how often the supervisor looks for a dead or ready worker
# how often a worker checks that its supervisor lives (an orphan stops) and copies its scrape-time
# metrics (sandbox pools, result caches) to the shared metrics directory
WORKER_TICK_S = 1.0
EXIT_WORKER_CONFIG = 3  # a worker's exit code when it could not start (a configuration problem)
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess directory
SANDBOX_NAME_BYTES = 32
# The signals that stop a supervisor gracefully (a second one: at once); it removes its metrics
# directory on the way out. SIGHUP too: a closed terminal is an exit it can see.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class _Worker:
    index: int
    process: BaseProcess | None = None
    started: float = 0.0  # monotonic, when it was started
    quick_deaths: int = 0  # deaths in a row before stable_after_s (the backoff's exponent)
    restart_at: float = 0.0  # monotonic, when a dead one is started again


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with ``SO_REUSEPORT``, not listening: it holds the port
    (port 0 resolved) for the workers, which bind it too. A port something already listens on
    is refused first: ``SO_REUSEPORT`` would otherwise share it with a stranger of this user."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {e}") from None
    family, _, _, _, addr = infos[0]
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(addr)
            except OSError:
                raise ConfigurationError(f"cannot listen on {host}:{port} (in use, or not a local address)") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port} (in use, or not a local address)") from None
    return sock


def describe_exit(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def worker_config(config: ServerConfig, index: int, port: int, console_port: int = 0) -> ServerConfig:
    """A worker's settings: the reserved port, no metrics port (the supervisor serves it), the
    console on worker 0 only (one port; ``console_port``: the one a previous worker 0 served on,
    so a restarted one keeps the address the start line printed)."""
    console = config.console_port if index == 0 else CONSOLE_OFF
    if index == 0 and config.console_default_port:
        console = config.console_listen_port  # --dev's default, resolved here: the worker has no --dev default
    if index == 0 and console_port and console != CONSOLE_OFF:
        console = console_port
    return dataclasses.replace(config, port=port, metrics_port=None, console_port=console)


class Supervisor:
    """Starts, watches and stops the workers (call from one event loop)."""

    def __init__(
        self,
        config: ServerConfig,
        port: int,
        metrics: WorkerMetrics,
        data_dir_lock: int = -1,
        metrics_dir_lock: int = -1,
    ) -> None:
        self.config = config
        self.data_dir_lock = data_dir_lock
        self.metrics_dir_lock = metrics_dir_lock
        self.count = config.worker_count
        self.port = port
        self.metrics = metrics
        self.limits = config.worker_limits
        self._ctx = multiprocessing.get_context("spawn")
        self.inflight: Any = self._ctx.RawArray("q", self.count)  # decisions in flight, per worker
        self.ready: Any = self._ctx.RawArray("b", self.count)  # 1 once a worker serves
        self.console_port: Any = self._ctx.RawArray("i", 1)  # worker 0's review console
        self.sandbox: Any = self._ctx.RawArray("c", SANDBOX_NAME_BYTES)  # worker 0's sandbox backend
        self.workers = [_Worker(i) for i in range(self.count)]
        self.stopping = False
        # The review console's listening socket, held here and lent to every worker 0: while a
        # dead worker 0 waits for its restart, connections queue in its backlog and no other
        # program can take the port the start line printed.
        self.console_socket: socket.socket | None = None

    def _start(self, w: _Worker) -> None:
        console = self.console_socket if w.index == 0 else None
        self.inflight[w.index] = 0
        self.ready[w.index] = 0
        w.process = self._ctx.Process(
            target=worker_main,
            args=(
                worker_config(self.config, w.index, self.port, self.console_port[0]),
                w.index,
                os.getpid(),
                (self.inflight, self.ready, self.console_port, self.sandbox),
                console,
                InheritedFd(self.data_dir_lock) if self.data_dir_lock >= 0 else None,
                InheritedFd(self.metrics_dir_lock) if self.metrics_dir_lock >= 0 else None,
            ),
            name=f"crossaudit-worker-{w.index}",
        )
        w.process.start()
        w.started = time.monotonic()

    async def _until_ready(self, w: _Worker) -> None:
        deadline = time.monotonic() + self.limits.start_timeout_s
        while not self.ready[w.index]:
            assert w.process is not None
            if w.process.exitcode is not None:
                raise ConfigurationError(
                    f"worker {w.index} could not start ({describe_exit(w.process.exitcode)}; its log says why)"
                )
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"worker {w.index} did not serve within worker_limits.start_timeout_s "
                    f"({self.limits.start_timeout_s:g} s)"
                )
            await asyncio.sleep(WORKER_POLL_S)

    async def start(self) -> None:
        """Worker 0 first (it alone deploys policies/*.yaml on a data dir's first start, so no
        sibling answers before they are deployed), then the others together."""
        first, *rest = self.workers
        if self.config.console_listen_port is not None:
            from crossaudit.console import bind_console

            self.console_socket = bind_console(self.config)
            self.console_port[0] = self.console_socket.getsockname()[1]
        self._start(first)
        await self._until_ready(first)
        for w in rest:
            self._start(w)
        for w in rest:
            await self._until_ready(w)
        self.metrics.live.set(self.count)

    def check(self) -> None:
        """Restart the workers that died (after their backoff)."""
        now = time.monotonic()
        for w in self.workers:
            if w.process is not None and w.process.exitcode is not None:
                self._died(w, now)
            elif w.process is not None and not self.ready[w.index] and now - w.started > self.limits.start_timeout_s:
                log.error(
                    "worker %d (pid %s) did not serve within worker_limits.start_timeout_s (%g s): killed",
                    w.index,
                    w.process.pid,
                    self.limits.start_timeout_s,
                )
                w.process.kill()  # its death is handled (and backed off) on the next check
            elif w.process is None and now >= w.restart_at and not self.stopping:
                self.metrics.restarts.inc()
                self._start(w)
        self.metrics.live.set(sum(1 for w in self.workers if w.process is not None and self.ready[w.index]))

    def _died(self, w: _Worker, now: float) -> None:
        assert w.process is not None
        pid, code = w.process.pid, w.process.exitcode
        lost = max(0, int(self.inflight[w.index]))
        self.inflight[w.index] = 0
        self.ready[w.index] = 0
        if lost:
            self.metrics.lost_calls.inc(lost)
        if pid is not None:
            self.metrics.worker_died(pid)
        w.process.close()
        w.process = None
        w.quick_deaths = 0 if now - w.started >= self.limits.stable_after_s else w.quick_deaths + 1
        delay = min(self.limits.restart_backoff_s * 2 ** max(0, w.quick_deaths - 1), self.limits.restart_backoff_max_s)
        w.restart_at = now + delay
        log.error(
            "worker %d (pid %s) died: %s; %d decision(s) in flight lost (UNAVAILABLE to their callers); "
            "restarting it in %.1f s",
            w.index,
            pid,
            describe_exit(code),
            lost,
            delay,
        )

    async def stop(self, force: asyncio.Event) -> None:
        """SIGTERM every worker (each drains its calls: limits.shutdown_grace_s), then wait for
        them; at ``force`` (a second signal) or past the margin, SIGKILL."""
        self.stopping = True
        live = [w.process for w in self.workers if w.process is not None and w.process.exitcode is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + self.config.limits.shutdown_grace_s + self.limits.stop_margin_s
        while any(p.exitcode is None for p in live) and not force.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(WORKER_POLL_S)
        for p in live:
            if p.exitcode is None:
                log.warning("worker pid %s did not stop in time: killed", p.pid)
                p.kill()
        for p in live:
            p.join()
            self.metrics.worker_died(p.pid)  # type: ignore[arg-type]
        self.metrics.live.set(0)
        if self.console_socket is not None:
            self.console_socket.close()
            self.console_socket = None


def _console_url(config: ServerConfig, port: int) -> str | None:
    """Worker 0's review console, as its start line would say it (TLS with the gRPC port's)."""
    if not port:
        return None
    return f"{'https' if config.tls_cert else 'http'}://{host_port(config.console_host, port)}"


async def supervise(config: ServerConfig, *, announce: Any = print) -> None:
    """Run ``config.worker_count`` workers until SIGINT/SIGTERM, then drain them (a second
    signal kills them at once)."""
    check_config(config)
    if config.worker_count > config.worker_limits.max_workers:
        raise ConfigurationError(
            f"workers {config.worker_count} is more than worker_limits.max_workers ({config.worker_limits.max_workers})"
        )
    tenants = len(build_authenticator(config).tenants)
    lock, store = open_locked_store(config)  # migrations and the previous run's leases, once
    directory = None
    reserved = None
    try:
        try:
            with_dev_operator_key(config)  # made once here (the workers find it), like the evidence key
            build_evidence(config.evidence, store, Path(config.data_dir), shared_store=bool(config.store_url))
        finally:
            await store.aclose()
        reserved = reserve_port(config.host, config.port)
        port = reserved.getsockname()[1]
        metricsdir.sweep()  # the directories of supervisors killed before they could remove theirs
        directory = metricsdir.create()  # 0700, this start's alone, locked while it or a worker lives
        metrics = WorkerMetrics(directory.path)  # the supervisor's own values stay in memory (imported before)
        os.environ[METRICS_ENV] = directory.path  # the workers' (spawned: a fresh import) go to files
        supervisor = Supervisor(config, port, metrics, data_dir_lock=lock.fileno(), metrics_dir_lock=directory.lock_fd)
        stop, force = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, lambda: force.set() if stop.is_set() else stop.set())
        try:
            await _run(supervisor, config, stop, force, announce, tenants, port)
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            metrics.close()
    finally:
        if reserved is not None:
            reserved.close()
        if directory is not None:
            os.environ.pop(METRICS_ENV, None)
            directory.remove()
        lock.close()


async def _run(
    supervisor: Supervisor,
    config: ServerConfig,
    stop: asyncio.Event,
    force: asyncio.Event,
    announce: Any,
    tenants: int,
    port: int,
) -> None:
    try:
        starting = asyncio.ensure_future(supervisor.start())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            return
        starting.result()  # a worker that could not start fails the start
        metrics_port = None
        if config.metrics_port is not None:
            metrics_port = supervisor.metrics.serve(config.metrics_host, config.metrics_port)
        sandbox = bytes(supervisor.sandbox.value).decode("ascii", "replace") or None
        console = _console_url(config, supervisor.console_port[0])
        announce(
            start_line(config, port, tenants, sandbox, console, metrics_port, workers=supervisor.count), flush=True
        )
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WORKER_POLL_S)
            supervisor.check()
        announce("crossaudit shutting down", flush=True)
    finally:
        await supervisor.stop(force)


# --- in the worker process ------------------------------------------------------------------------


class InheritedFd:
    """A file descriptor a spawned worker inherits (multiprocessing duplicates it into the child,
    as it does for sockets); in the child it unpickles to the descriptor's number."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        from multiprocessing.reduction import DupFd

        return _inherited, (DupFd(self.fd),)


def _inherited(dup: Any) -> int:
    fd = int(dup.detach())
    os.set_inheritable(fd, False)  # passed to this process only: no sandbox or helper it starts gets it
    return fd


def worker_main(
    config: ServerConfig,
    index: int,
    supervisor_pid: int,
    shared: tuple[Any, Any, Any, Any],
    console_socket: socket.socket | None = None,
    data_dir_lock: int | None = None,
    metrics_dir_lock: int | None = None,
) -> None:
    """A worker's process (spawned): serve until SIGTERM/SIGINT or the supervisor is gone.
    ``data_dir_lock``: the supervisor's locked file, kept open here (the flock is the open file's,
    so it stays held while any worker lives: a supervisor killed with SIGKILL frees the data dir
    only once its workers have drained, never to a new server while they still deliver).
    ``metrics_dir_lock``: likewise the lock of the metrics directory this worker writes to
    (:mod:`crossaudit.service.metricsdir`): no new supervisor removes it while this one lives."""
    del data_dir_lock, metrics_dir_lock  # held, never used, until this process exits
    from crossaudit.service.logs import configure_logging

    configure_logging(config.log_level, config.log_format, worker=index)
    try:
        asyncio.run(_serve_worker(config, index, supervisor_pid, shared, console_socket))
    except ConfigurationError as e:
        log.error("worker %d: %s", index, e)
        sys.exit(EXIT_WORKER_CONFIG)
    except KeyboardInterrupt:
        sys.exit(130)


async def _serve_worker(
    config: ServerConfig,
    index: int,
    supervisor_pid: int,
    shared: tuple[Any, Any, Any, Any],
    console_socket: socket.socket | None,
) -> None:
    inflight, ready, console_port, sandbox = shared
    if console_socket is not None:
        console_socket.set_inheritable(False)  # inherited for this process only, never its children
    running = await start_server(config, worker=WorkerRole(index, inflight, console_socket))
    gc.freeze()  # as serve(): what start-up built stays out of the collector's generations
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if index == 0:
        if running.console is not None:
            console_port[0] = running.console.port
        backend = sandbox_backend(running)
        if backend:
            sandbox.value = backend.encode()[: SANDBOX_NAME_BYTES - 1]
    copy_metrics = running.metrics.shared_copy()
    ready[index] = 1
    log.info("worker %d (pid %d) serving", index, os.getpid())
    try:
        while not stop.is_set():
            copy_metrics()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WORKER_TICK_S)
            if os.getppid() != supervisor_pid:
                log.error("worker %d: the supervisor is gone; stopping", index)
                break
    finally:
        await running.stop()
