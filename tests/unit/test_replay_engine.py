"""The engine's replay hook: recorded verdicts reused by identity, what changed run again unless it
may not (LLM judges), the decision's own time, and not-replayable reasons typed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from crossaudit.kernel.errors import EvaluatorUnavailableError, NotReplayableError
from crossaudit.kernel.results import Action, EvaluatorResult, Verdict
from orchestrator.engine.engine import Engine
from orchestrator.engine.replay import Replay, Unreplayable, llm_only_with_permission
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy

AT = dt.datetime(2026, 3, 4, 23, 30, tzinfo=dt.UTC)  # a Wednesday night


class Counted(Evaluator):
    """A real Evaluator whose calls are counted: the score is read from the response text."""

    def __init__(self, name: str, kind: str, calls: dict[str, int], fail: bool = False) -> None:
        super().__init__(name)
        self.kind = kind
        self.calls = calls
        self.fail = fail

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        self.calls[self.name] = self.calls.get(self.name, 0) + 1
        if self.fail:
            raise EvaluatorUnavailableError("runner down")
        return Verdict(score=float(inp.response))


class Factory:
    def __init__(self, broken: frozenset[str] = frozenset(), failing: frozenset[str] = frozenset()) -> None:
        self.calls: dict[str, int] = {}
        self.broken = broken
        self.failing = failing

    def build(self, spec: Any, policy: Any) -> Evaluator:
        if spec.name in self.broken:
            raise ValueError("cannot build")
        return Counted(spec.name, spec.kind.value, self.calls, fail=spec.name in self.failing)


def policy(threshold: float = 0.5, judge_model: str = "gpt-4o-mini", conditions: str = "", action: str = "warn") -> Any:
    return load_policy(
        f"""
name: P
description: d
version: "1"
evaluators:
  - name: tox
    type: custom
    config: {{code: "def evaluate(p, r, c): return {{}}"}}
  - name: judge
    type: llm
    config: {{provider: openai, model: {judge_model}, system_prompt: "Rate the response"}}
rules:
  - {{name: toxicity, evaluator: tox, threshold: {threshold}, action: {action}{conditions}}}
  - {{name: judged, evaluator: judge, threshold: 0.2, action: warn}}
"""
    )


async def recorded_results(pol: Any, response: str = "0.4") -> dict[str, EvaluatorResult]:
    """What a live evaluation recorded: every evaluator result by identity."""
    factory = Factory()
    live = Engine(factory, scope="tenant-a")
    d = await live.evaluate(pol, "p", response, {})
    await live.aclose()
    return {e.identity: e for r in d.rules for e in r.evaluators}


async def test_a_threshold_change_reuses_every_recorded_verdict_and_calls_nothing() -> None:
    recorded = await recorded_results(policy(0.5))  # 0.4 < 0.5: fails (warn)
    factory = Factory()
    engine = Engine(factory, scope="tenant-a")
    d = await engine.evaluate(policy(0.3), "p", "0.4", {}, replay=Replay(recorded, AT))
    assert factory.calls == {}  # neither the custom evaluator nor the LLM judge was called
    assert d.passed and d.action is Action.ALLOW
    assert d.rule("toxicity").score == pytest.approx(0.4)
    assert all(e.attempts == 0 and not e.cached for r in d.rules for e in r.evaluators)


async def test_a_changed_llm_judge_is_not_called_without_rerun_llm() -> None:
    recorded = await recorded_results(policy())
    factory = Factory()
    engine = Engine(factory, scope="tenant-a")
    with pytest.raises(NotReplayableError) as err:
        await engine.evaluate(policy(judge_model="gpt-4o"), "p", "0.4", {}, replay=Replay(recorded, AT))
    assert err.value.reason == Unreplayable.LLM_CHANGED.value
    assert "judge" in err.value.message and "0.4" not in err.value.message
    assert factory.calls == {}
    rerun = Replay(recorded, AT, may_run=llm_only_with_permission(True))
    d = await engine.evaluate(policy(judge_model="gpt-4o"), "p", "0.4", {}, replay=rerun)
    assert factory.calls == {"judge": 1} and d.rule("judged").evaluators[0].attempts == 1


async def test_a_changed_custom_evaluator_runs_again() -> None:
    recorded = await recorded_results(policy())
    factory = Factory()
    engine = Engine(factory, scope="tenant-a")
    other = load_policy(
        """
name: P
description: d
version: "1"
evaluators:
  - name: tox
    type: custom
    config: {code: "def evaluate(p, r, c): return {'score': 0.4}"}
  - name: judge
    type: llm
    config: {provider: openai, model: gpt-4o-mini, system_prompt: "Rate the response"}
rules:
  - {name: toxicity, evaluator: tox, threshold: 0.5, action: warn}
  - {name: judged, evaluator: judge, threshold: 0.2, action: warn}
