"""Engine semantics as data: every ``tests/cases/<construct>/*.yaml`` is one case, run here.

A case holds a policy, what each of its evaluators answers (a score and details, an error, a
delay), the request (and a fixed clock for ``time.*``), and the decision expected. The engine
under test is the real one; only the evaluators' answers are given, as inputs, the way OPA's
conformance cases give ``input`` and ``data``. A new construct gets a folder; a new behaviour
a file: no Python needed.

The request may name a ``stage`` (``input``/``output``: only that stage's rules run).
Expectation keys (all optional): ``passed``, ``action``, ``modified_response`` (``null`` =
none), ``errored_rules`` (exact list), ``rules`` (per rule: any of ``status``, ``passed``,
``action``, ``score``, ``threshold``, ``fallback_used``, ``reason_contains``, ``outcome``
(a subset of the outcome's params), ``evaluators`` (list of statuses)), ``calls``
(evaluator name → how many times it was called).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossaudit.kernel import errors
from crossaudit.kernel.results import Decision, Verdict
from orchestrator.engine.engine import Engine
from orchestrator.engine.thresholds import FeedbackStats
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy

HERE = Path(__file__).resolve().parent
CASES = sorted(HERE.glob("*/*.yaml"))
CASE_KEYS = {"description", "policy", "evaluators", "feedback", "now", "request", "expect", "repeat"}


class Answer(Evaluator):
    """An evaluator whose answers the case file gives: a verdict, an error, after a delay."""

    def __init__(self, name: str, kind: str, script: dict[str, Any]) -> None:
        super().__init__(name)
        self.kind = kind  # type: ignore[misc]
        self.script = script
        self.calls = 0

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        self.calls += 1
        await asyncio.sleep(float(self.script.get("delay", 0)))  # past its timeout, the engine cancels it
        error = self.script.get("error")
        if error and self.calls <= int(self.script.get("fail_times", 1 << 30)):
            cls = getattr(errors, error)
            raise cls(f"{self.name} failed") if cls is not errors.SandboxLimitError else cls("memory", "limit")
        fields = {k: self.script[k] for k in ("score", "passed", "violations", "details", "spans") if k in self.script}
        return Verdict(**fields)


class Factory:
    def __init__(self, scripts: dict[str, dict[str, Any]]) -> None:
        self.scripts = scripts
        self.built: dict[str, Answer] = {}

    def build(self, spec: Any, policy: Any) -> Evaluator:
        if spec.name not in self.scripts:
            raise AssertionError(f"the case gives no answers for evaluator {spec.name!r}")
        ev = self.built[spec.name] = Answer(spec.name, spec.kind.value, self.scripts[spec.name])
        return ev


def _load(path: Path) -> dict[str, Any]:
    case = yaml.safe_load(path.read_text(encoding="utf-8"))
    unknown = set(case) - CASE_KEYS
    assert not unknown, f"{path.name}: unknown keys {sorted(unknown)}"
    return case


def _check(decision: Decision, expect: dict[str, Any], factory: Factory, where: str) -> None:
    for key in ("passed", "modified_response", "errored_rules"):
        if key in expect:
            assert getattr(decision, key) == expect[key], f"{where}: {key}"
    if "action" in expect:
        assert decision.action.value == expect["action"], f"{where}: action"
    for name, want in (expect.get("rules") or {}).items():
        got = decision.rule(name)
        for key, value in want.items():
            if key == "reason_contains":
                assert value in got.reason, f"{where}: rules.{name}.reason is {got.reason!r}"
            elif key == "outcome":
                assert got.outcome is not None, f"{where}: rules.{name} has no outcome"
                params = got.outcome.params
                for pk, pv in value.items():
                    assert params.get(pk) == pv, f"{where}: rules.{name}.outcome.{pk} is {params.get(pk)!r}"
            elif key == "evaluators":
                assert [e.status.value for e in got.evaluators] == value, f"{where}: rules.{name}.evaluators"
            elif key in ("action", "status"):
                actual = getattr(got, key)
                assert (actual.value if actual is not None else None) == value, f"{where}: rules.{name}.{key}"
            elif key in ("score", "threshold"):
                actual = getattr(got, key)
                assert actual == pytest.approx(value) if value is not None else actual is None, (
                    f"{where}: rules.{name}.{key} is {actual}"
                )
            else:
                assert getattr(got, key) == value, f"{where}: rules.{name}.{key}"
    for name, count in (expect.get("calls") or {}).items():
        built = factory.built.get(name)  # never built: never called
        assert (built.calls if built else 0) == count, f"{where}: calls of {name}"


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
async def test_case(path: Path) -> None:
    case = _load(path)
    policy = load_policy(yaml.safe_dump(case["policy"], sort_keys=False), path.name)
    factory = Factory(case.get("evaluators") or {})
    now = dt.datetime.fromisoformat(case.get("now", "2026-03-02T12:00:00+00:00"))
    stats = {
        (policy.name, rule): FeedbackStats(**{**counts, "scores": tuple(map(tuple, counts.get("scores", ())))})
        for rule, counts in (case.get("feedback") or {}).items()
    }  # scores: [score, should_pass] pairs (docs/calibration.md)
    engine = Engine(factory, now=lambda: now, feedback=lambda p, r: stats.get((p, r)))
    req = case.get("request") or {}
    decision = None
    for _ in range(int(case.get("repeat", 1))):
        decision = await engine.evaluate(
            policy,
            req.get("prompt", "prompt"),
            req.get("response", "response"),
            req.get("context") or {},
            stage=req.get("stage", ""),
        )
    assert decision is not None
    _check(decision, case.get("expect") or {}, factory, f"{path.parent.name}/{path.name}")


def test_every_construct_of_the_guide_has_cases() -> None:
    folders = {p.parent.name for p in CASES}
    constructs = {
        "basic", "priority", "enabled", "conditions", "actions", "modify", "custom_action", "fallback",
        "retries", "timeouts", "cache", "chaining", "dynamic_thresholds", "consensus", "feedback",
        "stop_on_block", "rate_limit",
    }  # fmt: skip
    assert constructs <= folders, f"constructs without cases: {sorted(constructs - folders)}"
