"""The builtins' runtimes, registered against the names of :mod:`crossaudit.kernel.builtins`.

Each builtin has one module here, named after it (its model code, model files and image), next
to its config module in the kernel; the kernel's docstring says why the two halves are split.
This package only checks that the halves match (one runtime for each registered config, no
other) and answers the questions the other layers ask of a builtin by name: which runtime
serves it, and where its model files are. It imports no model stack: heavy imports happen
inside the runtimes when a model loads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crossaudit.kernel.builtins import BUILTIN_MODELS
from crossaudit.kernel.errors import ConfigurationError, CrossAuditError, InvalidInputError
from crossaudit.modelserver.builtins.base import ModelRequiredError, ModelRuntime
from crossaudit.modelserver.builtins.detoxify import DetoxifyRuntime
from crossaudit.modelserver.builtins.langdetect import LangdetectRuntime
from crossaudit.modelserver.builtins.presidio import PresidioRuntime
from crossaudit.modelserver.locate import OFFLINE_SKIPPED, without_places
from crossaudit.modelserver.sources import ENV_OFFLINE, offline_setting

__all__ = [
    "ENV_MODEL_ROOTS",
    "RUNTIMES",
    "ModelRequiredError",
    "ModelRuntime",
    "OfflineProblem",
    "model_path_settings",
    "model_problem",
    "offline_problem",
    "resolve_paths",
    "runtime_for",
]

# Optional allowlist of directories model files may come from (os.pathsep-separated). Detoxify
# checkpoints are pickles, so an operator who lets policy authors set ``checkpoint`` should
# confine it to trusted model directories.
ENV_MODEL_ROOTS = "CROSSAUDIT_MODEL_ROOTS"

_REGISTERED: dict[str, type[ModelRuntime]] = {
    r.kind: r for r in (DetoxifyRuntime, PresidioRuntime, LangdetectRuntime)
}
if _REGISTERED.keys() != BUILTIN_MODELS.keys():
    raise ImportError(
        f"builtin configs {sorted(BUILTIN_MODELS)} and runtimes {sorted(_REGISTERED)} differ: "
        "each builtin needs one module in crossaudit/kernel/builtins and one in crossaudit/modelserver/builtins"
    )
# In the registry's order.
RUNTIMES: dict[str, type[ModelRuntime]] = {name: _REGISTERED[name] for name in BUILTIN_MODELS}


def runtime_for(kind: str) -> ModelRuntime:
    cls = RUNTIMES.get(kind)
    if cls is None:
        raise InvalidInputError(f"unknown builtin model {kind!r} (expected one of {sorted(RUNTIMES)})")
    return cls()


def model_path_settings() -> dict[str, str]:
    """Every builtin config field that names a model file → the environment variable supplying it."""
    return {field: env for runtime in RUNTIMES.values() for field, env in runtime.model_paths.items()}


def resolve_paths(cfg: Any, environ: Mapping[str, str] | None = None) -> Any:
    """Fill model paths from the environment; ConfigurationError names the missing setting.

    Runs in the orchestrator, so the model server receives absolute, explicit settings; with
    :data:`ENV_MODEL_ROOTS` set, every model path must lie inside one of its directories.
    """
    environ = os.environ if environ is None else environ
    runtime = RUNTIMES[cfg.model_kind]
    resolved = runtime.resolve(cfg, environ)
    roots = [os.path.realpath(r) for r in environ.get(ENV_MODEL_ROOTS, "").split(os.pathsep) if r.strip()]
    if roots:
        for field in runtime.model_paths:
            path = getattr(resolved, field, None)
            if path and not any(
                os.path.commonpath([os.path.realpath(path), root]) == root for root in roots
            ):
                raise ConfigurationError(
                    f"{resolved.model_kind}: {field} {path!r} is outside the model directories "
                    f"allowed by {ENV_MODEL_ROOTS}"
                )
    return resolved


def model_problem(cfg: Any, environ: Mapping[str, str] | None = None) -> ModelRequiredError | None:
    """Why no model available under ``environ`` can serve ``cfg``, or None: the runtime's own
    resolution, for validate/deploy time. Only ModelRequiredError counts here; other resolution
    errors (a path outside the allowed roots, ...) keep failing the evaluator's calls, naming
    the setting, as before.

    It looks but never downloads: resolution runs in offline mode, so validating or deploying
    a policy cannot start a pull of hundreds of megabytes. A model that is missing locally but
    downloadable (offline mode off) counts as available; it is fetched into the store by the
    first call that needs it, or ahead of time with ``crossaudit models pull``.
    """
    environ = os.environ if environ is None else environ
    try:
        resolve_paths(cfg, {**environ, ENV_OFFLINE: "1"})
    except ModelRequiredError as exc:
        return exc if offline_setting(environ) else None
    except ConfigurationError:
        return None
    return None


@dataclass(frozen=True)
class OfflineProblem:
    """Why a builtin's calls get no verdict from what is here, without a download."""

    message: str  # what is missing (first line) and how to fix it; the places tried are left out
    field: str  # the config field that asks for the model ("" when the runtime does not say)
    downloadable: bool  # a call would fetch it (offline mode off, an official source known)


def offline_problem(cfg: Any, environ: Mapping[str, str] | None = None) -> OfflineProblem | None:
    """Whether ``cfg`` can be served from what is here (explicit paths, the model store, the
    libraries' places), by the runtime's own resolution run in offline mode: None when it can.

    ``crossaudit policy validate`` asks it to say which rules reach no verdict offline. Unlike
    :func:`model_problem` (what validate/deploy refuse), a model a call would download counts
    as missing here, with ``downloadable`` set: offline, or where its source cannot be reached,
    those calls fail. Any other resolution error (a setting naming no model) fails them too.
    """
    environ = os.environ if environ is None else environ
    try:
        resolve_paths(cfg, {**environ, ENV_OFFLINE: "1"})
    except CrossAuditError as exc:  # what fails resolution here fails the calls too
        downloadable = not offline_setting(environ) and OFFLINE_SKIPPED in exc.message
        field = exc.field if isinstance(exc, ModelRequiredError) else ""
        return OfflineProblem(without_places(exc.message), field, downloadable)
    return None
