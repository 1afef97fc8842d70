"""The one registry of builtin evaluators: name → config class, one module per builtin.

Why a builtin is split in two: its *config* is a DSL type (validated when a policy loads, in
any layer, with no model code) while its *runtime* loads torch or spaCy and must only ever run
in a model server. The layering keeps the halves apart: the kernel imports nothing else of
CrossAudit, a model server (and its image, which copies ``kernel``, ``v1`` and ``modelserver``
whole) imports only the kernel and the protos, and the orchestrator must never load a model.
So each builtin is this package's ``<name>.py`` (its config) plus
``crossaudit.modelserver.builtins.<name>`` (its runtime, model files and image), and the names
are listed once, in :data:`BuiltinConfig` here. Everything else derives from
:data:`BUILTIN_MODELS`: policy validation and type inference, the JSON Schema, the
orchestrator's adapters, and the model server's runtimes (which must cover exactly these names,
checked when ``crossaudit.modelserver.builtins`` is imported).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from crossaudit.kernel.builtins.base import MAX_LISTED, BuiltinConfigBase
from crossaudit.kernel.builtins.detoxify import DetoxifyConfig
from crossaudit.kernel.builtins.langdetect import LangdetectConfig
from crossaudit.kernel.builtins.presidio import PresidioConfig
from crossaudit.kernel.errors import InvalidInputError

__all__ = [
    "BUILTIN_MODELS",
    "MAX_LISTED",
    "BuiltinConfig",
    "BuiltinConfigBase",
    "DetoxifyConfig",
    "LangdetectConfig",
    "PresidioConfig",
    "parse_config",
]

# The builtins, in the order policies' JSON Schema lists them.
BuiltinConfig = DetoxifyConfig | PresidioConfig | LangdetectConfig
BUILTIN_MODELS: dict[str, type[BuiltinConfigBase]] = {c.model_kind: c for c in get_args(BuiltinConfig)}


def parse_config(kind: str, raw: Mapping[str, Any] | BaseModel) -> Any:
    """Validate ``raw`` as the config of builtin ``kind``; InvalidInputError lists every problem."""
    cls = BUILTIN_MODELS.get(kind)
    if cls is None:
        raise InvalidInputError(f"unknown builtin model {kind!r} (expected one of {sorted(BUILTIN_MODELS)})")
    if isinstance(raw, cls):
        return raw
    data = raw.model_dump(mode="json", exclude_none=True) if isinstance(raw, BaseModel) else dict(raw)
    data.setdefault("model", kind)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(f"invalid {kind} builtin config: {problems}") from None
