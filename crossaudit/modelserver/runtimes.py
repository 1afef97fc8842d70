"""The model code of the builtin evaluators: load once, score many texts.

A runtime is synchronous and thread-safe for ``analyze`` (the model server runs it in a
bounded thread pool). Heavy imports (torch, detoxify, presidio, spaCy) happen inside
``_load`` so importing this module stays cheap and a missing extra is a clear
ConfigurationError, not an ImportError at startup.

Nothing here reaches the network: Detoxify loads a local checkpoint plus a local Hugging
Face config/tokenizer directory, Presidio a local spaCy pipeline directory, and tldextract
(used by Presidio's e-mail recognizer) is pinned to its bundled suffix-list snapshot.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar

from crossaudit.kernel.errors import ConfigurationError, EvaluatorError, InvalidInputError
from crossaudit.kernel.results import Span, Verdict
from crossaudit.modelserver.config import (
    ENV_DETOXIFY_CHECKPOINT,
    ENV_DETOXIFY_CONFIG,
    ENV_SPACY_MODEL,
    DetoxifyConfig,
    LangdetectConfig,
    PresidioConfig,
    check_exists,
    parse_config,
)

MAX_LOADED_MODELS = 4  # distinct model instances (paths/variants) one server keeps in memory
MAX_SPANS = 1_000  # PII findings returned per call; the rest are counted, not listed


def _text(cfg: Any, prompt: str, response: str) -> str:
    return prompt if cfg.text == "prompt" else response


class ModelRuntime(abc.ABC):
    """One model kind. Instances are cached per load key (paths, variant), LRU-bounded."""

    kind: ClassVar[str]

    def __init__(self, max_loaded: int = MAX_LOADED_MODELS) -> None:
        self._models: OrderedDict[tuple[str, ...], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, ...], threading.Lock] = {}
        self._max_loaded = max_loaded
        self.load_ms: dict[tuple[str, ...], float] = {}

    @abc.abstractmethod
    def _key(self, cfg: Any) -> tuple[str, ...]: ...

    @abc.abstractmethod
    def _load(self, cfg: Any) -> Any: ...

    @abc.abstractmethod
    def _analyze(self, model: Any, cfg: Any, text: str) -> Verdict: ...

    def model_for(self, cfg: Any) -> Any:
        """The loaded model for ``cfg``, loading it once even under concurrent first calls."""
        key = self._key(cfg)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._models:
                    return self._models[key]
            t0 = time.perf_counter()
            model = self._load(cfg)
            with self._lock:
                self.load_ms[key] = (time.perf_counter() - t0) * 1000
                self._models[key] = model
                while len(self._models) > self._max_loaded:
                    old, _ = self._models.popitem(last=False)
                    self.load_ms.pop(old, None)
            return model

    def analyze(self, config: Mapping[str, Any] | Any, prompt: str, response: str) -> Verdict:
        cfg = parse_config(self.kind, config)
        model = self.model_for(cfg)
        return self._analyze(model, cfg, _text(cfg, prompt, response))

    def preload_from_env(self) -> bool:
        """Import the model stack and load the model named by the environment, if any (warm start)."""
        return False

    def loaded(self) -> list[str]:
        with self._lock:
            return [":".join(k) for k in self._models]


# --- detoxify ---------------------------------------------------------------------------


_detox_lock = threading.Lock()


def _import_detoxify() -> Any:
    """Import detoxify and make its loader honour ``huggingface_config_path`` fully.

    ``detoxify.detoxify.get_model_and_tokenizer`` first calls
    ``config_class.from_pretrained(model_type)`` with the checkpoint's hub name (for example
    ``bert-base-uncased``) even when a local config directory is given, and then ignores that
    config. Offline that call fails, so when a local directory is given we pass it as
    ``model_type`` too: every read then comes from the directory; the rest of detoxify's
    loading (checkpoint format, class names, state dict, tokenizer) runs unchanged.
    """
    with _detox_lock:
        try:
            import detoxify.detoxify as dd  # torch + transformers come with it
        except ImportError as exc:
            raise ConfigurationError(
                f"detoxify is not installed ({exc}); install the model extras with `make models`"
            ) from None
        if not getattr(dd.get_model_and_tokenizer, "_crossaudit_offline", False):
            upstream = dd.get_model_and_tokenizer

            def offline(model_type, model_name, tokenizer_name, num_classes, state_dict, huggingface_config_path=None):
                return upstream(
                    huggingface_config_path or model_type, model_name, tokenizer_name, num_classes, state_dict,
                    huggingface_config_path=huggingface_config_path,
                )

            offline._crossaudit_offline = True  # type: ignore[attr-defined]
            dd.get_model_and_tokenizer = offline
    return dd


class DetoxifyRuntime(ModelRuntime):
    """Real ``detoxify.Detoxify`` loaded from a local checkpoint + local HF config directory.

    The checkpoint is Detoxify's own format: ``{"config": {"arch": {"args": {model_type,
    model_name, tokenizer_name, num_classes}}, "dataset": {"args": {"classes": [...]}}},
    "state_dict": {...}}``; ``huggingface_config_path`` holds ``config.json`` and the tokenizer
    files, read with ``local_files_only`` so no hub is contacted.
    """

    kind = "detoxify"

    def _key(self, cfg: DetoxifyConfig) -> tuple[str, ...]:
        # With an explicit checkpoint Detoxify ignores the variant name while loading: the files
        # are the model, so one load serves every variant label that points at them.
        return (cfg.checkpoint or "", cfg.huggingface_config_path or "")

    def _load(self, cfg: DetoxifyConfig) -> Any:
        if not cfg.checkpoint or not cfg.huggingface_config_path:
            raise ConfigurationError(
                f"detoxify: checkpoint and huggingface_config_path must be set "
                f"(evaluator config or {ENV_DETOXIFY_CHECKPOINT} / {ENV_DETOXIFY_CONFIG})"
            )
        check_exists(cfg.checkpoint, "checkpoint", ENV_DETOXIFY_CHECKPOINT, "detoxify", directory=False)
        check_exists(
            cfg.huggingface_config_path, "huggingface_config_path", ENV_DETOXIFY_CONFIG, "detoxify", directory=True
        )
        detoxify = _import_detoxify()
        # Belt and braces: transformers must never try a hub from a model server.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            model = detoxify.Detoxify(
                cfg.variant, checkpoint=cfg.checkpoint, huggingface_config_path=cfg.huggingface_config_path
            )
        except Exception as exc:  # unpickling, missing keys, shape mismatch...: all mean "bad model files"
            raise ConfigurationError(
                f"detoxify: cannot load checkpoint {cfg.checkpoint!r} with config {cfg.huggingface_config_path!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return _Locked(model)

    def _analyze(self, model: Any, cfg: DetoxifyConfig, text: str) -> Verdict:
        import torch

        # One call at a time per model: Hugging Face fast tokenizers raise "Already borrowed"
        # when two threads set truncation/padding at once, and torch's intra-op threads already
        # use every core for one call.
        with model.lock, torch.inference_mode():
            raw = model.inner.predict(text)
        probs = {str(k): float(v[0] if isinstance(v, list | tuple) else v) for k, v in raw.items()}
        selected = list(cfg.categories) or list(probs)
        unknown = [c for c in selected if c not in probs]
        if unknown:
            raise InvalidInputError(
                f"detoxify: unknown categories {unknown}; this checkpoint predicts {sorted(probs)}"
            )
        chosen = {c: min(1.0, max(0.0, probs[c])) for c in selected}
        top = max(chosen, key=lambda c: chosen[c])
        top_p = chosen[top]
        violations = [c for c in selected if chosen[c] >= cfg.threshold]
        return Verdict(
            score=1.0 - top_p,
            passed=top_p < cfg.threshold,
            violations=violations,
            details={
                "categories": chosen,
                "max_category": top,
                "max_probability": top_p,
                "threshold": cfg.threshold,
                "variant": cfg.variant,
                "checkpoint": os.path.basename(cfg.checkpoint or ""),
            },
        )

    def preload_from_env(self) -> bool:
        _import_detoxify()  # torch + transformers: seconds, paid before the server reports ready
        ckpt, hf = os.environ.get(ENV_DETOXIFY_CHECKPOINT), os.environ.get(ENV_DETOXIFY_CONFIG)
        if not (ckpt and hf):
            return False
        self.model_for(DetoxifyConfig(model="detoxify", checkpoint=os.path.abspath(ckpt),
                                      huggingface_config_path=os.path.abspath(hf)))
        return True


class _Locked:
    """A model that must not run two calls at once."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()