"""
    )
    d = await engine.evaluate(other, "p", "0.4", {}, replay=Replay(recorded, AT))
    assert factory.calls == {"tox": 1}  # the changed code ran; the unchanged judge did not
    assert not d.passed


async def test_another_tenants_recorded_verdicts_are_never_reused() -> None:
    recorded = await recorded_results(policy())  # scope tenant-a
    factory = Factory()
    engine = Engine(factory, scope="tenant-b")
    with pytest.raises(NotReplayableError) as err:
        await engine.evaluate(policy(), "p", "0.4", {}, replay=Replay(recorded, AT))
    assert err.value.reason == Unreplayable.LLM_CHANGED.value  # tenant-a's verdicts are not tenant-b's
    assert factory.calls == {"tox": 1}


async def test_a_rule_stopped_before_it_needs_no_verdict() -> None:
    recorded = await recorded_results(policy(0.5, action="block"), response="0.1")  # block: the judge not reached
    recorded = {k: r for k, r in recorded.items() if r.evaluator != "judge"}  # as if cancelled before it answered
    factory = Factory()
    engine = Engine(factory, scope="tenant-a")
    d = await engine.evaluate(policy(0.3, action="block"), "p", "0.1", {}, replay=Replay(recorded, AT))
    assert d.action is Action.BLOCK and d.rule("judged").status.value == "skipped"
    with pytest.raises(NotReplayableError) as err:  # lowered below 0.1, the judge's rule is reached now
        await engine.evaluate(policy(0.05, action="block"), "p", "0.1", {}, replay=Replay(recorded, AT))
    assert err.value.reason == Unreplayable.LLM_NOT_RECORDED.value
    assert factory.calls == {}


async def test_build_failures_and_failed_reruns_are_typed_reasons() -> None:
    recorded = await recorded_results(policy())
    changed = policy(judge_model="gpt-4o")
    rerun = Replay(recorded, AT, may_run=llm_only_with_permission(True))
    with pytest.raises(NotReplayableError) as err:
        await Engine(Factory(broken=frozenset({"judge"})), scope="tenant-a").evaluate(
            changed, "p", "0.4", {}, replay=rerun
        )
    assert err.value.reason == Unreplayable.BUILD_FAILED.value
    with pytest.raises(NotReplayableError) as err:
        await Engine(Factory(failing=frozenset({"judge"})), scope="tenant-a").evaluate(
            changed, "p", "0.4", {}, replay=rerun
        )
    assert err.value.reason == Unreplayable.EVALUATOR_FAILED.value


async def test_time_conditions_see_the_recorded_time() -> None:
    night = ", conditions: [{field: time.hour, operator: greater_than, value: 22}]"
    pol = policy(0.5, conditions=night)
    recorded = await recorded_results(policy(0.5))
    engine = Engine(Factory(), scope="tenant-a", now=lambda: dt.datetime(2026, 3, 4, 12, tzinfo=dt.UTC))
    d = await engine.evaluate(pol, "p", "0.4", {}, replay=Replay(recorded, AT))
    assert d.rule("toxicity").status.value == "fail"  # 23:30 recorded, though it is noon now
    live = await engine.evaluate(pol, "p", "0.4", {})
    assert live.rule("toxicity").status.value == "skipped"


async def test_replay_agrees_with_the_live_decision_on_chained_and_stopping_rules() -> None:
    """Replay runs the rules one after another: readers of previous_rule see what they read, a
    block stops what follows, and the decision equals the live one on the same verdicts."""
    chained = load_policy(
        """
name: P
description: d
version: "1"
evaluators:
  - name: tox
    type: custom
    config: {code: "def evaluate(p, r, c): return {}"}
  - name: judge
    type: llm
    config: {provider: openai, model: gpt-4o-mini, system_prompt: "Rate the response"}
rules:
  - {name: first, evaluator: tox, priority: 100, threshold: 0.5, action: continue}
  - name: reader
    evaluator: judge
    priority: 90
    threshold: 0.5
    action: block
    conditions: [{field: previous_rule.first.score, operator: less_than, value: 0.5}]
  - {name: after, evaluator: tox, priority: 10, threshold: 0.1, action: warn}
"""
    )
    for response in ("0.4", "0.7"):
        factory = Factory()
        live = Engine(factory, scope="tenant-a")
        d = await live.evaluate(chained, "p", response, {})
        recorded = {e.identity: e for r in d.rules for e in r.evaluators}
        replayed = await Engine(Factory(), scope="tenant-a").evaluate(
            chained, "p", response, {}, replay=Replay(recorded, AT)
        )
        strip = {"latency_ms", "outcome", "reason"}
        assert [r.model_dump(exclude=strip | {"evaluators"}) for r in replayed.rules] == [
            r.model_dump(exclude=strip | {"evaluators"}) for r in d.rules
        ]
        assert (replayed.passed, replayed.action) == (d.passed, d.action)
    assert d.rule("reader").status.value == "skipped"  # 0.7: the condition does not hold
