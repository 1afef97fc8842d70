"""The Docker sandbox backend: hardened containers, per-dependency-set images, warm pools.

Lifecycle (see ``docs/sandbox-docker.md``):

* ``DockerSandbox.available()`` — does a daemon answer (cheap, for picking a backend).
* ``await prepare(bundle, progress)`` — validates code and dependencies, finds or builds the
  images (streaming progress), starts the bundle's warm pool and waits until one container
  has loaded the code (so load errors surface here). Idempotent; the slow path of uploads.
* ``await run(bundle, ...)`` — a warm call. Never builds: an unprepared bundle whose image
  exists gets a cold container (~1 s); one whose image is missing is a ConfigurationError.
* ``await aclose()`` — removes every container this instance started.

All docker-py calls are blocking and go through one bounded ThreadPoolExecutor; the warm
path itself (frame over the attach socket) is pure asyncio.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from crossaudit.imagebuild.daemon import DEFAULT_TIMEOUT_S, docker_answers
from crossaudit.imagebuild.daemon import docker_client as imagebuild_client
from crossaudit.kernel.codecheck import check_code
from crossaudit.kernel.depspec import Dependency, validate_dependencies
from crossaudit.kernel.errors import (
    ConfigurationError,
    CrossAuditError,
    EvaluatorTimeoutError,
    EvaluatorUnavailableError,
    InvalidInputError,
)
from crossaudit.kernel.limits import DependencyLimits, PoolLimits, SandboxLimits
from crossaudit.kernel.progress import ProgressCallback
from sandbox.base import CodeBundle, RunDiagnostics, Sandbox
from sandbox.docker.container import DEFAULT_ENV, ContainerRuntime, check_env, reap_channel_dirs
from sandbox.docker.images import DepsImage, ImageManager
from sandbox.docker.pool import ContainerPool
from sandbox.docker.reaper import reap

log = logging.getLogger(__name__)

MAINTAIN_INTERVAL_S = 1.0  # janitor period: dead/idle containers, refills, pool eviction


CHANNELS = ("auto", "socket", "attach")
DOCKER_POOL_SIZE = 32  # connections docker-py keeps to the daemon
LOCAL_DAEMON_URL = "http+docker://localhost"  # docker-py's base_url for a unix-socket daemon


def socket_channel_possible(client: Any) -> bool:
    """Whether containers can be given a socket of ours: the daemon is on this machine (a unix
    socket) and maps uids as we do (not rootless, no userns-remap). A containerized orchestrator
    passes this check yet its paths are not the daemon's: the first container then finds no
    socket and the backend falls back to attach (:meth:`WarmContainer.start`)."""
    if getattr(client.api, "base_url", "") != LOCAL_DAEMON_URL:
        return False
    try:
        options = " ".join(client.info().get("SecurityOptions") or [])
    except Exception:
        return False
    return "name=rootless" not in options and "name=userns" not in options


def cgroup_driver(client: Any) -> str:
    """The daemon's cgroup driver when containers can be given a parent of their tenant's, else ''.
    Not for a rootless daemon: its cgroups are delegated to one user, and a parent it may not
    create would fail every container."""
    try:
        info = client.info()
    except Exception:
        return ""
    if "name=rootless" in " ".join(info.get("SecurityOptions") or []):
        return ""
    driver = str(info.get("CgroupDriver") or "")
    return driver if driver in {"cgroupfs", "systemd"} else ""


def docker_client(timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """A docker-py client from the environment (``DOCKER_HOST`` or the local socket), with room for
    the executor's threads; :meth:`DockerSandbox.start` pings it."""
    return imagebuild_client(timeout, purpose="the docker sandbox", ping=False, max_pool_size=DOCKER_POOL_SIZE)


