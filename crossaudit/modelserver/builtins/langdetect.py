"""The langdetect builtin's runtime: the package's shipped profiles, so no model files and no image.

Its config is :class:`crossaudit.kernel.builtins.langdetect.LangdetectConfig`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from crossaudit.kernel.builtins.langdetect import LangdetectConfig
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.builtins.base import ModelRuntime, tree_files


class LangdetectRuntime(ModelRuntime):
    """langdetect's shipped profiles (offline), seeded so the same text gives the same answer."""

    kind = LangdetectConfig.model_kind
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

    def model_files(self, cfg: LangdetectConfig, model: Any) -> list[tuple[str, Path]]:
        """The language profiles langdetect ships and ``init_factory`` loads (``langdetect/profiles``)."""
        import langdetect

        return tree_files(Path(langdetect.__file__).parent / "profiles")

    def precision(self, cfg: LangdetectConfig, model: Any) -> str:
        return "fp64"  # naive Bayes over Python floats

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
