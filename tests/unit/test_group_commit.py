"""Group commit of decisions: concurrent writes share transactions, a bad write fails alone,
a caller that goes away does not lose or stop anyone's write; on both store backends."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.store.base import StoreUnavailableError
from crossaudit.store.groupcommit import GroupCommit
from tests.unit.test_store import audit, review


@pytest.fixture
def store(any_store):  # both backends (tests/conftest.py)
    return any_store


async def test_concurrent_decisions_share_transactions_and_all_land(store) -> None:
    n = 64
    await asyncio.gather(*(store.record_decision(audit(f"d{i}"), [review(f"d{i}", f"r{i}")]) for i in range(n)))
    gc = store._decisions
    assert gc.writes == n
    assert gc.batches < n  # the first flush writes one, the next takes everything queued behind it
    assert {d.decision_id for d in await store.list_decisions("t1", limit=1000)} == {f"d{i}" for i in range(n)}
    assert len(await store.list_reviews("t1", limit=1000)) == n


async def test_a_failing_write_fails_alone(store) -> None:
    await store.record_decision(audit("dup"), [])
    results = await asyncio.gather(
        *(store.record_decision(audit(f"ok{i}"), []) for i in range(5)),
        store.record_decision(audit("dup"), []),  # primary key taken: this one must fail ...
        *(store.record_decision(audit(f"ok{i}"), []) for i in range(5, 10)),
        return_exceptions=True,
    )
    failures = [r for r in results if isinstance(r, BaseException)]
    assert len(failures) == 1 and results[5] is failures[0]  # ... and only this one
    ids = {d.decision_id for d in await store.list_decisions("t1", limit=1000)}
    assert ids == {"dup", *(f"ok{i}" for i in range(10))}


async def test_records_of_another_decision_are_refused_before_queueing(store) -> None:
    other = dataclasses.replace(review("x", "r1"), decision_id="y")
    with pytest.raises(InvalidInputError):
        await store.record_decision(audit("x"), [other])
    assert await store.list_decisions("t1") == []


async def test_a_cancelled_caller_does_not_stop_the_write(store) -> None:
    first = asyncio.ensure_future(store.record_decision(audit("a"), []))
    second = asyncio.ensure_future(store.record_decision(audit("b"), []))
    await asyncio.sleep(0)
    first.cancel()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    for _ in range(3000):  # bounded (30 s): the flush finishes in the background
        if len(await store.list_decisions("t1")) == 2:
            break
        await asyncio.sleep(0.01)
    assert {d.decision_id for d in await store.list_decisions("t1")} == {"a", "b"}


async def test_batches_are_bounded_and_in_arrival_order() -> None:
    seen: list[list[int]] = []

    async def run_batch(batch):
        seen.append(list(batch))
        await asyncio.sleep(0)

    gc: GroupCommit[int] = GroupCommit(run_batch, max_batch=4)
    await asyncio.gather(*(gc.commit(i) for i in range(10)))
    assert [x for b in seen for x in b] == list(range(10))
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # all queued before the first flush began


async def test_a_failing_batch_is_retried_in_halves_until_the_bad_write_fails_alone() -> None:
    attempts: list[list[str]] = []

    async def run_batch(batch):
        attempts.append(list(batch))
        if "bad" in batch:
            raise StoreUnavailableError("refused")

    gc: GroupCommit[str] = GroupCommit(run_batch)
    out = await asyncio.gather(*(gc.commit(w) for w in ("a", "b", "bad", "c")), return_exceptions=True)
    assert [type(x).__name__ for x in out] == ["NoneType", "NoneType", "StoreUnavailableError", "NoneType"]
    assert attempts == [["a", "b", "bad", "c"], ["a", "b"], ["bad", "c"], ["bad"], ["c"]]


async def test_shutting_the_flush_down_releases_every_waiter() -> None:
    started = asyncio.Event()

    async def run_batch(batch):
        started.set()
        await asyncio.sleep(3600)

    gc: GroupCommit[int] = GroupCommit(run_batch)
    waiters = [asyncio.ensure_future(gc.commit(i)) for i in range(3)]
    await asyncio.wait_for(started.wait(), 5)
    assert gc._flusher is not None
    gc._flusher.cancel()
    done, pending = await asyncio.wait(waiters, timeout=5)
    assert not pending and all(w.cancelled() for w in done)


class _LoopErrors:
    """What the event loop reports to its exception handler ("Future exception was never
    retrieved" comes from a future's finalizer, so garbage is collected before reading)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.contexts: list[dict] = []
        self.loop.set_exception_handler(lambda _loop, ctx: self.contexts.append(ctx))

    def unretrieved(self) -> list[str]:
        import gc

        gc.collect()
        self.loop.set_exception_handler(None)
        return [c.get("message", "") for c in self.contexts if "never retrieved" in c.get("message", "")]


async def _flushed(gc_: GroupCommit) -> None:
    for _ in range(3000):  # bounded (30 s): the flush goes on after its callers went away
        if gc_._flusher is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the flush did not finish")


async def test_a_failed_batch_whose_callers_went_away_leaves_no_exception_unretrieved() -> None:
    errors = _LoopErrors()
    started, release = asyncio.Event(), asyncio.Event()

    async def run_batch(batch):
        started.set()
        await release.wait()
        raise StoreUnavailableError("refused")

    gc_: GroupCommit[int] = GroupCommit(run_batch)
    waiters = [asyncio.ensure_future(gc_.commit(i)) for i in range(3)]
    await asyncio.wait_for(started.wait(), 5)
    waiters[0].cancel()  # one caller goes away, then the batch (and each retried write) fails
    release.set()
    await asyncio.wait(waiters, timeout=5)  # not gather: its results would keep the futures alive
    assert waiters[0].cancelled()
    assert [type(w.exception()).__name__ for w in waiters[1:]] == ["StoreUnavailableError"] * 2  # still told
    await _flushed(gc_)
    del waiters
    assert errors.unretrieved() == []


async def test_a_failed_write_of_a_cancelled_caller_leaves_no_exception_unretrieved(store) -> None:
    errors = _LoopErrors()
    await store.record_decision(audit("dup"), [])
    calls = [asyncio.ensure_future(store.record_decision(audit(i), [])) for i in ("ok", "dup")]
    await asyncio.sleep(0)  # both queued; the flush is under way
    calls[1].cancel()  # its write fails (the id is taken) after it went away
    await asyncio.wait(calls, timeout=30)
    assert calls[0].exception() is None and calls[1].cancelled()
    await _flushed(store._decisions)
    del calls
    assert errors.unretrieved() == []
    assert {d.decision_id for d in await store.list_decisions("t1")} == {"dup", "ok"}


async def test_tenants_take_turns_in_each_batch_within_its_bytes() -> None:
    """A tenant writing large records at full rate fills its turn of each batch, no more: another
    tenant's write goes into the next transaction, not behind the whole backlog."""
    batches: list[list[tuple[str, int]]] = []
    gate = asyncio.Event()

    async def run(batch) -> None:
        batches.append(list(batch))
        await gate.wait()

    gc = GroupCommit(run, max_batch=128, max_batch_bytes=1000, key=lambda w: w[0], size=lambda w: w[1])
    first = asyncio.ensure_future(gc.commit(("flood", 400)))
    await asyncio.sleep(0)  # the first flush holds the writer
    flood = [asyncio.ensure_future(gc.commit(("flood", 400))) for _ in range(20)]
    mine = asyncio.ensure_future(gc.commit(("small", 10)))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *flood, mine)
    assert batches[0] == [("flood", 400)]
    assert ("small", 10) in batches[1]  # the next transaction, beside at most two of the flood's
    assert all(sum(size for _, size in b) <= 1000 or len(b) == 1 for b in batches)
    assert sum(len(b) for b in batches) == 22 and gc.writes == 22


