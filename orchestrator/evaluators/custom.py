"""Custom evaluators: user code run by a Sandbox backend, never in this process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.results import Verdict
from sandbox.base import CodeBundle, Sandbox

PARAMETERS_KEY = "evaluator_config"  # context key under which a policy's extra config keys reach the code


class CustomEvaluator(Evaluator):
    kind: ClassVar[str] = "custom"

    def __init__(
        self, name: str, bundle: CodeBundle, sandbox: Sandbox, parameters: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(name)
        self.bundle = bundle
        self.sandbox = sandbox
        self.parameters = dict(parameters or {})

    def identity(self) -> str:
        return f"custom:{self.name}:{self.bundle.digest}"

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        context: dict[str, Any] = dict(inp.context)
        if self.parameters:
            context[PARAMETERS_KEY] = self.parameters
        verdict, _diagnostics = await self.sandbox.run(
            self.bundle, inp.prompt, inp.response, context, timeout=timeout
        )
        return verdict
