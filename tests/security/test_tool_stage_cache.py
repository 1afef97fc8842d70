"""A cached verdict is one of what the evaluator was given, and at a tool stage that includes the
engine's own ``tool`` context (``tool.arguments`` parsed from the arguments judged, which a caller
cannot set). A request of another stage, or of no stage, with the same texts and the same caller
context gives the evaluator another context; its verdict must not be served at ``tool_call``: a
caller of the tenant (any key that may evaluate) could otherwise plant a pass for the proxy's next
tool call, judged by an evaluator that never saw its arguments."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

from crossaudit.kernel.results import Verdict
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy

ARGUMENTS = '{"path": "/etc/shadow"}'
CONTEXT = {"tool": {"name": "read_file", "call_id": "call_7"}}


class PathGuard(Evaluator):
    """A tool-aware custom evaluator: fails a call whose parsed ``path`` is under /etc."""

    kind = "custom"

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        args = inp.context.get("tool", {}).get("arguments")
        path = args.get("path", "") if isinstance(args, dict) else ""
        return Verdict(score=0.0 if path.startswith("/etc") else 1.0)


class Factory:
    def build(self, spec: Any, policy: Any) -> Evaluator:
        return PathGuard(spec.name)


POLICY = load_policy(
    textwrap.dedent(
        """\
        name: tool-cache
        description: reads of /etc refused
        version: "1.0"
        settings: {cache_results: true}
        evaluators:
          - {name: paths, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
        rules:
          - {name: no_etc, evaluator: paths, stage: tool_call, action: block}
          - {name: no_etc_anywhere, evaluator: paths, action: block}
        """
    )
)


async def decide(engine: Engine, stage: str) -> Any:
    return await engine.evaluate(POLICY, "read it", ARGUMENTS, CONTEXT, stage=stage)


def test_a_verdict_of_another_stage_is_not_served_at_tool_call() -> None:
    async def run() -> None:
        engine = Engine(Factory(), scope="acme")
        for planted in ("", "input", "output", "tool_result"):
            assert (await decide(engine, planted)).passed  # no tool.arguments there: the evaluator passes
        d = await decide(engine, "tool_call")
        assert not d.passed and d.action.value == "block"
        assert not any(e.cached for r in d.rules for e in r.evaluators)
        again = await decide(engine, "tool_call")  # the stage's own verdict is cached as before
        assert not again.passed and all(e.cached for r in again.rules if r.evaluators for e in r.evaluators)

    asyncio.run(run())
