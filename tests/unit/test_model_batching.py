"""The micro-batcher on its own, in process, with a real runtime (langdetect: shipped profiles, fast).

The server-level behaviour (gRPC deadlines, Health stats, Detoxify and Presidio batches) is in
tests/integration/test_models_batching.py; here the queueing rules are checked quickly.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from crossaudit.kernel.builtins import parse_config
from crossaudit.kernel.errors import EvaluatorTimeoutError
from crossaudit.modelserver.batching import BatchLimits, MicroBatcher
from crossaudit.modelserver.builtins import RUNTIMES
from crossaudit.modelserver.builtins.langdetect import LangdetectRuntime
from crossaudit.modelserver.pool import ModelServerLimits

EN = "The quick brown fox jumps over the lazy dog near the river bank."
ES = "El rápido zorro marrón salta sobre el perro perezoso junto al río."


@pytest.fixture
def executor():
    ex = ThreadPoolExecutor(max_workers=2)
    yield ex
    ex.shutdown(wait=True)


def _cfg(**extra: object):
    return parse_config("langdetect", {"model": "langdetect", **extra})


async def test_calls_are_split_into_batches_of_at_most_max_size(executor) -> None:
    batcher = MicroBatcher(LangdetectRuntime(), executor, BatchLimits(max_size=4, max_wait_ms=100), slots=2)
    texts = [EN, ES] * 5
    got = await asyncio.gather(*(batcher.submit(_cfg(), "", t, timeout=30) for t in texts))
    assert [v.details["detected_language"] for v in got] == ["en", "es"] * 5
    assert batcher.stats.calls == 10 and max(batcher.stats.sizes) == 4
    assert batcher.stats.sizes == {4: 2, 2: 1} and batcher.waiting() == 0


async def test_calls_with_different_configs_share_a_batch_and_keep_their_own_config(executor) -> None:
    assert RUNTIMES["detoxify"].batching and RUNTIMES["presidio"].batching and not LangdetectRuntime.batching
    batcher = MicroBatcher(LangdetectRuntime(), executor, BatchLimits(max_size=8, max_wait_ms=50), slots=1)
    a, b, c = await asyncio.gather(
        batcher.submit(_cfg(), ES, EN, timeout=30),
        batcher.submit(_cfg(text="prompt"), ES, EN, timeout=30),
        batcher.submit(_cfg(expected_languages=["en"]), "", ES, timeout=30),
    )
    assert a.details["detected_language"] == "en" and b.details["detected_language"] == "es"
    assert c.passed is False and a.passed is None
    assert batcher.stats.sizes == {3: 1}  # one model (one load key): one batch


async def test_a_call_whose_deadline_passes_while_queued_is_not_scored(executor) -> None:
    batcher = MicroBatcher(LangdetectRuntime(), executor, BatchLimits(max_size=8, max_wait_ms=400), slots=1)
    patient = asyncio.create_task(batcher.submit(_cfg(), "", EN, timeout=30))
    with pytest.raises(EvaluatorTimeoutError):
        await batcher.submit(_cfg(), "", ES, timeout=0.05)
    assert batcher.waiting() == 1 and batcher.stats.expired == 1  # removed from the queue at once
    assert (await patient).details["detected_language"] == "en"
    assert batcher.stats.sizes == {1: 1}  # only the patient call was scored


async def test_a_cancelled_caller_leaves_the_queue(executor) -> None:
    batcher = MicroBatcher(LangdetectRuntime(), executor, BatchLimits(max_size=8, max_wait_ms=200), slots=1)
    task = asyncio.create_task(batcher.submit(_cfg(), "", EN, timeout=None))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert batcher.waiting() == 0 and batcher.stats.expired == 1
    await asyncio.sleep(0.3)  # the collector ends without scoring anything
    assert batcher.stats.batches == 0


def test_limits_are_named_and_checked() -> None:
    assert ModelServerLimits().batch == BatchLimits()
    assert BatchLimits().max_size >= 1 and BatchLimits().max_wait_ms >= 0
    with pytest.raises(ValueError):
        BatchLimits(max_size=0)
    with pytest.raises(ValueError):
        BatchLimits(max_wait_ms=-1)
