"""Validated configs of the builtin evaluators, shared by the orchestrator and the model servers.

Pure pydantic, no model imports: the orchestrator validates a policy's ``config:`` mapping
here (so a typo fails before any model loads) and the model server re-validates the JSON it
receives. Model paths may come from the config or from the environment; the orchestrator
resolves them (:func:`resolve_paths`) so the server receives absolute, explicit settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from crossaudit.kernel.dsl import (
    BUILTIN_MODELS,
    BuiltinConfigBase,
    DetoxifyConfig,
    LangdetectConfig,
    PresidioConfig,
)
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError

ENV_DETOXIFY_CHECKPOINT = "CROSSAUDIT_DETOXIFY_CHECKPOINT"
ENV_DETOXIFY_CONFIG = "CROSSAUDIT_DETOXIFY_CONFIG"
ENV_SPACY_MODEL = "CROSSAUDIT_SPACY_MODEL"
# Optional allowlist of directories model files may come from (os.pathsep-separated). Detoxify
# checkpoints are pickles, so an operator who lets policy authors set ``checkpoint`` should
# confine it to trusted model directories.
ENV_MODEL_ROOTS = "CROSSAUDIT_MODEL_ROOTS"

# One definition of the builtin configs: the policy layer's (pure pydantic, no model imports).
CONFIGS: dict[str, type[BuiltinConfigBase]] = dict(BUILTIN_MODELS)
BuiltinConfig = DetoxifyConfig | PresidioConfig | LangdetectConfig


def parse_config(kind: str, raw: Mapping[str, Any] | BaseModel) -> Any:
    """Validate ``raw`` as the config of builtin ``kind``; InvalidInputError lists every problem."""
    cls = CONFIGS.get(kind)
    if cls is None:
        raise InvalidInputError(f"unknown builtin model {kind!r} (expected one of {sorted(CONFIGS)})")
    if isinstance(raw, cls):
        return raw
    data = raw.model_dump(mode="json", exclude_none=True) if isinstance(raw, BaseModel) else dict(raw)
    data.setdefault("model", kind)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(f"invalid {kind} builtin config: {problems}") from None


def _setting(
    value: str | None, env: str, field: str, kind: str, what: str, environ: Mapping[str, str], variant: str = ""
) -> str:
    """Config first, then ``ENV_<VARIANT>`` (one model per Detoxify variant), then ``ENV``."""
    path = value or (environ.get(f"{env}_{variant.upper()}", "") if variant else "") or environ.get(env, "")
    if not path:
        raise ConfigurationError(
            f"{kind}: no {what} configured: set the evaluator's `{field}` or the {env} environment variable "
            "(model hubs are not reachable, so the model must be a local path)"
        )
    return os.path.abspath(os.path.expanduser(path))


def resolve_paths(cfg: Any, environ: Mapping[str, str] | None = None) -> Any:
    """Fill model paths from the environment; ConfigurationError names the missing setting."""
    environ = os.environ if environ is None else environ
    resolved = _resolve(cfg, environ)
    roots = [os.path.realpath(r) for r in environ.get(ENV_MODEL_ROOTS, "").split(os.pathsep) if r.strip()]
    if roots:
        for field in ("checkpoint", "huggingface_config_path", "spacy_model_path"):
            path = getattr(resolved, field, None)
            if path and not any(
                os.path.commonpath([os.path.realpath(path), root]) == root for root in roots
            ):
                raise ConfigurationError(
                    f"{resolved.model_kind}: {field} {path!r} is outside the model directories "
                    f"allowed by {ENV_MODEL_ROOTS}"
                )
    return resolved


def _resolve(cfg: Any, environ: Mapping[str, str]) -> Any:
    if isinstance(cfg, DetoxifyConfig):
        ckpt = _setting(
            cfg.checkpoint, ENV_DETOXIFY_CHECKPOINT, "checkpoint", "detoxify", "checkpoint", environ, cfg.variant
        )
        hf = _setting(
            cfg.huggingface_config_path, ENV_DETOXIFY_CONFIG, "huggingface_config_path", "detoxify",
            "Hugging Face config/tokenizer directory", environ, cfg.variant,
        )
        return cfg.model_copy(update={"checkpoint": ckpt, "huggingface_config_path": hf})
    if isinstance(cfg, PresidioConfig):
        path = _setting(
            cfg.spacy_model_path, ENV_SPACY_MODEL, "spacy_model_path", "presidio", "spaCy pipeline", environ
        )
        return cfg.model_copy(update={"spacy_model_path": path})
    return cfg


def check_exists(path: str, field: str, env: str, kind: str, *, directory: bool) -> None:
    """Raise ConfigurationError when a resolved model path is missing (names the setting)."""
    ok = os.path.isdir(path) if directory else os.path.isfile(path)
    if not ok:
        what = "directory" if directory else "file"
        raise ConfigurationError(
            f"{kind}: {field} {path!r} is not an existing {what} (set the evaluator's `{field}` or {env})"
        )
