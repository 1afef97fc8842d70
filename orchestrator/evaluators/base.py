"""The one Evaluator interface. Every kind (llm, builtin, custom) implements it.

An evaluator turns (prompt, response, context) into a :class:`Verdict` or raises a
:class:`~crossaudit.kernel.errors.EvaluatorError`. Timing, retries, caching, fallbacks and
deadlines are the engine's job, so adapters stay small and uniform.

Provenance (docs/provenance.md) reaches the engine on two trusted channels, never through the
verdict (a custom evaluator's verdict is tenant code's output and may claim anything):
:meth:`Evaluator.provenance` gives the static facts (kind, code digest, model, ...), and
:meth:`Evaluator.call` returns a :class:`Called`: the verdict plus the facts of that one call
that the adapter itself observed (the LLM provider's response id, the sandbox image that ran,
the model file the server loaded). The engine merges them with :func:`merge_provenance`, in
which a per-call fact never overrides a static one.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from crossaudit.kernel.results import Span, Verdict
from orchestrator.secrets import SecretUse


@dataclass(frozen=True)
class EvaluationInput:
    prompt: str
    response: str
    context: Mapping[str, Any] = field(default_factory=dict)


# Bounds of one result's provenance (a misbehaving adapter or model server must not bloat records).
PROVENANCE_MAX_KEYS = 32
PROVENANCE_MAX_KEY_CHARS = 64
PROVENANCE_MAX_VALUE_CHARS = 512


@dataclass(frozen=True)
class Called:
    """One call's verdict and the provenance facts the adapter observed for that call (host-side:
    an SDK response's id, the image a sandbox ran, a model server's reply fields), never read
    from the verdict."""

    verdict: Verdict
    facts: Mapping[str, str] = field(default_factory=dict)


def merge_provenance(static: Mapping[str, str], facts: Mapping[str, str]) -> dict[str, str]:
    """The provenance of one result: ``static`` (the evaluator's own) plus the call's ``facts``,
    where a fact never replaces a static key; only string keys and values are kept, each bounded,
    at most :data:`PROVENANCE_MAX_KEYS` of them."""
    out: dict[str, str] = {}
    for source in (static, facts):
        for key, value in source.items():
            if len(out) >= PROVENANCE_MAX_KEYS:
                return out
            if not isinstance(key, str) or not isinstance(value, str) or not key or not value:
                continue
            if len(key) > PROVENANCE_MAX_KEY_CHARS or key in out:
                continue
            out[key] = value[:PROVENANCE_MAX_VALUE_CHARS]
    return out


class Evaluator(abc.ABC):
    """Produces a verdict for one input. Implementations must be safe to call concurrently."""

    kind: ClassVar[str]

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        """Evaluate within ``timeout`` seconds; raise EvaluatorTimeoutError when it runs out."""

    async def call(self, inp: EvaluationInput, *, timeout: float) -> Called:
        """What the engine calls: :meth:`evaluate` plus the facts of this call (none by default).
        Adapters that observe per-call provenance override it (and ``evaluate`` returns its verdict)."""
        return Called(await self.evaluate(inp, timeout=timeout))

    def identity(self) -> str:
        """A string that changes whenever the evaluator's behaviour may change (cache key part)."""
        return f"{self.kind}:{self.name}"

    def provenance(self) -> dict[str, str]:
        """Static facts about what produces this evaluator's verdicts (docs/provenance.md)."""
        return {"kind": self.kind}

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release pooled resources (containers, HTTP clients)."""


class EvaluatorFactory(Protocol):
    """Builds evaluators for a policy's evaluator specs. The runtime implements it."""

    def build(self, spec: Any, policy: Any) -> Evaluator:  # EvaluatorSpec, Policy (policy layer models)
        ...


def mask_verdict(verdict: Verdict, use: SecretUse) -> Verdict:
    """``verdict`` with the secret values of ``use`` masked out of its violations, details and
    span labels: what an evaluator returns never carries a secret it was given."""
    if not use:
        return verdict
    return verdict.model_copy(
        update={
            "violations": [use.mask(v) for v in verdict.violations],
            "details": use.scrub(verdict.details),
            "spans": [Span(start=s.start, end=s.end, label=use.mask(s.label), score=s.score) for s in verdict.spans],
        }
    )
