"""Group commit: concurrent writes of the same kind share one transaction.

Every decision is durably in the audit log before its answer is sent, so each Evaluate waits
for a commit. Committed one by one, that is one transaction (a thread hop, a WAL append, an
fsync on PostgreSQL) per decision. Here the first writer starts a flush at once (no added
delay when alone); writers that arrive while a flush runs queue, and the next flush writes all
of them (up to ``max_batch``) in one transaction. Each writer still returns only after its own
rows are committed.

Tenants share the writer fairly: writes queue per tenant (``key``), and a batch takes one write
of each waiting tenant in turn, up to ``max_batch`` writes and ``max_batch_bytes`` (``size``), so
a tenant writing large audit records at full rate fills at most its turn of each batch and
another tenant's write goes into the next transaction, never behind the whole backlog.

A batch that fails is retried in halves, down to single writes, so a bad write fails alone and the
others' outcome is what it would have been without batching. A writer whose caller was cancelled
still goes ahead; if it then fails, its error is logged as one line and consumed, never left on
a future that nobody awaits (asyncio would log "Future exception was never retrieved" with a
traceback when collecting it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

W = TypeVar("W")
log = logging.getLogger("crossaudit.store")

# Decisions written in one transaction at most: bounds a transaction's size and the time the
# writer holds the (single) SQLite write lock.
GROUP_COMMIT_MAX_BATCH = 128
# ... and bytes (a write's ``size``): a batch stops growing past this, so one transaction of large
# audit records does not hold the writer long (every tenant's next write waits for it).
GROUP_COMMIT_MAX_BATCH_BYTES = 1024 * 1024


class GroupCommit(Generic[W]):
    """``await commit(write)``: ``write`` is committed together with concurrent ones.

    ``run_batch(writes)`` must write all of them in one transaction, or raise and write none.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[W]], Awaitable[None]],
        *,
        max_batch: int = GROUP_COMMIT_MAX_BATCH,
        max_batch_bytes: int = GROUP_COMMIT_MAX_BATCH_BYTES,
        key: Callable[[W], str] = lambda _: "",
        size: Callable[[W], int] = lambda _: 0,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._key = key
        self._size = size
        # one queue per tenant, in the order their turns come round (a round robin, not a cache:
        # nothing is evicted, a tenant leaves when its queue is empty)
        self._queues: OrderedDict[str, deque[tuple[W, asyncio.Future[None]]]] = OrderedDict()
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # transactions committed or attempted (for tests and metrics)
        self.writes = 0

    async def commit(self, write: W) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queues.setdefault(self._key(write), deque()).append((write, done))
        if self._flusher is None:
            # Its own task: a writer whose caller is cancelled must not stop other writers' flush.
            self._flusher = loop.create_task(self._flush(), name="crossaudit-group-commit")
        # shield: a cancelled caller stops waiting, the write itself goes ahead (as a lone write would).
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            done.add_done_callback(_abandoned)  # the shield no longer reads its outcome: this does
            raise

    def _next_batch(self) -> list[tuple[W, asyncio.Future[None]]]:
        """One write of each waiting tenant in turn, within the batch's count and bytes (at least
        one write); a tenant with writes left goes to the back of the round."""
        batch: list[tuple[W, asyncio.Future[None]]] = []
        used = 0
        while self._queues and len(batch) < self._max_batch:
            tenant, queue = next(iter(self._queues.items()))
            size = self._size(queue[0][0])
            if batch and used + size > self._max_batch_bytes:
                break
            batch.append(queue.popleft())
            used += size
            if queue:
                self._queues.move_to_end(tenant)
            else:
                del self._queues[tenant]
        return batch

    async def _flush(self) -> None:
        batch: list[tuple[W, asyncio.Future[None]]] = []
        try:
            while self._queues:
                batch = self._next_batch()
                await self._write(batch)
        except asyncio.CancelledError:  # the loop is shutting down: nobody may wait forever
            for _, done in (*batch, *(w for q in self._queues.values() for w in q)):
                done.cancel()
            self._queues.clear()
            raise
        finally:
            self._flusher = None

    async def _write(self, batch: list[tuple[W, asyncio.Future[None]]]) -> None:
        self.batches += 1
        self.writes += len(batch)
        try:
            await self._run_batch([w for w, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
                return
            # Which write failed it? Each half in its own transaction, down to the one that fails
            # alone: a tenant whose writes always fail costs the others a few transactions per
            # batch (log2 of its size), not one transaction per write.
            half = len(batch) // 2
            await self._write(batch[:half])
            await self._write(batch[half:])
            return
        for _, done in batch:
            _settle(done, None)


def _abandoned(done: asyncio.Future[None]) -> None:
    """The outcome of a write whose caller went away: retrieved here, a failure logged."""
    if done.cancelled():
        return
    exc = done.exception()
    if exc is not None:
        log.warning("a write whose caller had gone away failed: %s: %s", type(exc).__name__, exc)


def _settle(done: asyncio.Future[None], exc: BaseException | None) -> None:
    if done.done():  # its caller was cancelled and went away
        return
    if exc is None:
        done.set_result(None)
    else:
        done.set_exception(exc)
