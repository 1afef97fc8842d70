"""The one Evaluator interface. Every kind (llm, builtin, custom) implements it.

An evaluator turns (prompt, response, context) into a :class:`Verdict` or raises a
:class:`~orchestrator.errors.EvaluatorError`. Timing, retries, caching, fallbacks and
deadlines are the engine's job, so adapters stay small and uniform.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from orchestrator.results import Verdict


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
