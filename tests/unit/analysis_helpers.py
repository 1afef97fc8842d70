"""What the analysis tests share: small policies, and an *independent* check of a witness: the
engine's live path (not the replay hook the analysis itself uses) with scripted evaluators that
answer what the witness says."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

from crossaudit.kernel.dsl import Policy
from crossaudit.kernel.errors import EvaluatorError, EvaluatorTimeoutError
from crossaudit.kernel.results import Decision, Verdict
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy


def policy(rules: str, evaluators: tuple[str, ...] = ("a", "b", "c"), settings: str = "") -> Policy:
    evs = "".join(
        f"  - name: {n}\n    type: custom\n    config: {{code: 'def evaluate(p, r, c): return {{}}'}}\n"
        for n in evaluators
    )
    text = f'name: T\ndescription: d\nversion: "1.0"\nevaluators:\n{evs}rules:\n{textwrap.dedent(rules)}{settings}'
    return load_policy(text)


class _Answers(Evaluator):
    kind = "custom"

    def __init__(self, name: str, answer: dict[str, Any]) -> None:
        super().__init__(name)
        self.answer = answer

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        if self.answer.get("error") == "timeout":
            raise EvaluatorTimeoutError("scripted timeout")
        if "error" in self.answer:
            raise EvaluatorError("scripted error")
        return Verdict(score=self.answer["score"], passed=self.answer.get("passed"),
                       details=self.answer.get("details", {}))  # fmt: skip


class _Factory:
    def __init__(self, witness: dict[str, Any]) -> None:
        self.witness = witness

    def build(self, spec: Any, policy: Any) -> Evaluator:
        return _Answers(spec.name, self.witness["evaluators"].get(spec.name, {"score": 1.0}))


def live_decision(p: Policy, witness: dict[str, Any]) -> Decision:
    """The engine's live decision on ``witness`` (its evaluators answer as it says)."""

    async def run() -> Decision:
        engine = Engine(_Factory(witness))
        try:
            return await engine.evaluate(p, "prompt", "response.", witness["context"], stage=witness["stage"] or "")
        finally:
            await engine.aclose()

    return asyncio.run(run())


def agrees(p: Policy, witness: dict[str, Any], engine: dict[str, Any]) -> None:
    """The live engine decides ``witness`` as the analysis reported the engine did."""
    d = live_decision(p, witness)
    assert (d.passed, d.action.value) == (engine["passed"], engine["action"])
    statuses = {r.rule: r.status.value for r in d.rules}
    assert {k: statuses[k] for k in engine["rules"]} == engine["rules"]