class DockerSandbox(Sandbox):
    """Runs custom evaluators in hardened, pooled Docker containers (see module docstring)."""

    name: ClassVar[str] = "docker"
    isolation: ClassVar[str] = (
        "docker: separate containers per tenant and evaluator version; no network, read-only root, all "
        "capabilities dropped, no-new-privileges, non-root, memory/pids/CPU/files/tmpfs caps; fresh process "
        "per call, and every process, scratch file and IPC object of a call removed before the next"
    )

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        pool_limits: PoolLimits | None = None,
        dep_limits: DependencyLimits | None = None,
        cache_dir: Path | str | None = None,
        base_image: str | None = None,
        env: Mapping[str, str] | None = None,
        client: Any = None,
        channel: str = "auto",
    ) -> None:
        """``channel``: how frames reach the agents: ``socket`` (a private unix socket per
        container), ``attach`` (the container's attach stream, through the daemon), or ``auto``
        (socket where the daemon is local and binds our paths, else attach)."""
        if channel not in CHANNELS:
            raise ConfigurationError(f"channel must be one of {', '.join(CHANNELS)}, not {channel!r}")
        super().__init__(limits)
        self.channel = channel
        self.pool_limits = pool_limits or PoolLimits()
        self.dep_limits = dep_limits or DependencyLimits()
        self._client = client
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._base_image = base_image
        self._env = check_env(dict(DEFAULT_ENV) if env is None else env)
        self._executor = ThreadPoolExecutor(max_workers=self.pool_limits.docker_threads, thread_name_prefix="docker")
        # Not a cachetools LRU (crossaudit.kernel.lru): only idle pools are evicted (_evict), so
        # the map may exceed max_pools while every pool is busy; cachetools evicts before storing
        # until the new item fits and cannot skip or wait for busy entries.
        self._pools: collections.OrderedDict[str, ContainerPool] = collections.OrderedDict()
        self._images: ImageManager | None = None
        self._rt: ContainerRuntime | None = None
        self._start_lock: asyncio.Lock | None = None
        self._janitor: asyncio.Task[None] | None = None
        self._prepare_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._closed = False
        self.reaped = 0

    # --- discovery -----------------------------------------------------------------------------

    @staticmethod
    def available(timeout: float = 2.0) -> bool:
        """True when a Docker daemon answers a ping within ``timeout`` (used to pick the backend)."""
        return docker_answers(timeout)

    async def _blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def _docker(self, fn: Any, *args: Any) -> Any:
        """A blocking image operation; daemon/transport failures become typed, retryable errors."""
        try:
            return await self._blocking(fn, *args)
        except CrossAuditError:
            raise
        except Exception as exc:  # docker.errors.*, requests' connection errors, OSError
            raise EvaluatorUnavailableError(f"docker daemon error: {type(exc).__name__}: {exc}") from None

    async def start(self) -> None:
        """Connect, reap leftovers of dead orchestrators, start the janitor. Called lazily."""
        if self._rt is not None:
            return
        if self._closed:
            raise ConfigurationError("docker sandbox is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._rt is not None:
                return
            try:
                client = self._client or await self._blocking(docker_client)
                await self._blocking(client.ping)
            except Exception as exc:
                raise ConfigurationError(f"the docker sandbox needs a Docker daemon: {exc}") from None
            self._client = client
            self.reaped = await self._blocking(reap, client)
            await self._blocking(reap_channel_dirs)  # those of orchestrators killed mid-start
            if self.reaped:
                log.info("removed %d leftover sandbox container(s)", self.reaped)
            self._images = ImageManager(
                client, cache_dir=self._cache_dir, dep_limits=self.dep_limits, base_image=self._base_image
            )
            self._rt = ContainerRuntime(client, self._executor, self.limits, self.pool_limits, self._env)
            if self.limits.tenant_cpu_groups:
                self._rt.cgroup_driver = await self._blocking(cgroup_driver, client)
            self._rt.socket_channel = self.channel == "socket" or (
                self.channel == "auto" and await self._blocking(socket_channel_possible, client)
            )
            self._janitor = asyncio.get_running_loop().create_task(self._maintain_forever())

    async def _maintain_forever(self) -> None:
        while not self._closed:  # lives as long as the backend; cancelled by aclose()
            await asyncio.sleep(MAINTAIN_INTERVAL_S)
            for pool in list(self._pools.values()):
                try:
                    await pool.maintain()
                except Exception as exc:  # keep maintaining the others
                    log.warning("pool maintenance failed: %s", exc)

    # --- bundles -------------------------------------------------------------------------------

    def _validate(self, bundle: CodeBundle) -> tuple[Dependency, ...]:
        if bundle.language.lower() != "python":
            raise InvalidInputError(f"custom evaluators must be python, not {bundle.language!r}")
        check_code(bundle.code, entrypoint=bundle.entrypoint, limits=self.limits)
        return validate_dependencies(bundle.dependencies, self.dep_limits)

    def _pool_for(self, bundle: CodeBundle, image: DepsImage) -> ContainerPool:
        pool = self._pools.get(bundle.pool_key)
        same = pool is not None and pool.image == image.tag and pool.provenance.get("image_id", "") == image.image_id
        if pool is not None and same and not pool.closed:
            self._pools.move_to_end(bundle.pool_key)
            return pool
        assert self._rt is not None
        if pool is not None:  # the image changed (agent/runner rebuilt): start over
            self._close_later(pool)
        pool = ContainerPool(self._rt, bundle, image.tag, image.preload, image.provenance())
        self._pools[bundle.pool_key] = pool
        self._evict()
        return pool

    def _evict(self) -> None:
        """Close least recently used idle pools beyond ``max_pools``."""
        excess = len(self._pools) - self.pool_limits.max_pools
        for digest, pool in list(self._pools.items()):
            if excess <= 0:
                break
            if not pool.busy and not pool.waiting:
                del self._pools[digest]
                self._close_later(pool)
                excess -= 1

    def _close_later(self, pool: ContainerPool) -> None:
        task = asyncio.get_running_loop().create_task(pool.close())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def prepare(self, bundle: CodeBundle, progress: ProgressCallback | None = None) -> None:
        """Validate, build/find images (streamed progress), warm the pool. Idempotent."""
        say = _threadsafe(progress)
        deps = self._validate(bundle)
        await self.start()
        assert self._images is not None
        lock = self._prepare_locks.get(bundle.pool_key)  # one prepare per bundle at a time; freed when unused
        if lock is None:
            lock = self._prepare_locks[bundle.pool_key] = asyncio.Lock()
        async with lock:
            say("checking sandbox images", 0.0)
            image = await self._docker(self._images.ensure_deps, deps, say)
            say("starting warm sandbox", 0.92)
            pool = self._pool_for(bundle, image)
            await pool.wait_ready(self.pool_limits.start_timeout_s)
            async with pool.cond:
                pool.ensure_min()
            say("evaluator ready", 1.0)

    async def _pool_for_run(self, bundle: CodeBundle) -> ContainerPool:
        pool = self._pools.get(bundle.pool_key)
        if pool is not None and not pool.closed:
            self._pools.move_to_end(bundle.pool_key)
            return pool
        deps = self._validate(bundle)
        await self.start()
        assert self._images is not None
        image = await self._docker(self._images.find, deps)
        if image is None:
            raise ConfigurationError(
                "the sandbox image for this evaluator's dependencies is not built; prepare() it first "
                "(images are never built at call time)"
            )
        return self._pool_for(bundle, image)

    async def _call(
        self, bundle: CodeBundle, prompt: str, response: str, context: Mapping[str, Any], timeout: float
    ) -> tuple[dict[str, Any], RunDiagnostics]:
        """One call in a warm container under ``timeout`` (wall clock, enforced from outside)."""
        t0 = time.monotonic()
        if timeout <= 0:
            raise EvaluatorTimeoutError("no time left for the custom evaluator")
        timeout = min(timeout, self.limits.timeout_s)
        deadline = t0 + timeout
        if not isinstance(prompt, str) or not isinstance(response, str):
            raise InvalidInputError("prompt and response must be strings")
        pool = await self._pool_for_run(bundle)
        container = await pool.acquire(deadline)
        warm = container.calls > 0
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EvaluatorTimeoutError("deadline expired while waiting for a warm sandbox")
            try:
                frame = await container.call(prompt, response, dict(context), remaining)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(f"context is not JSON-serialisable: {exc}") from None
        finally:
            pool.release(container)
        diag = RunDiagnostics(
            stdout=_text(frame.get("stdout")),
            stderr=_text(frame.get("stderr")),
            truncated=bool(frame.get("truncated")),
            wall_ms=(time.monotonic() - t0) * 1000,
            extra={"backend": self.name, "warm": warm, "agent_ms": frame.get("wall_ms"), "image": pool.image},
            provenance={"backend": self.name, **pool.provenance},
        )
        return frame, diag

    # --- info / shutdown -----------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        base = super().info()
        base.update(
            {
                "started": self._rt is not None,
                "socket_channel": bool(self._rt is not None and self._rt.socket_channel),
                "pools": {d[:12]: p.stats() for d, p in self._pools.items()},
                "reaped_at_start": self.reaped,
                "limits": {
                    "timeout_s": self.limits.timeout_s,
                    "container_memory_bytes": self.limits.container_memory_bytes,
                    "memory_bytes": self.limits.memory_bytes,
                    "pids": self.limits.pids,
                    "cpus": self.limits.cpus,
                    "nofile": self.limits.nofile,
                    "tmpfs_bytes": self.limits.tmpfs_bytes,
                    "tmpfs_inodes": self.limits.tmpfs_inodes,
                    "ipc_objects": self.limits.ipc_objects,
                    "cleanup_s": self.limits.cleanup_s,
                    "pool_min": self.pool_limits.min_size,
                    "pool_max": self.pool_limits.max_size,
                    "pool_spare": self.pool_limits.spare_size,
                },
            }
        )
        return base

    async def evict(self, bundle: CodeBundle) -> None:
        """Stop a bundle's warm pool now (evaluator deleted or replaced); the next call starts cold."""
        pool = self._pools.pop(bundle.pool_key, None)
        if pool is not None:
            await pool.close()

    def pool_stats(self, bundle: CodeBundle) -> dict[str, Any] | None:
        pool = self._pools.get(bundle.pool_key)
        return pool.stats() if pool else None

    async def aclose(self) -> None:
        """Stop warm pools and remove every container this instance started."""
        if self._closed:
            return
        self._closed = True
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(BaseException):
                await self._janitor
        pools, self._pools = list(self._pools.values()), collections.OrderedDict()
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _threadsafe(progress: ProgressCallback | None) -> ProgressCallback:
    """Image builds run in executor threads; deliver their progress on the event loop's thread."""
    if progress is None:
        return lambda _m, _f: None
    loop = asyncio.get_running_loop()

    def say(message: str, fraction: float) -> None:
        try:
            if asyncio.get_running_loop() is loop:
                progress(message, fraction)
                return
        except RuntimeError:
            pass
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(progress, message, max(0.0, min(1.0, fraction)))

    return say


__all__ = ["CrossAuditError", "DockerSandbox", "docker_client"]
