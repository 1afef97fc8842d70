"""Builtin evaluators without model servers: config validation, path resolution, dispatch,
and the real Presidio/langdetect runtimes in-process (spaCy pipeline built here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from crossaudit.kernel import dsl
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.pool import InProcessModels
from crossaudit.modelserver.testing import build_spacy_pipeline
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.builtin import (
    DetoxifyEvaluator,
    LangdetectEvaluator,
    PresidioEvaluator,
    build_builtin,
)

PII_TEXT = "Call John Smith at 212-555-1234 or mail john@example.com; SSN 219-09-9999; card 4111 1111 1111 1111."


class RecordingBackend:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def analyze(self, model: str, config: Mapping[str, Any], prompt: str, response: str,
                      context: Mapping[str, Any] | None = None, *, timeout: float) -> Verdict:
        self.calls.append({"model": model, "config": dict(config), "prompt": prompt, "response": response,
                           "timeout": timeout})
        return Verdict(score=1.0)


@pytest.fixture(scope="module")
def spacy_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_spacy_pipeline(tmp_path_factory.mktemp("spacy") / "pipeline")


@pytest.fixture
async def inproc():
    models = InProcessModels()
    yield models
    await models.aclose()


def test_config_validation_and_aliases() -> None:
    ev = PresidioEvaluator("pii", {"model": "presidio", "entities": ["person", "EMAIL", "SSN", "PHONE", "EMAIL"]},
                           backend=RecordingBackend())
    assert ev.config.entities == ("PERSON", "EMAIL_ADDRESS", "US_SSN", "PHONE_NUMBER")
    with pytest.raises(InvalidInputError, match="threshold"):
        DetoxifyEvaluator("t", {"model": "detoxify", "threshold": 1.5})
    with pytest.raises(InvalidInputError, match="variant"):
        DetoxifyEvaluator("t", {"model": "detoxify", "variant": "huge"})
    with pytest.raises(InvalidInputError, match="Extra inputs"):
        LangdetectEvaluator("l", {"model": "langdetect", "expected_language": ["en"]})
    with pytest.raises(InvalidInputError, match="model must be"):
        build_builtin("x", {"model": "perspective"})
    assert isinstance(build_builtin("x", {"model": "langdetect"}), LangdetectEvaluator)


def test_accepts_policy_layer_models() -> None:
    ev = DetoxifyEvaluator("t", dsl.DetoxifyConfig(model="detoxify", categories=["threat", "insult"],
                                                   rate_limit=30, timeout=2))
    assert ev.config.categories == ("threat", "insult") and ev.config.rate_limit == 30
    ev = PresidioEvaluator("p", dsl.PresidioConfig(model="presidio"))
    assert "US_SSN" in ev.config.entities and "EMAIL_ADDRESS" in ev.config.entities


async def test_missing_model_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CROSSAUDIT_DETOXIFY_CHECKPOINT", "CROSSAUDIT_DETOXIFY_CONFIG", "CROSSAUDIT_SPACY_MODEL"):
        monkeypatch.delenv(var, raising=False)
    inp = EvaluationInput("p", "r")
    with pytest.raises(ConfigurationError, match="CROSSAUDIT_DETOXIFY_CHECKPOINT") as info:
        await DetoxifyEvaluator("t", {"model": "detoxify"}, backend=RecordingBackend()).evaluate(inp, timeout=1)
    assert "checkpoint" in str(info.value) and info.value.retryable is False
    with pytest.raises(ConfigurationError, match="CROSSAUDIT_DETOXIFY_CONFIG"):
        DetoxifyEvaluator("t", {"model": "detoxify", "checkpoint": "/x.ckpt"}).check()
    with pytest.raises(ConfigurationError, match=r"spacy_model_path.*CROSSAUDIT_SPACY_MODEL"):
        PresidioEvaluator("p", {"model": "presidio"}).check()
    LangdetectEvaluator("l", {"model": "langdetect"}).check()  # ships its profiles: nothing to find


def test_detoxify_variant_specific_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CHECKPOINT", "/m/original.ckpt")
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CHECKPOINT_MULTILINGUAL", "/m/multi.ckpt")
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CONFIG", "/m/hf")
    multi = DetoxifyEvaluator("t", {"model": "detoxify", "variant": "multilingual"}).resolved_config()
    assert multi.checkpoint == "/m/multi.ckpt" and multi.huggingface_config_path == "/m/hf"
    orig = DetoxifyEvaluator("t", {"model": "detoxify"}).resolved_config()
    assert orig.checkpoint == "/m/original.ckpt"
    mine = DetoxifyEvaluator("t", {"model": "detoxify", "variant": "multilingual", "checkpoint": "/x.ckpt"})
    assert mine.resolved_config().checkpoint == "/x.ckpt"


async def test_dispatch_resolves_env_paths_and_applies_timeout(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CROSSAUDIT_SPACY_MODEL", str(tmp_path / "pipe"))
    backend = RecordingBackend()
    ev = PresidioEvaluator("p", {"model": "presidio", "timeout": 0.5, "entities": ["EMAIL"]}, backend=backend)
    await ev.evaluate(EvaluationInput("q", "a", {"user": {"id": 1}}), timeout=5)
    call = backend.calls[0]
    assert call["model"] == "presidio" and call["timeout"] == pytest.approx(0.5)
    assert call["config"]["spacy_model_path"] == str(tmp_path / "pipe")
    assert call["config"]["entities"] == ["EMAIL_ADDRESS"]
    assert "timeout" not in call["config"] and "rate_limit" not in call["config"]


def test_model_roots_confine_paths(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CROSSAUDIT_MODEL_ROOTS", str(tmp_path / "models"))
    with pytest.raises(ConfigurationError, match="CROSSAUDIT_MODEL_ROOTS"):
        PresidioEvaluator("p", {"model": "presidio", "spacy_model_path": str(tmp_path / "elsewhere")}).check()
    with pytest.raises(ConfigurationError, match="outside"):
        PresidioEvaluator("p", {"model": "presidio", "spacy_model_path": str(tmp_path / "models/../x")}).check()
    PresidioEvaluator("p", {"model": "presidio", "spacy_model_path": str(tmp_path / "models" / "en")}).check()


def test_identity_follows_config() -> None:
    a = DetoxifyEvaluator("t", {"model": "detoxify", "threshold": 0.5})
    b = DetoxifyEvaluator("t", {"model": "detoxify", "threshold": 0.6})
    assert a.identity() != b.identity() and a.identity().startswith("builtin:detoxify:t:")


async def test_presidio_in_process_finds_entities_with_spans(spacy_dir: str, inproc: InProcessModels) -> None:
    ev = PresidioEvaluator(
        "pii",
        {"model": "presidio", "spacy_model_path": spacy_dir, "confidence_threshold": 0.3,
         "entities": ["PERSON", "EMAIL", "PHONE_NUMBER", "SSN", "CREDIT_CARD"]},
        backend=inproc,
    )
    v = await ev.evaluate(EvaluationInput("", PII_TEXT), timeout=30)
    found = {(s.label, PII_TEXT[s.start:s.end]) for s in v.spans}
    assert ("PERSON", "John Smith") in found
    assert ("EMAIL_ADDRESS", "john@example.com") in found
    assert ("PHONE_NUMBER", "212-555-1234") in found
    assert ("US_SSN", "219-09-9999") in found
    assert ("CREDIT_CARD", "4111 1111 1111 1111") in found
    assert v.score == pytest.approx(0.0)  # e-mail and card are certain: 1 - 1.0
    assert v.passed is False
    assert set(v.violations) == {"PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN", "CREDIT_CARD"}
    assert "john@example.com" not in str(v.details)  # details never carry the PII itself


async def test_presidio_threshold_drops_weak_findings(spacy_dir: str, inproc: InProcessModels) -> None:
    cfg = {"model": "presidio", "spacy_model_path": spacy_dir, "entities": ["PERSON", "PHONE"],
           "confidence_threshold": 0.8}
    v = await PresidioEvaluator("pii", cfg, backend=inproc).evaluate(EvaluationInput("", PII_TEXT), timeout=30)
    assert [s.label for s in v.spans] == ["PERSON"]  # the phone (0.4 without context words) is ignored
    assert v.score == pytest.approx(1 - v.spans[0].score)
    clean = await PresidioEvaluator("pii", cfg, backend=inproc).evaluate(
        EvaluationInput("", "The weather is nice today."), timeout=30)
    assert clean.score == 1.0 and clean.passed is True and clean.spans == []


async def test_presidio_other_language(tmp_path, inproc: InProcessModels) -> None:
    es = build_spacy_pipeline(tmp_path / "es", lang="es", persons=["Maria Garcia"])
    text = "Hola Maria Garcia, escribe a maria@example.com"
    v = await PresidioEvaluator("pii", {"model": "presidio", "spacy_model_path": es, "language": "es",
                                        "entities": ["PERSON", "EMAIL"]}, backend=inproc).evaluate(
        EvaluationInput("", text), timeout=30)
    assert {(s.label, text[s.start:s.end]) for s in v.spans} == {
        ("PERSON", "Maria Garcia"), ("EMAIL_ADDRESS", "maria@example.com")}


async def test_presidio_unknown_entity_is_invalid(spacy_dir: str, inproc: InProcessModels) -> None:
    ev = PresidioEvaluator("pii", {"model": "presidio", "spacy_model_path": spacy_dir, "entities": ["DNA"]},
                           backend=inproc)
    with pytest.raises(InvalidInputError, match="DNA"):
        await ev.evaluate(EvaluationInput("", "x"), timeout=30)


@pytest.mark.parametrize(
    ("text", "lang"),
    [("This is a perfectly ordinary English sentence about the weather.", "en"),
     ("Esta es una frase completamente normal sobre el tiempo que hace hoy.", "es"),
     ("Ceci est une phrase tout à fait ordinaire sur le temps qu'il fait.", "fr"),
     ("Dies ist ein ganz normaler deutscher Satz über das Wetter von heute.", "de")],
)
async def test_langdetect_in_process(text: str, lang: str, inproc: InProcessModels) -> None:
    v = await LangdetectEvaluator("lang", {"model": "langdetect"}, backend=inproc).evaluate(
        EvaluationInput("", text), timeout=30)
    assert v.details["detected_language"] == lang
    assert v.score == pytest.approx(v.details["candidates"][0]["probability"]) and v.score > 0.8
    assert v.passed is None


async def test_langdetect_expected_languages_and_determinism(inproc: InProcessModels) -> None:
    ev = LangdetectEvaluator("lang", {"model": "langdetect", "expected_languages": ["EN", "es"]}, backend=inproc)
    fr = EvaluationInput("", "Bonjour à tous, comment allez-vous aujourd'hui ?")
    v = await ev.evaluate(fr, timeout=30)
    assert v.passed is False and v.violations == ["unexpected language: fr"] and v.score < 0.2
    ok = await ev.evaluate(EvaluationInput("", "Good morning everyone, how are you today?"), timeout=30)
    assert ok.passed is True and ok.score > 0.8
    short = EvaluationInput("", "ok sure")
    first = await ev.evaluate(short, timeout=30)
    for _ in range(5):
        assert (await ev.evaluate(short, timeout=30)).details == first.details
    empty = await ev.evaluate(EvaluationInput("", "  12345 "), timeout=30)
    assert empty.details["detected_language"] == "unknown" and empty.score == 0.0 and empty.passed is False


async def test_prompt_text_option(inproc: InProcessModels) -> None:
    ev = LangdetectEvaluator("lang", {"model": "langdetect", "text": "prompt"}, backend=inproc)
    v = await ev.evaluate(EvaluationInput("Hola, ¿cómo estás? Todo bien por aquí.", "Hello there, all good."),
                          timeout=30)
    assert v.details["detected_language"] == "es"
