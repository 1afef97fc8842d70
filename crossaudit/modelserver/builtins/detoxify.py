"""The Detoxify builtin's runtime: real ``detoxify.Detoxify`` from local files, no hub.

Its config is :class:`crossaudit.kernel.builtins.detoxify.DetoxifyConfig`. Detoxify loads a
local checkpoint plus a local Hugging Face config/tokenizer directory, located by the
evaluator's config or the ``CROSSAUDIT_DETOXIFY_*`` settings (one pair per variant allowed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from crossaudit.kernel.builtins.detoxify import DetoxifyConfig
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.builtins.base import ModelRuntime, check_exists, path_setting

ENV_DETOXIFY_CHECKPOINT = "CROSSAUDIT_DETOXIFY_CHECKPOINT"
ENV_DETOXIFY_CONFIG = "CROSSAUDIT_DETOXIFY_CONFIG"

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

    kind = DetoxifyConfig.model_kind
    model_paths = {"checkpoint": ENV_DETOXIFY_CHECKPOINT, "huggingface_config_path": ENV_DETOXIFY_CONFIG}
    image_requirements = ("detoxify>=0.5.2,<0.6", "torch>=2.2,<3", "transformers>=4.40,<6")

    @classmethod
    def resolve(cls, cfg: DetoxifyConfig, environ: Mapping[str, str]) -> DetoxifyConfig:
        ckpt = path_setting(
            cfg.checkpoint, ENV_DETOXIFY_CHECKPOINT, "checkpoint", "detoxify", "checkpoint", environ, cfg.variant
        )
        hf = path_setting(
            cfg.huggingface_config_path, ENV_DETOXIFY_CONFIG, "huggingface_config_path", "detoxify",
            "Hugging Face config/tokenizer directory", environ, cfg.variant,
        )
        return cfg.model_copy(update={"checkpoint": ckpt, "huggingface_config_path": hf})

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
