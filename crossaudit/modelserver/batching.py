"""Dynamic micro-batching in the model server: calls that arrive close together are scored together.

A transformer's forward pass over 8 padded texts costs far less than 8 passes over one, so the
server (:mod:`crossaudit.modelserver.server`) hands calls of a runtime with ``batching`` to a
:class:`MicroBatcher` instead of running each alone:

- Calls are queued per *batch key* (the runtime's load key: same loaded model), each with its own
  deadline. A batch is dispatched when ``max_size`` calls wait, or ``max_wait_ms`` after its first
  call arrived, whichever is first; when every worker is busy, calls keep joining the next batch
  meanwhile (up to ``max_size``), so batches grow with load and a lone call waits only ``max_wait_ms``.
- At most ``slots`` batches run at once (the server's worker threads), each one
  :meth:`~crossaudit.modelserver.builtins.base.ModelRuntime.analyze_batch` call in the executor.
- Deadlines hold inside a batch: a call whose deadline passes, or whose caller goes away, while it
  waits is removed from the queue and never scored; its caller gets ``EvaluatorTimeoutError``
  (gRPC DEADLINE_EXCEEDED). A call whose deadline passes while its batch runs is answered at its
  deadline; the batch's result for it is dropped.
- Each call gets its own result: the runtime returns one verdict or exception per call, in order,
  so an error in one call does not fail the others where the runtime can separate them.

:class:`BatchStats` counts batch sizes and expired calls; the server reports them on ``Health``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from crossaudit.kernel.errors import EvaluatorTimeoutError, EvaluatorUnavailableError
from crossaudit.kernel.limits import SETTINGS_SECTION, NonNegativeFloat, PositiveInt
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.builtins.base import ModelRuntime


@dataclass(frozen=True)
class BatchLimits:
    """How a model server batches (see ``docs/limits.md``)."""

    __pydantic_config__ = SETTINGS_SECTION

    max_size: Annotated[PositiveInt, Field(description="calls scored in one batch; 1 turns batching off")] = 16
    max_wait_ms: Annotated[
        NonNegativeFloat, Field(description="longest a call waits for others to join its batch (when a worker is free)")
    ] = 5.0

    def __post_init__(self) -> None:
        if self.max_size < 1 or self.max_wait_ms < 0:
            raise ValueError("BatchLimits: max_size >= 1 and max_wait_ms >= 0")


@dataclass
class BatchStats:
    """What the batcher did since the server started (reported on the model server's ``Health``)."""

    sizes: Counter[int] = field(default_factory=Counter)  # batch size -> batches of that size
    expired: int = 0  # calls whose deadline passed (or whose caller left) before they were scored

    @property
    def batches(self) -> int:
        return sum(self.sizes.values())

    @property
    def calls(self) -> int:
        return sum(size * n for size, n in self.sizes.items())


@dataclass(eq=False)
class _Call:
    config: Any
    prompt: str
    response: str
    deadline: float | None  # loop time
    arrived: float
    future: asyncio.Future[Verdict]


class MicroBatcher:
    """Batches one runtime's calls; all methods run on the server's event loop."""

    def __init__(self, runtime: ModelRuntime, executor: Executor, limits: BatchLimits, *, slots: int) -> None:
        self.runtime = runtime
        self.executor = executor
        self.limits = limits
        self.stats = BatchStats()
        self._slots = asyncio.Semaphore(max(1, slots))
        self._queues: dict[Hashable, deque[_Call]] = {}
        self._full: dict[Hashable, asyncio.Event] = {}
        self._collectors: dict[Hashable, asyncio.Task[None]] = {}
        self._running: set[asyncio.Future[Any]] = set()

    async def submit(self, cfg: Any, prompt: str, response: str, *, timeout: float | None) -> Verdict:
        """Queue one call (``cfg`` already parsed) and wait for its verdict, at most ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        call = _Call(cfg, prompt, response, None if timeout is None else now + timeout, now, loop.create_future())
        key = self.runtime.batch_key(cfg)
        queue = self._queues.setdefault(key, deque())
        queue.append(call)
        if len(queue) >= self.limits.max_size:
            self._full.setdefault(key, asyncio.Event()).set()
        if key not in self._collectors:
            self._collectors[key] = asyncio.create_task(self._collect(key))
        try:
            if timeout is None:
                return await asyncio.shield(call.future)
            return await asyncio.wait_for(asyncio.shield(call.future), timeout=max(0.0, timeout))
        except TimeoutError:
            raise EvaluatorTimeoutError("model call timed out") from None
        finally:
            if not call.future.done():  # timed out or cancelled: never score it if it still waits
                call.future.cancel()
                with contextlib.suppress(ValueError):
                    queue.remove(call)
                    self.stats.expired += 1

    async def _collect(self, key: Hashable) -> None:
        """Form and dispatch batches for ``key`` until its queue is empty, then end."""
        loop = asyncio.get_running_loop()
        queue = self._queues[key]
        full = self._full.setdefault(key, asyncio.Event())
        try:
            while queue:
                wait_until = queue[0].arrived + self.limits.max_wait_ms / 1000
                while queue and len(queue) < self.limits.max_size and (left := wait_until - loop.time()) > 0:
                    full.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(full.wait(), timeout=left)
                if not queue:
                    break
                await self._slots.acquire()
                batch: list[_Call] = []
                now = loop.time()
                while queue and len(batch) < self.limits.max_size:
                    call = queue.popleft()
                    if call.future.done():
                        continue
                    if call.deadline is not None and call.deadline <= now:
                        call.future.set_exception(EvaluatorTimeoutError("model call timed out while queued"))
                        self.stats.expired += 1
                        continue
                    batch.append(call)
                if not batch:
                    self._slots.release()
                    continue
                self.stats.sizes[len(batch)] += 1
                work = [(c.config, c.prompt, c.response) for c in batch]
                running = loop.run_in_executor(self.executor, self.runtime.analyze_batch, work)
                self._running.add(running)
                running.add_done_callback(lambda done, batch=batch: self._deliver(done, batch))  # type: ignore[misc]
        finally:
            # No await since the loop's last check: a call queued now finds no collector and starts one.
            del self._collectors[key]
            if not queue:
                self._queues.pop(key, None)
                self._full.pop(key, None)

    def _deliver(self, done: asyncio.Future[list[Verdict | Exception]], batch: list[_Call]) -> None:
        self._running.discard(done)
        self._slots.release()
        if done.cancelled():
            results: list[Any] = [EvaluatorUnavailableError("the model server is shutting down")] * len(batch)
        elif done.exception() is not None:
            results = [done.exception()] * len(batch)  # the runtime itself broke: every call shares it
        else:
            results = list(done.result())
            if len(results) != len(batch):
                results = [RuntimeError(f"{len(results)} results for {len(batch)} calls")] * len(batch)
        for call, result in zip(batch, results, strict=True):
            if call.future.done():  # its caller left or its deadline passed meanwhile
                continue
            if isinstance(result, BaseException):
                call.future.set_exception(result)
            else:
                call.future.set_result(result)

    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())
