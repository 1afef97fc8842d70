"""The one Evaluator interface. Every kind (llm, builtin, custom) implements it.

An evaluator turns (prompt, response, context) into a :class:`Verdict` or raises a
:class:`~crossaudit.kernel.errors.EvaluatorError`. Timing, retries, caching, fallbacks and
deadlines are the engine's job, so adapters stay small and uniform.
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


class Evaluator(abc.ABC):
    """Produces a verdict for one input. Implementations must be safe to call concurrently."""

    kind: ClassVar[str]

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        """Evaluate within ``timeout`` seconds; raise EvaluatorTimeoutError when it runs out."""

    def identity(self) -> str:
        """A string that changes whenever the evaluator's behaviour may change (cache key part)."""
        return f"{self.kind}:{self.name}"

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