async def test_a_write_larger_than_the_batch_bytes_goes_alone() -> None:
    seen: list[int] = []

    async def run(batch) -> None:
        seen.append(len(batch))

    gc = GroupCommit(run, max_batch_bytes=100, key=lambda w: w[0], size=lambda w: w[1])
    await asyncio.gather(*(gc.commit((f"t{i}", 500)) for i in range(3)))
    assert sum(seen) == 3 and max(seen) == 1


async def test_a_tenant_whose_writes_fail_costs_others_few_transactions() -> None:
    """Failed batches are retried in halves: a tenant whose every write fails, present in every
    batch by its turn, costs the others a few transactions per batch, not one per write (before:
    300 good writes took 413 transactions beside it, 10 without it)."""
    transactions = 0

    async def run(batch) -> None:
        nonlocal transactions
        transactions += 1
        await asyncio.sleep(0)
        if any(tenant == "bad" for tenant, _ in batch):
            raise InvalidInputError("refused")

    gc = GroupCommit(run, max_batch=64, key=lambda w: w[0])
    good = [gc.commit(("good", i)) for i in range(300)]
    bad = [gc.commit(("bad", i)) for i in range(30)]
    results = await asyncio.gather(*good, *bad, return_exceptions=True)
    assert all(r is None for r in results[:300]) and all(isinstance(r, InvalidInputError) for r in results[300:])
    assert transactions < 150, transactions
