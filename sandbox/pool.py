"""One warm-pool abstraction for both sandbox backends: per tenant and bundle
(``CodeBundle.pool_key``), workers (a container, an agent subprocess) whose agent loaded the code.

Why this shape:

* A warm call is a frame round trip to an agent that already holds a forked child, so it
  costs milliseconds instead of a cold start (a container start is ~0.5-1 s, an agent's
  imports tens to hundreds of ms).
* One call at a time per worker; ``max_size`` workers per pool; callers beyond that wait
  (FIFO through a condition) up to ``queue_wait_s`` and their deadline, then get
  :class:`PoolExhaustedError` (RESOURCE_EXHAUSTED).
* Refill happens in background tasks: after a worker is killed (deadline, crash) the caller
  gets its error at once and a replacement starts off the request path.
* Errors that are the *code's* fault (load errors) stick to the pool, so a broken bundle fails
  fast instead of restarting workers in a loop.
* After each answered call a worker *settles* before it is idle again: its agent kills every
  other process, empties its scratch space and (in containers) removes IPC objects, then
  reports (a ``reset`` frame, read off the caller's path). A failed reset retires the worker:
  nothing a call leaves behind is seen by the next call.
* ``spare_size`` ready workers are kept beyond those serving or settling (within ``max_size``),
  so the next call goes to a clean worker while the last one resets and never waits for that
  reset. A spare is a whole worker (the isolation of a reset worker is unchanged, and no
  scratch space or process is shared between two calls in flight); its cost is that worker's
  memory, bounded by ``max_size``.

Shared here, because both backends need exactly the same rules and the trust boundary must
not depend on which one runs: sizing (``PoolLimits``), queueing and deadlines, background refill,
settle-before-reuse, retirement of dead or unclean workers, sticky load errors, statistics
(:meth:`WarmPool.stats`, the backends' ``info()`` and the metrics read it).

Per backend, because it is what actually differs:

* the worker (:class:`Worker`: ``alive``, ``settle``, ``destroy``) and how one starts
  (:meth:`WarmPool.new_worker`: a hardened container / an agent subprocess in its own session,
  temp dir and environment), which decides what the reset covers (tmpfs mounts and IPC objects /
  the agent's temp dir) and how a call's deadline kills it (container / process tree);
* how many pools it keeps and for how long (Docker: least recently used idle pools beyond
  ``max_pools`` closed, :meth:`WarmPool.maintain` run by a janitor; process: an LRU of
  ``max_bundles``, pools idle past ``idle_timeout_s`` closed on the way);
* the wording of its errors: :meth:`WarmPool.no_worker_error` and ``close(reason=...)``.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import logging
import time
from typing import Any, Generic, Protocol, TypeVar

from crossaudit.kernel.errors import (
    CrossAuditError,
    EvaluatorCodeError,
    EvaluatorTimeoutError,
    EvaluatorUnavailableError,
    PoolExhaustedError,
    SandboxSecurityError,
)
from crossaudit.kernel.limits import PoolLimits
from sandbox.base import CodeBundle

log = logging.getLogger(__name__)

START_RETRY_BACKOFF_S = 1.0  # after an infrastructure start failure, before trying again
MAX_WAIT_ROUNDS = 10_000  # wake-ups of one waiting caller (each bounded by the deadline)
CLEANUP_SAMPLES = 1024  # recent reset frames (per-call cleanup times) kept for stats()


class Worker(Protocol):
    """What a pool needs of a worker. ``reset_pending`` is set when a call was answered: the
    worker must :meth:`settle` (its agent's reset frame) before it serves another call."""

    idle_since: float
    reset_pending: bool

    @property
    def alive(self) -> bool: ...

    async def settle(self) -> dict[str, Any] | None:
        """The agent's reset report after a call, or None when the reset failed or timed out."""

    async def destroy(self) -> None:
        """Kill and remove the worker; idempotent, never raises."""


W = TypeVar("W", bound=Worker)


def fresh(error: CrossAuditError) -> CrossAuditError:
    """A new instance of a kept error for each raise: raising one cached exception again and again
    grows its traceback (and keeps every frame it passed through alive), and concurrent callers
    would share its ``__context__`` and attributes."""
    copy = type(error).__new__(type(error))
    copy.args = error.args
    copy.__dict__.update(error.__dict__)
    return copy


class WarmPool(abc.ABC, Generic[W]):
    """Workers for one bundle of one tenant; see the module docstring. A backend subclasses it
    and implements :meth:`new_worker`."""

    def __init__(self, limits: PoolLimits, bundle: CodeBundle) -> None:
        self.limits = limits
        self.bundle = bundle
        self.idle: list[W] = []
        self.busy: set[W] = set()
        self.starting = 0
        self.waiting = 0
        self.cond = asyncio.Condition()
        self.sticky_error: CrossAuditError | None = None  # the code's fault: never retried
        self.last_error: CrossAuditError | None = None
        self.last_error_at = 0.0
        self.last_used = time.monotonic()
        self.closed = False
        self.closed_reason = "sandbox pool closed"  # what waiting and later callers are told
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started_total = 0
        self.replaced_total = 0
        self.settling = 0  # answered workers whose reset is not reported yet (counted in busy)
        self.cleanups = 0
        self.cleanup_failures = 0
        self.reset_waits = 0  # calls that found no ready worker while one was resetting (waited for a reset)
        self.resets: collections.deque[dict[str, Any]] = collections.deque(maxlen=CLEANUP_SAMPLES)

    # --- sizes ---------------------------------------------------------------------------------

    @property
    def total(self) -> int:
        return len(self.idle) + len(self.busy) + self.starting

    def stats(self) -> dict[str, Any]:
        cleanup = [float(r["cleanup_ms"]) for r in self.resets]
        return {
            "idle": len(self.idle),
            "busy": len(self.busy) - self.settling,  # serving a call (settling ones are counted below)
            "starting": self.starting,
            "waiting": self.waiting,
            "started": self.started_total,
            "replaced": self.replaced_total,
            "settling": self.settling,
            "cleanups": self.cleanups,
            "cleanup_failures": self.cleanup_failures,
            "reset_waits": self.reset_waits,
            "cleanup_ms_p50": sorted(cleanup)[len(cleanup) // 2] if cleanup else None,
            "cleanup_ms_max": max(cleanup, default=None),
        }

    # --- starting workers --------------------------------------------------------------------------

    @abc.abstractmethod
    async def new_worker(self) -> W:
        """Start one worker with the bundle loaded, within ``limits.start_timeout_s``. Raises a
        CrossAuditError (a load error of the code: EvaluatorCodeError / SandboxSecurityError) and
        leaves nothing running when it fails."""

    def _spawn(self) -> None:
        """Start one worker in the background (no await: safe with or without ``cond`` held)."""
        self.starting += 1
        self._background(self._start_one())

    async def _start_one(self) -> None:
        worker: W | None = None
        error: CrossAuditError | None = None
        try:
            worker = await self.new_worker()
        except CrossAuditError as exc:
            error = exc
        except Exception as exc:  # never let a background task die silently
            error = EvaluatorUnavailableError(f"sandbox start failed: {type(exc).__name__}: {exc}")
        async with self.cond:
            self.starting -= 1
            if worker is not None and not self.closed:
                worker.idle_since = time.monotonic()
                self.idle.append(worker)
                self.started_total += 1
            elif error is not None:
                if isinstance(error, EvaluatorCodeError | SandboxSecurityError):
                    self.sticky_error = error
                else:
                    self.last_error, self.last_error_at = error, time.monotonic()
                    log.warning("sandbox start failed for %s: %s", self.bundle.digest[:12], error)
            self.cond.notify_all()
        if worker is not None and self.closed:
            await worker.destroy()

    def wanted(self, waiting: int = 0) -> int:
        """Workers this pool should hold: ``min_size``, or those in use (serving or settling) plus
        ``waiting`` callers plus ``spare_size`` ready ones, whichever is more; never beyond ``max_size``."""
        limits = self.limits
        return min(limits.max_size, max(limits.min_size, len(self.busy) + waiting + limits.spare_size))

    def ensure_min(self) -> None:
        """Top the pool up to :meth:`wanted` (waiting callers counted); non-blocking."""
        if self.closed or self.sticky_error is not None:
            return
        if self.last_error is not None and time.monotonic() - self.last_error_at < START_RETRY_BACKOFF_S:
            return
        for _ in range(max(0, self.wanted(self.waiting) - self.total)):
            self._spawn()

    async def wait_ready(self, timeout: float, count: int = 1) -> None:
        """Block until ``count`` workers are up, idle or serving (used by ``prepare`` so load errors
        surface there)."""
        deadline = time.monotonic() + timeout
        async with self.cond:
            if self.closed:
                raise EvaluatorUnavailableError(self.closed_reason)
            if self.sticky_error is not None:  # the code's fault: re-raised without starting another worker
                raise fresh(self.sticky_error)
            for _ in range(count - self.total):
                self._spawn()
            while len(self.idle) + len(self.busy) < count:
                if self.closed:
                    raise EvaluatorUnavailableError(self.closed_reason)
                if self.sticky_error is not None:
                    raise fresh(self.sticky_error)
                if self.starting == 0:
                    if self.last_error is not None:
                        raise fresh(self.last_error)
                    for _ in range(max(1, count - self.total)):
                        self._spawn()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EvaluatorUnavailableError(f"no warm sandbox ready within {timeout:.1f}s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.cond.wait(), remaining)

    # --- calls -------------------------------------------------------------------------------------

    async def acquire(self, deadline: float, timeout: float | None = None) -> W:
        """A ready worker (``deadline`` on ``time.monotonic()``), starting one if below ``max_size``; else
        queue. ``timeout`` (the call's whole budget) only words :meth:`no_worker_error`."""
        limits = self.limits
        queued_since: float | None = None
        got = waited_reset = False
        async with self.cond:
            self.waiting += 1
            try:
                for _ in range(MAX_WAIT_ROUNDS):
                    if self.closed:
                        raise EvaluatorUnavailableError(self.closed_reason)
                    if self.sticky_error is not None:
                        raise fresh(self.sticky_error)
                    while self.idle:
                        # Oldest idle first: the worker that just answered is still forking
                        # its next child (the agent does that right after replying).
                        c = self.idle.pop(0)
                        if c.alive:
                            self.busy.add(c)
                            self.last_used = time.monotonic()
                            got = True
                            self.reset_waits += waited_reset
                            return c
                        self._retire(c)
                    if self.total < limits.max_size:
                        if self.last_error is not None and self.starting == 0 and not self.busy and (
                            time.monotonic() - self.last_error_at < START_RETRY_BACKOFF_S
                        ):
                            raise fresh(self.last_error)
                        if self.starting + self.settling < self.waiting:  # a settling one is ms away
                            self._spawn()
                        queued_since = None
                    elif queued_since is None:
                        queued_since = time.monotonic()
                    waited_reset = waited_reset or self.settling > 0
                    now = time.monotonic()
                    until = deadline
                    if queued_since is not None:
                        until = min(until, queued_since + limits.queue_wait_s)
                    if now >= until:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.cond.wait(), until - now)
                raise self.no_worker_error(
                    full=queued_since is not None or self.total >= limits.max_size,
                    deadline_expired=time.monotonic() >= deadline,
                    timeout=timeout,
                )
            finally:
                self.waiting -= 1
                if got:
                    self.ensure_min()  # the spare just taken is replaced, off this caller's path

    def no_worker_error(self, *, full: bool, deadline_expired: bool, timeout: float | None) -> CrossAuditError:
        """What a caller that got no worker raises. ``full``: the pool stayed at ``max_size`` (the
        caller queued); ``deadline_expired``: its deadline, not ``queue_wait_s``, ran out first.
        Backends differ here (see ``AgentPool``); this one says RESOURCE_EXHAUSTED whenever the
        pool was full."""
        if full:
            return PoolExhaustedError(
                f"all {self.limits.max_size} warm sandboxes of this evaluator stayed busy ({self.waiting} waiting)"
            )
        return EvaluatorTimeoutError("deadline expired before a sandbox was ready")

    def release(self, c: W) -> None:
        """Return a worker after a call; a dead one is dropped and replaced in the background.

        Synchronous on purpose (no await between the bookkeeping steps, so no lock needed on one
        event loop): a caller cancelled right after its call can never leak a busy slot. A
        worker that answered a call stays busy until it has settled (see the module docstring).
        """
        if c.reset_pending and c.alive and not self.closed:
            self.settling += 1
            self._background(self._settle(c))
            return
        self.busy.discard(c)
        self._park(c, healthy=True)

    def _park(self, c: W, *, healthy: bool) -> None:
        """Back to idle if it is healthy and alive, else retired; then refill and wake waiters."""
        if healthy and c.alive and not self.closed:
            c.idle_since = time.monotonic()
            self.idle.append(c)
        else:
            self._retire(c)
        self.ensure_min()
        self._background(self._notify())

    async def _settle(self, c: W) -> None:
        reset: dict[str, Any] | None = None
        try:
            reset = await c.settle()
        finally:
            self.settling -= 1
            self.busy.discard(c)
            if not self.closed:  # (a close kills busy workers: their resets are not cleanup failures)
                self.cleanups += 1
                if reset is None:
                    self.cleanup_failures += 1
                else:
                    self.resets.append(reset)
            self._park(c, healthy=reset is not None)  # retired when the pool closed meanwhile

    async def _notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _retire(self, c: W) -> None:
        self.replaced_total += 1
        self._background(c.destroy())  # idempotent: also removes what a dead worker left behind

    # --- maintenance -------------------------------------------------------------------------------

    async def maintain(self) -> None:
        """Drop dead idle workers, stop those idle past ``idle_timeout_s`` beyond :meth:`wanted`, refill."""
        limits = self.limits
        now = time.monotonic()
        async with self.cond:
            keep: list[W] = []
            needed = self.wanted()
            for c in self.idle:
                surplus = len(keep) + len(self.busy) >= needed
                if not c.alive or (surplus and now - c.idle_since > limits.idle_timeout_s):
                    self._retire(c)
                else:
                    keep.append(c)
            self.idle = keep
            self.ensure_min()

    async def close(self, *, kill_busy: bool = True, reason: str = "sandbox pool closed") -> None:
        """Stop the pool; callers waiting in :meth:`acquire` get ``EvaluatorUnavailableError(reason)``.
        ``kill_busy=False`` lets calls in flight finish: their workers are retired when released or,
        if they were settling, once settled (``_park`` sees the pool closed)."""
        async with self.cond:
            if not self.closed:
                self.closed_reason = reason
            self.closed = True
            victims = [*self.idle, *self.busy] if kill_busy else list(self.idle)
            self.idle = []
            if kill_busy:
                self.busy = set()
            self.cond.notify_all()
        await asyncio.gather(*(c.destroy() for c in victims), return_exceptions=True)
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.limits.start_timeout_s + 5)
