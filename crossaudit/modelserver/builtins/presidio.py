"""The Presidio builtin's runtime: an ``AnalyzerEngine`` over a local spaCy pipeline, no download.

Its config is :class:`crossaudit.kernel.builtins.presidio.PresidioConfig`. The pipeline
directory comes from the evaluator's config or ``CROSSAUDIT_SPACY_MODEL``; tldextract (used by
Presidio's e-mail recognizer) is pinned to its bundled suffix-list snapshot.

With no pipeline available, a *blank* one (``spacy.blank(language)``: a tokenizer, nothing
trained) serves every entity that Presidio finds with patterns (e-mail, phone, SSN, credit card,
IBAN, IP, URL, crypto wallet, numeric dates, ...). Entities that only a named-entity recognizer
finds (:data:`NER_ONLY_ENTITIES`) then have no recognizer: resolution refuses them, so a policy
asking for one fails at validate/deploy time, naming the entity and the fix.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crossaudit.kernel.builtins.presidio import PresidioConfig
from crossaudit.kernel.errors import ConfigurationError, EvaluatorError, InvalidInputError
from crossaudit.kernel.results import Span, Verdict
from crossaudit.modelserver.builtins.base import (
    ModelRequiredError,
    ModelRuntime,
    check_exists,
    path_setting,
    tree_files,
)
from crossaudit.modelserver.locate import find_spacy_pipeline

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
# Labels the NER recognizer drops even with a model (Presidio's own default drops ORGANIZATION:
# too many false positives); the rest are not PII.
_NER_IGNORED = ("ORGANIZATION", "CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY")
# Entities that only the pipeline's NER gives. DATE_TIME is not one: Presidio's DateRecognizer
# finds numeric dates by pattern (written-out dates such as "March 5th" need the NER).
NER_ONLY_ENTITIES = frozenset(_NER_MAPPING.values()) - set(_NER_IGNORED) - {"DATE_TIME"}
BLANK = "blank"  # the load key's model part when no pipeline is available
_SURFACE_LEMMA = "crossaudit_surface_lemma"
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
        import tldextract.tldextract as tx  # presidio-analyzer's own dependency

        tx.TLD_EXTRACTOR = tx.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)
        _tld_pinned = True


def ner_model_required(cfg: PresidioConfig, tried: str = "") -> str | None:
    """Why ``cfg`` cannot run on the blank pipeline (it names entities only NER finds), or None.
    ``tried``: resolution's account of the places it looked and their fixes, which then replaces
    the generic fix (one list of fixes, and a message that fits one error document)."""
    ner = [e for e in cfg.entities if e in NER_ONLY_ENTITIES]
    if not ner:
        return None
    pattern = [e for e in cfg.entities if e not in NER_ONLY_ENTITIES]
    fix = (
        f"set the evaluator's `spacy_model_path` (local use) or the operator setting {ENV_SPACY_MODEL}, or add "
        "a pipeline to the model store with `crossaudit models import` (a local pipeline directory) or "
        "`crossaudit models pull`"
    )
    return (
        f"presidio: {'entity' if len(ner) == 1 else 'entities'} {', '.join(ner)} "
        f"{'needs' if len(ner) == 1 else 'need'} a spaCy pipeline with a named-entity recognizer "
        f"for language {cfg.language!r}, and none is available"
        + (f" ({', '.join(pattern)} need no model)" if pattern else "")
        + (f".\n{tried}" if tried else f": {fix}")
    )


def _blank_pipeline(language: str) -> Any:
    """``spacy.blank(language)`` plus a component that sets each token's lemma to its lower-cased
    text. A blank pipeline has no lemmatizer (every lemma is empty), and Presidio's context
    enhancer matches its recognizers' context words (``ssn``, ``card``, ``phone``, ...) against
    lemmas by substring; lower-cased surface forms match them nearly as well ("numbers" contains
    "number"), missing only irregular forms a lemmatizer would map back."""
    import spacy
    from spacy.language import Language

    if not Language.has_factory(_SURFACE_LEMMA):

        def surface_lemma(doc: Any) -> Any:
            for token in doc:
                token.lemma_ = token.lower_
            return doc

        Language.component(_SURFACE_LEMMA, func=surface_lemma)
    try:
        nlp = spacy.blank(language)
    except (ImportError, KeyError, ValueError) as exc:
        raise ConfigurationError(f"presidio: spaCy has no language {language!r}: {exc}") from None
    nlp.add_pipe(_SURFACE_LEMMA)
    return nlp


class PresidioRuntime(ModelRuntime):
    """Presidio ``AnalyzerEngine`` over a spaCy NLP engine loaded from a local pipeline directory,
    or over a blank pipeline when none is available.

    Pattern recognizers (e-mail, phone, SSN, credit card, ...) need no model; PERSON and other
    NER entities come from the pipeline's ``ents`` (a trained NER or an entity_ruler).
    """

    kind = PresidioConfig.model_kind
    model_paths = {"spacy_model_path": ENV_SPACY_MODEL}
    image_requirements = ("presidio-analyzer>=2.2.355,<3",)
    batching = True  # the base's loop: one executor hop per batch, not per call

    @classmethod
    def resolve(cls, cfg: PresidioConfig, environ: Mapping[str, str]) -> PresidioConfig:
        if cfg.spacy_model_path or environ.get(ENV_SPACY_MODEL):
            path = path_setting(
                cfg.spacy_model_path, ENV_SPACY_MODEL, "spacy_model_path", "presidio", "spaCy pipeline", environ
            )
            return cfg.model_copy(update={"spacy_model_path": path})
        # The model store, an installed spaCy package, a download (only when an entity needs NER).
        found, tried = find_spacy_pipeline(cfg.language, environ, download=ner_model_required(cfg) is not None)
        if found:
            return cfg.model_copy(update={"spacy_model_path": found})
        return cls.without_model(cfg, tried)

    @classmethod
    def without_model(cls, cfg: PresidioConfig, tried: str = "") -> PresidioConfig:
        """Resolution's last branch, when no pipeline is available anywhere: the blank pipeline
        (``spacy_model_path`` None) if every entity is a pattern entity, else ModelRequiredError
        naming the NER entities and the fix (policy validation and deploy report it)."""
        problem = ner_model_required(cfg, tried)
        if problem:
            raise ModelRequiredError(problem, field="entities")
        return cfg.model_copy(update={"spacy_model_path": None})

    def _key(self, cfg: PresidioConfig) -> tuple[str, ...]:
        return (cfg.language, cfg.spacy_model_path or BLANK)

    def _load(self, cfg: PresidioConfig) -> Any:
        if cfg.spacy_model_path:
            check_exists(cfg.spacy_model_path, "spacy_model_path", ENV_SPACY_MODEL, "presidio", directory=True)
        _pin_tldextract_offline()
        if not cfg.spacy_model_path:
            return self._load_blank(cfg)
        from presidio_analyzer import AnalyzerEngine
        from presidio_analyzer.nlp_engine import NlpEngineProvider

        nlp_conf = {
            "nlp_engine_name": "spacy",
            # A path: SpacyNlpEngine only downloads when the name is neither a package nor a path.
            "models": [{"lang_code": cfg.language, "model_name": cfg.spacy_model_path}],
            "ner_model_configuration": {
                "model_to_presidio_entity_mapping": _NER_MAPPING,
                "labels_to_ignore": list(_NER_IGNORED),
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

    @staticmethod
    def _load_blank(cfg: PresidioConfig) -> Any:
        """The pattern recognizers for ``cfg.language`` over a blank pipeline.

        ``SpacyNlpEngine.load`` would ``spacy.load`` (or download) a named model; setting its
        ``nlp`` first makes it loaded, so it only tokenizes with the blank pipeline. Presidio's
        NER recognizer is left out: with nothing trained it would find nothing while claiming
        PERSON, LOCATION and NRP, so those stay unsupported (a clear error, not silence).
        """
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine

        engine = SpacyNlpEngine(
            models=[{"lang_code": cfg.language, "model_name": f"{BLANK}:{cfg.language}"}],
            ner_model_configuration=NerModelConfiguration(
                model_to_presidio_entity_mapping=_NER_MAPPING, labels_to_ignore=list(_NER_IGNORED)
            ),
        )
        engine.nlp = {cfg.language: _blank_pipeline(cfg.language)}
        try:
            registry = RecognizerRegistry(supported_languages=[cfg.language])
            registry.load_predefined_recognizers(languages=[cfg.language], nlp_engine=engine)
            registry.remove_recognizer("SpacyRecognizer")
            return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=[cfg.language])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(
                f"presidio: cannot build the pattern recognizers for language {cfg.language!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def model_files(self, cfg: PresidioConfig, model: Any) -> list[tuple[str, Path]]:
        """Every file of the spaCy pipeline directory; none for the blank pipeline (patterns only)."""
        return tree_files(cfg.spacy_model_path) if cfg.spacy_model_path else []

    def precision(self, cfg: PresidioConfig, model: Any) -> str:
        # spaCy (thinc) runs a trained pipeline's weights in float32; the blank pipeline has none
        return "fp32" if cfg.spacy_model_path else "rules"

    def _analyze(self, model: Any, cfg: PresidioConfig, text: str) -> Verdict:
        if not cfg.spacy_model_path:
            problem = ner_model_required(cfg)  # resolution refuses this first; a direct call lands here
            if problem:
                raise ConfigurationError(problem)
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
        # Without a configured pipeline, the blank English one (what a pattern-only config uses).
        self.model_for(
            PresidioConfig(model="presidio", spacy_model_path=os.path.abspath(path) if path else None)
        )
        return True
