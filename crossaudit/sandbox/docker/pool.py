"""Warm pools: per tenant and bundle (``CodeBundle.pool_key``), ready containers whose agent loaded the code.

Why this shape:

* A warm call is a frame round trip to an agent that already holds a forked child, so it
  costs milliseconds instead of a container start (~0.5-1 s).
* One call at a time per container; ``max_size`` containers per pool; callers beyond that
  wait (FIFO through a condition) up to ``queue_wait_s`` and their deadline, then get
  :class:`PoolExhaustedError` (RESOURCE_EXHAUSTED).
* Refill happens in background tasks: after a container is killed (deadline, crash) the
  caller gets its error at once and a replacement starts off the request path.
* Errors that are the *code's* fault (load errors) stick to the pool, so a broken bundle
  fails fast instead of restarting containers in a loop.
* After each answered call a container *settles* before it is idle again: its agent kills every
  other process, empties the scratch filesystems and removes IPC objects, then reports (a
  ``reset`` frame, read here off the caller's path). A failed reset retires the container.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any

from crossaudit.kernel.errors import (
    CrossAuditError,
    EvaluatorCodeError,
    EvaluatorTimeoutError,
    EvaluatorUnavailableError,
    PoolExhaustedError,
    SandboxSecurityError,
)
from crossaudit.sandbox.base import CodeBundle
from crossaudit.sandbox.docker.container import RESET_PATHS, ContainerRuntime, WarmContainer
from crossaudit.sandbox.protocol import AgentChannel, error_from_frame

log = logging.getLogger(__name__)

START_RETRY_BACKOFF_S = 1.0  # after an infrastructure start failure, before trying again
MAX_WAIT_ROUNDS = 10_000  # wake-ups of one waiting caller (each bounded by the deadline)
CLEANUP_SAMPLES = 1024  # recent reset frames (per-call cleanup times) kept for stats()


class WarmPool:
    """Containers for one bundle (code + deps image); see the module docstring."""

    def __init__(self, rt: ContainerRuntime, bundle: CodeBundle, image: str, preload: tuple[str, ...]) -> None:
        self.rt = rt
        self.bundle = bundle
        self.image = image
        self.preload = preload
        self.idle: list[WarmContainer] = []
        self.busy: set[WarmContainer] = set()
        self.starting = 0
        self.waiting = 0
        self.cond = asyncio.Condition()
        self.sticky_error: CrossAuditError | None = None  # the code's fault: never retried
        self.last_error: CrossAuditError | None = None
        self.last_error_at = 0.0
        self.last_used = time.monotonic()
        self.closed = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started_total = 0
        self.replaced_total = 0
        self.settling = 0  # answered containers whose reset is not reported yet (counted in busy)
        self.cleanups = 0
        self.cleanup_failures = 0
        self.resets: collections.deque[dict[str, Any]] = collections.deque(maxlen=CLEANUP_SAMPLES)

    # --- sizes ---------------------------------------------------------------------------------

    @property
    def total(self) -> int:
        return len(self.idle) + len(self.busy) + self.starting

    def stats(self) -> dict[str, Any]:
        cleanup = [float(r["cleanup_ms"]) for r in self.resets]
        return {
            "image": self.image,
            "idle": len(self.idle),
            "busy": len(self.busy) - self.settling,  # serving a call (settling ones are counted below)
            "starting": self.starting,
            "waiting": self.waiting,
            "started": self.started_total,
            "replaced": self.replaced_total,
            "settling": self.settling,
            "cleanups": self.cleanups,
            "cleanup_failures": self.cleanup_failures,
            "cleanup_ms_p50": sorted(cleanup)[len(cleanup) // 2] if cleanup else None,
            "cleanup_ms_max": max(cleanup, default=None),
        }

    def load_frame(self) -> dict[str, Any]:
        return AgentChannel.load_frame(
            self.bundle.code,
            entrypoint=self.bundle.entrypoint,
            preload=self.preload,
            restricted=False,
            limits=self.rt.limits,
            reset={"paths": RESET_PATHS, "ipc": True},
        )

    # --- starting containers -----------------------------------------------------------------------

    def _spawn(self) -> None:
        """Start one container in the background (no await: safe with or without ``cond`` held)."""
        self.starting += 1
        self._background(self._start_one())

    async def _start_one(self) -> None:
        container = WarmContainer(self.rt, self.image, self.bundle.digest, self.bundle.pool_key)
        error: CrossAuditError | None = None
        try:
            frame = await container.start(self.load_frame(), self.rt.pool_limits.start_timeout_s)
            if not frame.get("ok"):
                error = error_from_frame(frame)
                await container.destroy()
        except CrossAuditError as exc:
            error = exc
        except Exception as exc:  # never let a background task die silently
            error = EvaluatorUnavailableError(f"sandbox start failed: {type(exc).__name__}: {exc}")
        async with self.cond:
            self.starting -= 1
            if error is None and not self.closed:
                container.idle_since = time.monotonic()
                self.idle.append(container)
                self.started_total += 1
            else:
                if isinstance(error, EvaluatorCodeError | SandboxSecurityError):
                    self.sticky_error = error
                elif error is not None:
                    self.last_error, self.last_error_at = error, time.monotonic()
                    log.warning("sandbox start failed for %s: %s", self.bundle.digest[:12], error)
            self.cond.notify_all()
        if (error is None and self.closed) or (error is not None and not container.dead):
            await container.destroy()

    def ensure_min(self) -> None:
        """Top the pool up to ``min_size`` (plus one per waiting caller, up to ``max_size``); non-blocking."""
        if self.closed or self.sticky_error is not None:
            return
        if self.last_error is not None and time.monotonic() - self.last_error_at < START_RETRY_BACKOFF_S:
            return
        limits = self.rt.pool_limits
        want = min(limits.max_size, max(limits.min_size, len(self.busy) + self.waiting))
        for _ in range(max(0, want - self.total)):
            self._spawn()

    async def wait_ready(self, timeout: float) -> None:
        """Block until one container is idle (used by ``prepare`` so load errors surface there)."""
        deadline = time.monotonic() + timeout
        async with self.cond:
            if self.total == 0:
                self._spawn()
            while not self.idle and not self.busy:
                if self.sticky_error is not None:
                    raise self.sticky_error
                if self.starting == 0:
                    if self.last_error is not None:
                        raise self.last_error
                    self._spawn()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EvaluatorUnavailableError(f"no warm sandbox ready within {timeout:.1f}s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cond.wait(), remaining)

    # --- calls -------------------------------------------------------------------------------------

    async def acquire(self, deadline: float) -> WarmContainer:
        """A ready container, starting one if below ``max_size``; else queue (see module docstring)."""
        limits = self.rt.pool_limits
        queued_since: float | None = None
        async with self.cond:
            self.waiting += 1
            try:
                for _ in range(MAX_WAIT_ROUNDS):
                    if self.closed:
                        raise EvaluatorUnavailableError("sandbox pool closed")
                    if self.sticky_error is not None:
                        raise self.sticky_error
                    while self.idle:
                        # Oldest idle first: the container that just answered is still forking
                        # its next child (the agent does that right after replying).
                        c = self.idle.pop(0)
                        if c.alive:
                            self.busy.add(c)
                            self.last_used = time.monotonic()
                            return c
                        self._retire(c)
                    if self.total < limits.max_size:
                        if self.last_error is not None and self.starting == 0 and not self.busy and (
                            time.monotonic() - self.last_error_at < START_RETRY_BACKOFF_S
                        ):
                            raise self.last_error
                        if self.starting + self.settling < self.waiting:  # a settling one is ms away
                            self._spawn()
                        queued_since = None
                    elif queued_since is None:
                        queued_since = time.monotonic()
                    now = time.monotonic()
                    until = deadline
                    if queued_since is not None:
                        until = min(until, queued_since + limits.queue_wait_s)
                    if now >= until:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.cond.wait(), until - now)
                if queued_since is not None or self.total >= limits.max_size:
                    raise PoolExhaustedError(
                        f"all {limits.max_size} warm sandboxes of this evaluator stayed busy "
                        f"({self.waiting} waiting)"
                    )
                raise EvaluatorTimeoutError("deadline expired before a sandbox was ready")
            finally:
                self.waiting -= 1

    def release(self, c: WarmContainer) -> None:
        """Return a container after a call; a dead one is dropped and replaced in the background.

        Synchronous on purpose (no await between the bookkeeping steps, so no lock needed on one
        event loop): a caller cancelled right after its call can never leak a busy slot. A
        container that answered a call stays busy until it has settled (see the module docstring).
        """
        if c.reset_pending and c.alive and not self.closed:
            self.settling += 1
            self._background(self._settle(c))
            return
        self.busy.discard(c)
        self._park(c, healthy=True)

    def _park(self, c: WarmContainer, *, healthy: bool) -> None:
        """Back to idle if it is healthy and alive, else retired; then refill and wake waiters."""
        if healthy and c.alive and not self.closed:
            c.idle_since = time.monotonic()
            self.idle.append(c)
        else:
            self._retire(c)
        self.ensure_min()
        self._background(self._notify())

    async def _settle(self, c: WarmContainer) -> None:
        reset: dict[str, Any] | None = None
        try:
            reset = await c.settle()
        finally:
            self.settling -= 1
            self.busy.discard(c)
            if not self.closed:
                self.cleanups += 1
                if reset is None:
                    self.cleanup_failures += 1
                else:
                    self.resets.append(reset)
                self._park(c, healthy=reset is not None)

    async def _notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _retire(self, c: WarmContainer) -> None:
        self.replaced_total += 1
        if not c.dead or c.id is not None:
            self._background(c.destroy())

    # --- maintenance -------------------------------------------------------------------------------

    async def maintain(self) -> None:
        """Drop dead idle containers, stop those idle past ``idle_timeout_s`` beyond ``min_size``, refill."""
        limits = self.rt.pool_limits
        now = time.monotonic()
        async with self.cond:
            keep: list[WarmContainer] = []
            for c in self.idle:
                surplus = len(keep) + len(self.busy) >= limits.min_size
                if not c.alive or (surplus and now - c.idle_since > limits.idle_timeout_s):
                    self._retire(c)
                else:
                    keep.append(c)
            self.idle = keep
            self.ensure_min()

    async def close(self) -> None:
        async with self.cond:
            self.closed = True
            victims = [*self.idle, *self.busy]
            self.idle, self.busy = [], set()
            self.cond.notify_all()
        await asyncio.gather(*(c.destroy() for c in victims), return_exceptions=True)
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.rt.pool_limits.start_timeout_s + 5)
