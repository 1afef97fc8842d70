"""Real model servers (subprocesses over gRPC) with real models built here.

Detoxify loads a tiny BERT checkpoint in Detoxify's own format through ``detoxify.Detoxify``;
Presidio loads a spaCy pipeline directory through ``NlpEngineProvider``; langdetect uses its
shipped profiles. Under CI=true a missing torch/detoxify fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal

import pytest

from crossaudit.kernel.errors import ConfigurationError, EvaluatorTimeoutError, InvalidInputError
from crossaudit.modelserver.pool import InProcessModels, ModelServerLimits, ModelServerPool
from crossaudit.modelserver.testing import ORIGINAL_CATEGORIES, build_spacy_pipeline, build_tiny_detoxify
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.builtin import DetoxifyEvaluator, LangdetectEvaluator, PresidioEvaluator
from tests.conftest import need

pytestmark = [pytest.mark.models, pytest.mark.slow]

PII_TEXT = "Email john@example.com or call John Smith; card 4111 1111 1111 1111."


def _need_detoxify() -> None:
    ok = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "detoxify"))
    need(ok, "torch/transformers/detoxify not installed (make models)")


@pytest.fixture(scope="module")
def tiny_detox(tmp_path_factory: pytest.TempPathFactory):
    _need_detoxify()
    return build_tiny_detoxify(tmp_path_factory.mktemp("detox"))


@pytest.fixture(scope="module")
def fixed_detox(tmp_path_factory: pytest.TempPathFactory):
    _need_detoxify()
    return build_tiny_detoxify(tmp_path_factory.mktemp("detox-fixed"), fixed_probabilities=[0.7, 0.1, 0.2, 0.9,
                                                                                           0.3, 0.05])


@pytest.fixture(scope="module")
def spacy_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_spacy_pipeline(tmp_path_factory.mktemp("spacy") / "pipeline")


@pytest.fixture
async def pool():
    p = ModelServerPool()
    yield p
    await p.aclose()


async def test_detoxify_server_real_checkpoint_matches_in_process(tiny_detox, pool: ModelServerPool) -> None:
    cfg = {"model": "detoxify", "checkpoint": tiny_detox.checkpoint,
           "huggingface_config_path": tiny_detox.config_dir, "categories": []}
    inp = EvaluationInput("hi", "you are an idiot")
    v = await DetoxifyEvaluator("tox", cfg, backend=pool).evaluate(inp, timeout=180)
    assert tuple(v.details["categories"]) == ORIGINAL_CATEGORIES  # every class, renamed by detoxify
    probs = v.details["categories"]
    assert all(0.0 <= p <= 1.0 for p in probs.values())
    assert v.score == pytest.approx(1 - max(probs.values()))
    assert v.details["max_category"] == max(probs, key=probs.get)

    local = InProcessModels()
    try:
        w = await DetoxifyEvaluator("tox", cfg, backend=local).evaluate(inp, timeout=180)
    finally:
        await local.aclose()
    assert w.details["categories"] == pytest.approx(probs, abs=1e-5)  # same weights, same code path

    # many concurrent calls on one loaded model give the same answer
    many = await asyncio.gather(*(DetoxifyEvaluator("tox", cfg, backend=pool).evaluate(inp, timeout=180)
                                  for _ in range(24)))
    assert all(m.details["categories"] == pytest.approx(probs, abs=1e-6) for m in many)

    # and the same numbers as running the checkpoint's BERT by hand: the state dict really loaded
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    ckpt = torch.load(tiny_detox.checkpoint, weights_only=False)
    model = BertForSequenceClassification(BertConfig.from_pretrained(tiny_detox.config_dir))
    model.load_state_dict(ckpt["state_dict"])
    tok = BertTokenizer.from_pretrained(tiny_detox.config_dir)
    with torch.no_grad():
        expect = torch.sigmoid(model.eval()(**tok(inp.response, return_tensors="pt")).logits)[0].tolist()
    assert list(probs.values()) == pytest.approx(expect, abs=1e-5)


async def test_detoxify_threshold_categories_and_env(fixed_detox, pool, monkeypatch) -> None:
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CHECKPOINT", fixed_detox.checkpoint)
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CONFIG", fixed_detox.config_dir)
    inp = EvaluationInput("", "have a nice day")
    tox = DetoxifyEvaluator("t", {"model": "detoxify", "threshold": 0.8,
                                  "categories": ["toxicity", "severe_toxicity", "obscene", "threat"]}, backend=pool)
    v = await tox.evaluate(inp, timeout=180)
    assert v.score == pytest.approx(0.1, abs=1e-4)  # 1 - threat(0.9)
    assert v.passed is False and v.violations == ["threat"]
    mild = DetoxifyEvaluator("m", {"model": "detoxify", "threshold": 0.8, "categories": ["toxicity", "insult"]},
                             backend=pool)
    v = await mild.evaluate(inp, timeout=60)
    assert v.score == pytest.approx(0.3, abs=1e-4) and v.passed is True and v.violations == []
    bad = DetoxifyEvaluator("b", {"model": "detoxify", "categories": ["sexual_explicit"]}, backend=pool)
    with pytest.raises(InvalidInputError, match="sexual_explicit"):
        await bad.evaluate(inp, timeout=60)


async def test_prepare_loads_and_validates_before_traffic(fixed_detox, pool) -> None:
    paths = {"checkpoint": fixed_detox.checkpoint, "huggingface_config_path": fixed_detox.config_dir}
    await DetoxifyEvaluator("t", {"model": "detoxify", **paths}, backend=pool).prepare()
    health = await pool.health("detoxify")
    assert any(fixed_detox.checkpoint in x for x in health["loaded"])
    with pytest.raises(InvalidInputError, match="sexual_explicit"):
        await DetoxifyEvaluator("t", {"model": "detoxify", "categories": ["sexual_explicit"], **paths},
                                backend=pool).prepare()
    await LangdetectEvaluator("l", {"model": "langdetect"}, backend=pool).prepare()


async def test_detoxify_missing_checkpoint_is_configuration_error(pool, tmp_path) -> None:
    ev = DetoxifyEvaluator("t", {"model": "detoxify", "checkpoint": str(tmp_path / "none.ckpt"),
                                 "huggingface_config_path": str(tmp_path)}, backend=pool)
    with pytest.raises(ConfigurationError, match=r"checkpoint .*CROSSAUDIT_DETOXIFY_CHECKPOINT"):
        await ev.evaluate(EvaluationInput("", "x"), timeout=60)
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    ev = DetoxifyEvaluator("t", {"model": "detoxify", "checkpoint": str(tmp_path / "bad.ckpt"),
                                 "huggingface_config_path": str(tmp_path)}, backend=pool)
    with pytest.raises(ConfigurationError, match="cannot load"):
        await ev.evaluate(EvaluationInput("", "x"), timeout=180)


async def test_presidio_server_spans_and_env(spacy_dir, pool, monkeypatch) -> None:
    monkeypatch.setenv("CROSSAUDIT_SPACY_MODEL", spacy_dir)
    ev = PresidioEvaluator("pii", {"model": "presidio", "entities": ["PERSON", "EMAIL", "CREDIT_CARD"],
                                   "confidence_threshold": 0.8}, backend=pool)
    v = await ev.evaluate(EvaluationInput("", PII_TEXT), timeout=120)
    assert {(s.label, PII_TEXT[s.start:s.end]) for s in v.spans} == {
        ("EMAIL_ADDRESS", "john@example.com"), ("PERSON", "John Smith"), ("CREDIT_CARD", "4111 1111 1111 1111")}
    assert v.score == 0.0 and v.passed is False
    health = await pool.health("presidio")
    assert health["ready"] and any(spacy_dir in x for x in health["loaded"])


async def test_langdetect_server_and_concurrency(pool) -> None:
    ev = LangdetectEvaluator("lang", {"model": "langdetect", "expected_languages": ["en"]}, backend=pool)
    texts = ["The quick brown fox jumps over the lazy dog near the river bank.",
             "El rápido zorro marrón salta sobre el perro perezoso junto al río."] * 20
    results = await asyncio.gather(*(ev.evaluate(EvaluationInput("", t), timeout=60) for t in texts))
    assert [r.details["detected_language"] for r in results] == ["en", "es"] * 20
    assert [r.passed for r in results] == [True, False] * 20
    assert (await pool.health("langdetect"))["requests"] >= 40


async def test_dead_server_is_restarted(pool) -> None:
    ev = LangdetectEvaluator("lang", {"model": "langdetect"}, backend=pool)
    inp = EvaluationInput("", "Good morning, this is plainly an English sentence.")
    await ev.evaluate(inp, timeout=60)
    pid = pool.running()["langdetect"]
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # bounded: the kill lands within milliseconds
        if pool.running().get("langdetect") != pid:
            break
        await asyncio.sleep(0.05)
    v = await ev.evaluate(inp, timeout=60)
    assert v.details["detected_language"] == "en"
    assert pool.running()["langdetect"] != pid


async def test_tcp_transport_deadline_and_close() -> None:
    pool = ModelServerPool(ModelServerLimits(transport="tcp"))
    try:
        ev = LangdetectEvaluator("lang", {"model": "langdetect"}, backend=pool)
        with pytest.raises(EvaluatorTimeoutError):
            await ev.evaluate(EvaluationInput("", "hello world"), timeout=0.001)  # server still starting
        v = await ev.evaluate(EvaluationInput("", "Guten Morgen, wie geht es Ihnen heute?"), timeout=60)
        assert v.details["detected_language"] == "de"
        health = await pool.health("langdetect")
        assert health["address"].startswith("127.0.0.1:")
        pid = pool.running()["langdetect"]
    finally:
        await pool.aclose()
    assert pool.running() == {}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
