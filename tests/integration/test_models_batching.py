"""Dynamic micro-batching through the real model server (subprocess, gRPC), with real models.

Concurrent calls form batches (``Health`` reports their sizes), each caller gets its own result,
an error in one call of a batch stays with it, and a call whose deadline passes while it waits
for its batch is answered DEADLINE_EXCEEDED and never scored.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest

from crossaudit.kernel.errors import ErrorCode, EvaluatorTimeoutError, InvalidInputError
from crossaudit.modelserver.batching import BatchLimits
from crossaudit.modelserver.builtins.detoxify import DetoxifyRuntime
from crossaudit.modelserver.export import export_detoxify
from crossaudit.modelserver.pool import ModelServerLimits, ModelServerPool
from crossaudit.modelserver.testing import build_spacy_pipeline, build_tiny_detoxify
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.builtin import DetoxifyEvaluator, PresidioEvaluator
from tests.conftest import need

pytestmark = [pytest.mark.models, pytest.mark.slow]

PHRASES = ("you are an idiot", "hello world", "nice day")
TEXTS = [f"text number {i}: " + " ".join(PHRASES[i % 3] for _ in range(i % 5 + 1)) for i in range(16)]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    mods = ("torch", "transformers", "detoxify", "onnx", "onnxscript", "onnxruntime", "tokenizers")
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    need(not missing, f"{', '.join(missing)} not installed (make export-deps)")
    root = tmp_path_factory.mktemp("batch")
    tiny = build_tiny_detoxify(root / "ckpt", seed=3)
    return export_detoxify(tiny.checkpoint, tiny.config_dir, root / "export").directory


def _cfg(export_dir: str, **extra: object) -> dict:
    return {"model": "detoxify", "checkpoint": export_dir, "categories": [], **extra}


async def test_concurrent_calls_form_batches_and_get_their_own_results(export_dir: str) -> None:
    # fp32, where a text's probabilities do not depend on its batch-mates (dynamic int8 quantizes
    # activations per batch: tests/integration/test_models_onnx.py measures that difference).
    cfg = _cfg(export_dir, precision="fp32")
    expected = [DetoxifyRuntime().analyze(cfg, "", t).details["categories"] for t in TEXTS]
    pool = ModelServerPool(ModelServerLimits(batch=BatchLimits(max_size=8, max_wait_ms=200)))
    try:
        ev = DetoxifyEvaluator("tox", cfg, backend=pool)
        await ev.evaluate(EvaluationInput("", "warm up"), timeout=120)  # start the server, load the model
        got = await asyncio.gather(*(ev.evaluate(EvaluationInput("", t), timeout=60) for t in TEXTS))
        health = await pool.health("detoxify")
    finally:
        await pool.aclose()
    for verdict, want in zip(got, expected, strict=True):
        assert verdict.details["categories"] == pytest.approx(want, abs=1e-5)
    sizes = health["batch_sizes"]
    assert sum(size * n for size, n in sizes.items()) == 1 + len(TEXTS)  # every call scored exactly once
    assert max(sizes) == 8  # 16 calls within 200 ms: full batches
    assert health["expired"] == 0


async def test_an_error_in_one_call_does_not_fail_its_batch(export_dir: str) -> None:
    pool = ModelServerPool(ModelServerLimits(batch=BatchLimits(max_size=16, max_wait_ms=300)))
    try:
        good = DetoxifyEvaluator("good", _cfg(export_dir, categories=["toxicity", "insult"]), backend=pool)
        bad = DetoxifyEvaluator("bad", _cfg(export_dir, categories=["sexual_explicit"]), backend=pool)
        await good.evaluate(EvaluationInput("", "warm up"), timeout=120)
        calls = [good.evaluate(EvaluationInput("", t), timeout=60) for t in TEXTS[:5]]
        calls.insert(2, bad.evaluate(EvaluationInput("", "hello"), timeout=60))
        results = await asyncio.gather(*calls, return_exceptions=True)
        health = await pool.health("detoxify")
    finally:
        await pool.aclose()
    assert isinstance(results[2], InvalidInputError) and "sexual_explicit" in str(results[2])
    others = results[:2] + results[3:]
    assert all(not isinstance(r, BaseException) and set(r.details["categories"]) == {"toxicity", "insult"}
               for r in others)
    assert 6 in health["batch_sizes"]  # the bad call was in the same batch as the five good ones


async def test_a_deadline_that_passes_in_the_queue_is_answered_and_not_scored(export_dir: str) -> None:
    wait_ms = 1500.0
    pool = ModelServerPool(ModelServerLimits(batch=BatchLimits(max_size=64, max_wait_ms=wait_ms)))
    try:
        ev = DetoxifyEvaluator("tox", _cfg(export_dir), backend=pool)
        await ev.evaluate(EvaluationInput("", "warm up"), timeout=120)
        before = await pool.health("detoxify")

        t0 = time.monotonic()
        patient = asyncio.create_task(ev.evaluate(EvaluationInput("", "patient"), timeout=60))
        with pytest.raises(EvaluatorTimeoutError) as hurried:
            await ev.evaluate(EvaluationInput("", "hurried"), timeout=0.3)
        # answered at its deadline, before the batch formed: the patient call is still waiting for it
        answered_first = not patient.done()
        verdict = await patient
        waited_s = time.monotonic() - t0
        after = await pool.health("detoxify")
    finally:
        await pool.aclose()
    assert hurried.value.code is ErrorCode.DEADLINE_EXCEEDED
    assert answered_first  # an order of events, however busy the machine
    assert waited_s >= wait_ms / 1000 * 0.9 and verdict.details["categories"]
    # Only the patient call was scored: one more batch of size 1; the hurried one expired unscored.
    assert after["batch_sizes"].get(1, 0) == before["batch_sizes"].get(1, 0) + 1
    assert sum(after["batch_sizes"].values()) == sum(before["batch_sizes"].values()) + 1
    assert after["expired"] == before["expired"] + 1


async def test_presidio_calls_are_batched(tmp_path) -> None:
    pipeline = build_spacy_pipeline(tmp_path / "spacy")
    texts = [f"Mail person{i}@example.com or call John Smith about card 4111 1111 1111 1111." for i in range(12)]
    pool = ModelServerPool(ModelServerLimits(batch=BatchLimits(max_size=12, max_wait_ms=300)))
    try:
        ev = PresidioEvaluator("pii", {"model": "presidio", "spacy_model_path": pipeline,
                                       "entities": ["PERSON", "EMAIL", "CREDIT_CARD"],
                                       "confidence_threshold": 0.8}, backend=pool)
        await ev.evaluate(EvaluationInput("", "warm up"), timeout=120)
        got = await asyncio.gather(*(ev.evaluate(EvaluationInput("", t), timeout=60) for t in texts))
        health = await pool.health("presidio")
    finally:
        await pool.aclose()
    for text, verdict, i in zip(texts, got, range(len(texts)), strict=True):
        found = {(s.label, text[s.start:s.end]) for s in verdict.spans}
        assert found == {("EMAIL_ADDRESS", f"person{i}@example.com"), ("PERSON", "John Smith"),
                         ("CREDIT_CARD", "4111 1111 1111 1111")}
    assert max(health["batch_sizes"]) > 1 and health["expired"] == 0