# --- presidio ---------------------------------------------------------------------------

_NER_MAPPING = {
    "PER": "PERSON",
    "PERSON": "PERSON",
    "NORP": "NRP",
    "FAC": "LOCATION",
    "LOC": "LOCATION",
    "GPE": "LOCATION",
    "LOCATION": "LOCATION",
    "ORG": "ORGANIZATION",
    "ORGANIZATION": "ORGANIZATION",
    "DATE": "DATE_TIME",
    "TIME": "DATE_TIME",
}
_tld_lock = threading.Lock()
_tld_pinned = False


def _pin_tldextract_offline() -> None:
    """Presidio's e-mail recognizer calls ``tldextract.extract``, whose default extractor
    downloads the public-suffix list on first use. Replace it with one that only reads the
    snapshot bundled in the package: same answers, no outbound request."""
    global _tld_pinned
    with _tld_lock:
        if _tld_pinned:
            return
        try:
            import tldextract.tldextract as tx
        except ImportError:
            _tld_pinned = True
            return
        tx.TLD_EXTRACTOR = tx.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)
        _tld_pinned = True


class PresidioRuntime(ModelRuntime):
    """Presidio ``AnalyzerEngine`` over a spaCy NLP engine loaded from a local pipeline directory.

    Pattern recognizers (e-mail, phone, SSN, credit card, ...) need no model; PERSON and other
    NER entities come from the pipeline's ``ents`` (a trained NER or an entity_ruler).
    """

    kind = "presidio"

    def _key(self, cfg: PresidioConfig) -> tuple[str, ...]:
        return (cfg.language, cfg.spacy_model_path or "")

    def _load(self, cfg: PresidioConfig) -> Any:
        if not cfg.spacy_model_path:
            raise ConfigurationError(
                f"presidio: spacy_model_path must be set (evaluator config or {ENV_SPACY_MODEL})"
            )
        check_exists(cfg.spacy_model_path, "spacy_model_path", ENV_SPACY_MODEL, "presidio", directory=True)
        _pin_tldextract_offline()
        from presidio_analyzer import AnalyzerEngine
        from presidio_analyzer.nlp_engine import NlpEngineProvider

        nlp_conf = {
            "nlp_engine_name": "spacy",
            # A path: SpacyNlpEngine only downloads when the name is neither a package nor a path.
            "models": [{"lang_code": cfg.language, "model_name": cfg.spacy_model_path}],
            "ner_model_configuration": {
                "model_to_presidio_entity_mapping": _NER_MAPPING,
                "labels_to_ignore": ["ORGANIZATION", "CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY"],
            },
        }
        try:
            engine = NlpEngineProvider(nlp_configuration=nlp_conf).create_engine()
            return AnalyzerEngine(nlp_engine=engine, supported_languages=[cfg.language])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(
                f"presidio: cannot load spaCy pipeline {cfg.spacy_model_path!r} for language {cfg.language!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def _analyze(self, model: Any, cfg: PresidioConfig, text: str) -> Verdict:
        supported = set(model.get_supported_entities(language=cfg.language))
        unknown = [e for e in cfg.entities if e not in supported]
        if unknown:
            raise InvalidInputError(f"presidio: unsupported entities {unknown}; supported: {sorted(supported)}")
        try:
            results = model.analyze(text=text, language=cfg.language, entities=list(cfg.entities))
        except ValueError as exc:
            raise EvaluatorError(f"presidio: analysis failed: {exc}") from None
        found = sorted(
            (r for r in results if r.score >= cfg.confidence_threshold), key=lambda r: (r.start, -r.score)
        )
        top = max((float(r.score) for r in found), default=0.0)
        counts: dict[str, int] = {}
        for r in found:
            counts[r.entity_type] = counts.get(r.entity_type, 0) + 1
        spans = [
            Span(start=r.start, end=r.end, label=r.entity_type, score=min(1.0, max(0.0, float(r.score))))
            for r in found[:MAX_SPANS]
        ]
        return Verdict(
            score=1.0 - min(1.0, top),
            passed=not found,
            violations=sorted(counts),
            # Never the matched text itself: details end up in audit logs.
            details={
                "entities": [
                    {"type": s.label, "start": s.start, "end": s.end, "score": s.score} for s in spans
                ],
                "counts": counts,
                "max_confidence": top,
                "confidence_threshold": cfg.confidence_threshold,
                "text": cfg.text,
                "truncated": len(found) > MAX_SPANS,
            },
            spans=spans,
        )

    def preload_from_env(self) -> bool:
        _pin_tldextract_offline()
        import presidio_analyzer  # noqa: F401  (spaCy with it: paid before the server reports ready)

        path = os.environ.get(ENV_SPACY_MODEL)
        if not path:
            return False
        self.model_for(PresidioConfig(model="presidio", spacy_model_path=os.path.abspath(path)))
        return True


# --- langdetect -------------------------------------------------------------------------


class LangdetectRuntime(ModelRuntime):
    """langdetect's shipped profiles (offline), seeded so the same text gives the same answer."""

    kind = "langdetect"
    _init_lock = threading.Lock()

    def _key(self, cfg: LangdetectConfig) -> tuple[str, ...]:
        return ("profiles",)

    def _load(self, cfg: LangdetectConfig) -> Any:
        from langdetect import DetectorFactory
        from langdetect.detector_factory import init_factory

        with self._init_lock:
            DetectorFactory.seed = 0
            init_factory()  # loads the language profiles once
        from langdetect import detector_factory

        return detector_factory._factory

    def _analyze(self, factory: Any, cfg: LangdetectConfig, text: str) -> Verdict:
        from langdetect.lang_detect_exception import LangDetectException

        try:
            detector = factory.create()
            detector.append(text)
            candidates = [(str(c.lang), float(c.prob)) for c in detector.get_probabilities()]
        except LangDetectException:
            candidates = []
        top_lang, top_p = candidates[0] if candidates else ("unknown", 0.0)
        listed = [{"language": lang, "probability": p} for lang, p in candidates[: cfg.max_candidates]]
        details: dict[str, Any] = {"detected_language": top_lang, "confidence": top_p, "candidates": listed}
        if not cfg.expected_languages:
            return Verdict(score=min(1.0, top_p), passed=None, details=details)
        probs = dict(candidates)
        best = max(cfg.expected_languages, key=lambda lang: probs.get(lang, 0.0))
        score = min(1.0, probs.get(best, 0.0))
        ok = top_lang in cfg.expected_languages
        details["expected_languages"] = list(cfg.expected_languages)
        return Verdict(
            score=score,
            passed=ok,
            violations=[] if ok else [f"unexpected language: {top_lang}"],
            details=details,
        )

    def preload_from_env(self) -> bool:
        self.model_for(LangdetectConfig(model="langdetect"))
        return True


RUNTIMES: dict[str, type[ModelRuntime]] = {r.kind: r for r in (DetoxifyRuntime, PresidioRuntime, LangdetectRuntime)}


def runtime_for(kind: str) -> ModelRuntime:
    cls = RUNTIMES.get(kind)
    if cls is None:
        raise InvalidInputError(f"unknown builtin model {kind!r} (expected one of {sorted(RUNTIMES)})")
    return cls()
