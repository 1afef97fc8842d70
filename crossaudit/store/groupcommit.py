"""Group commit: concurrent writes of the same kind share one transaction.

Every decision is durably in the audit log before its answer is sent, so each Evaluate waits
for a commit. Committed one by one, that is one transaction (a thread hop, a WAL append, an
fsync on PostgreSQL) per decision. Here the first writer starts a flush at once (no added
delay when alone); writers that arrive while a flush runs queue, and the next flush writes all
of them (up to ``max_batch``) in one transaction. Each writer still returns only after its own
rows are committed.

A batch that fails is retried one writer per transaction, so a bad write fails alone and the
others' outcome is what it would have been without batching. A writer whose caller was cancelled
still goes ahead; if it then fails, its error is logged as one line and consumed, never left on
a future that nobody awaits (asyncio would log "Future exception was never retrieved" with a
traceback when collecting it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

W = TypeVar("W")
log = logging.getLogger("crossaudit.store")

# Decisions written in one transaction at most: bounds a transaction's size and the time the
# writer holds the (single) SQLite write lock.
GROUP_COMMIT_MAX_BATCH = 128


class GroupCommit(Generic[W]):
    """``await commit(write)``: ``write`` is committed together with concurrent ones.

    ``run_batch(writes)`` must write all of them in one transaction, or raise and write none.
    """

    def __init__(
        self, run_batch: Callable[[Sequence[W]], Awaitable[None]], *, max_batch: int = GROUP_COMMIT_MAX_BATCH
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._queue: list[tuple[W, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # transactions committed or attempted (for tests and metrics)
        self.writes = 0

    async def commit(self, write: W) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((write, done))
        if self._flusher is None:
            # Its own task: a writer whose caller is cancelled must not stop other writers' flush.
            self._flusher = loop.create_task(self._flush(), name="crossaudit-group-commit")
        # shield: a cancelled caller stops waiting, the write itself goes ahead (as a lone write would).
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            done.add_done_callback(_abandoned)  # the shield no longer reads its outcome: this does
            raise

    async def _flush(self) -> None:
        batch: list[tuple[W, asyncio.Future[None]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                await self._write(batch)
        except asyncio.CancelledError:  # the loop is shutting down: nobody may wait forever
            for _, done in (*batch, *self._queue):
                done.cancel()
            self._queue = []
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
            for one in batch:  # which write failed it? each alone, in its own transaction
                await self._write([one])
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
