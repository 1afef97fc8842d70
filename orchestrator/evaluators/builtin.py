"""Builtin evaluators (Detoxify toxicity, Presidio PII, langdetect) served by model servers.

The evaluator validates its config up front (a typo fails at build time), resolves model
paths from config or environment (ConfigurationError names the missing setting), and sends
each call to a :class:`~crossaudit.modelserver.pool.ModelBackend`: by default the process-wide
:func:`~crossaudit.modelserver.pool.default_pool`, i.e. a model server subprocess per kind, so torch
and spaCy never load into the orchestrator. Scores follow ``docs/builtins-and-llm.md`` (1 = compliant):

- detoxify: ``1 - max(selected category probability)``; passed = ``max < threshold``;
- presidio: ``1 - max(confidence of entities >= confidence_threshold)``; spans for redaction;
- langdetect: detection probability (of the best expected language when some are given),
  ``details.detected_language`` and the candidate list.

``${NAME}`` in a builtin's config is expanded from its secret source at each call (and the
values masked out of what the call returns); model paths not in the config come from the
process environment (``environ``: the operator's settings, never a tenant's secrets).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from crossaudit.kernel.builtins import BUILTIN_MODELS, DetoxifyConfig, LangdetectConfig, PresidioConfig, parse_config
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.builtins import resolve_paths
from crossaudit.modelserver.pool import ModelBackend, default_pool
from orchestrator.evaluators.base import Called, EvaluationInput, Evaluator, mask_verdict
from orchestrator.policy import envvars
from orchestrator.secrets import SecretSource, SecretUse, as_secret_source

__all__ = [
    "BuiltinEvaluator",
    "DetoxifyConfig",
    "DetoxifyEvaluator",
    "LangdetectConfig",
    "LangdetectEvaluator",
    "PresidioConfig",
    "PresidioEvaluator",
    "build_builtin",
]


class BuiltinEvaluator(Evaluator):
    """Common part: config validation, path resolution, rate limit, dispatch to a backend."""

    kind: ClassVar[str] = "builtin"
    model: ClassVar[str]

    def __init__(
        self,
        name: str,
        config: Mapping[str, Any] | BaseModel | None = None,
        *,
        backend: ModelBackend | None = None,
        environ: Mapping[str, str] | None = None,
        secrets: SecretSource | None = None,
    ) -> None:
        super().__init__(name)
        raw = config.model_dump(mode="json", exclude_none=True) if isinstance(config, BaseModel) else dict(config or {})
        self._raw = raw
        self._references = bool(envvars.references(raw))
        self.config = parse_config(self.model, config or {})  # references stay as written
        self._backend = backend
        self._environ = environ
        self._secrets = secrets if secrets is not None else as_secret_source(environ)
        self._resolved: Any = None

    @property
    def backend(self) -> ModelBackend:
        return self._backend if self._backend is not None else default_pool()

    def resolved_config(self, use: SecretUse | None = None) -> Any:
        """The config with ``${NAME}`` expanded (now: at each call when it has references) and
        model paths filled from the environment (ConfigurationError if none)."""
        environ = os.environ if self._environ is None else self._environ
        if self._references:
            expanded = envvars.expand(self._raw, self._secrets, use, where=f"builtin evaluator {self.name!r} config")
            return resolve_paths(parse_config(self.model, expanded), environ)
        if self._resolved is None:
            self._resolved = resolve_paths(self.config, environ)
        return self._resolved

    def check(self) -> None:
        """Fail fast when the model cannot be located (deploy-time check for the factory/CLI)."""
        self.resolved_config()

    def _wire_config(self, cfg: Any) -> dict[str, Any]:
        return cfg.model_dump(mode="json", exclude_none=True, exclude={"rate_limit", "timeout"})

    async def prepare(self, *, timeout: float = 180.0) -> None:
        """Deploy-time check: resolve model paths, start the model server, load the model and
        validate the config against it (unknown categories/entities) with one empty call, so
        the first real request neither pays the load nor discovers a bad config."""
        cfg = await asyncio.to_thread(self.resolved_config)
        await self.backend.analyze(self.model, self._wire_config(cfg), "", "", {}, timeout=timeout)

    def provenance(self) -> dict[str, str]:
        """``model``; each call adds what the model server reports of the model that scored it
        (``model_sha256``, ``precision``, and ``server``, its container's image id)."""
        return {"kind": self.kind, "model": self.model}

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        return (await self.call(inp, timeout=timeout)).verdict

    async def call(self, inp: EvaluationInput, *, timeout: float) -> Called:
        use = SecretUse()
        facts: dict[str, str] = {}
        try:
            if self._resolved is not None and not self._references:
                cfg = self._resolved
            else:  # resolution may download a model into the store (docs/builtins-and-llm.md): off the loop
                cfg = await asyncio.to_thread(self.resolved_config, use)
            if cfg.timeout:
                timeout = min(timeout, cfg.timeout)
            backend = self.backend
            args = (self.model, self._wire_config(cfg), inp.prompt, inp.response, dict(inp.context))
            traced = getattr(backend, "analyze_call", None)  # the pool and the in-process runner have it
            if traced is not None:
                verdict, facts = await traced(*args, timeout=max(timeout, 0.0))
            else:
                verdict = await backend.analyze(*args, timeout=max(timeout, 0.0))
        except Exception as exc:  # a model server's message may quote the config it was sent
            raise use.mask_error(exc) from None
        return Called(mask_verdict(verdict, use), {k: use.mask(v) for k, v in facts.items()})

    def identity(self) -> str:
        doc = json.dumps(self.config.model_dump(mode="json"), sort_keys=True)
        return f"{self.kind}:{self.model}:{self.name}:{hashlib.sha256(doc.encode()).hexdigest()[:16]}"


def _adapter(model: str) -> type[BuiltinEvaluator]:
    """The adapter class of builtin ``model``: all a builtin needs here is its name."""
    name = BUILTIN_MODELS[model].__name__.removesuffix("Config") + "Evaluator"
    doc = f"The {model} builtin, served by ``crossaudit.modelserver.builtins.{model}``."
    return type(name, (BuiltinEvaluator,), {"model": model, "__doc__": doc, "__module__": __name__})


# One adapter per builtin of the registry (crossaudit.kernel.builtins), none listed here.
BUILTINS: dict[str, type[BuiltinEvaluator]] = {model: _adapter(model) for model in BUILTIN_MODELS}
DetoxifyEvaluator = BUILTINS["detoxify"]  # the named adapters are public API
PresidioEvaluator = BUILTINS["presidio"]
LangdetectEvaluator = BUILTINS["langdetect"]


def build_builtin(
    name: str,
    config: Mapping[str, Any] | BaseModel,
    *,
    backend: ModelBackend | None = None,
    environ: Mapping[str, str] | None = None,
    secrets: SecretSource | None = None,
) -> BuiltinEvaluator:
    """Pick the evaluator class from ``config.model`` (detoxify | presidio | langdetect)."""
    from crossaudit.kernel.errors import InvalidInputError

    model = config.get("model") if isinstance(config, Mapping) else getattr(config, "model", None)
    cls = BUILTINS.get(str(model or "").strip().lower())
    if cls is None:
        raise InvalidInputError(f"builtin evaluator {name!r}: model must be one of {sorted(BUILTINS)}, not {model!r}")
    return cls(name, config, backend=backend, environ=environ, secrets=secrets)
