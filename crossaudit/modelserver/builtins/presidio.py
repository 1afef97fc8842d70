"""The Presidio builtin's runtime: an ``AnalyzerEngine`` over a local spaCy pipeline, no download.

Its config is :class:`crossaudit.kernel.builtins.presidio.PresidioConfig`. The pipeline
directory comes from the evaluator's config or ``CROSSAUDIT_SPACY_MODEL``; tldextract (used by
Presidio's e-mail recognizer) is pinned to its bundled suffix-list snapshot.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from crossaudit.kernel.builtins.presidio import PresidioConfig
from crossaudit.kernel.errors import ConfigurationError, EvaluatorError, InvalidInputError
from crossaudit.kernel.results import Span, Verdict
from crossaudit.modelserver.builtins.base import ModelRuntime, check_exists, path_setting

ENV_SPACY_MODEL = "CROSSAUDIT_SPACY_MODEL"
MAX_SPANS = 1_000  # PII findings returned per call; the rest are counted, not listed

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

    kind = PresidioConfig.model_kind
    model_paths = {"spacy_model_path": ENV_SPACY_MODEL}
    image_requirements = ("presidio-analyzer>=2.2.355,<3",)

    @classmethod
    def resolve(cls, cfg: PresidioConfig, environ: Mapping[str, str]) -> PresidioConfig:
        path = path_setting(
            cfg.spacy_model_path, ENV_SPACY_MODEL, "spacy_model_path", "presidio", "spaCy pipeline", environ
        )
        return cfg.model_copy(update={"spacy_model_path": path})

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
