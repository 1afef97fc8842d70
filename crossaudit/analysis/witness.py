"""Witnesses: a solver model as a concrete request, and the real engine's verdict on it.

A witness is a stage, a context and one result per evaluator (a score, ``passed: false``, or no
verdict). The engine evaluates it through its replay hook (``Engine.evaluate(replay=)``, recorded
results reused by identity, nothing called: every evaluator is a stub that refuses to run), so what
is checked is the engine's own planning, conditions, thresholds, consensus, fallbacks, stops and
decision. :func:`reproduce` compares what the model claims (every rule's status, the decision's
passed, action, and whether it modified the response) with what the engine answered.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from crossaudit.analysis.encode import ACTIONS, STATUSES, PolicyEncoding
from crossaudit.analysis.values import INTEGER_FIELDS, Val, World
from crossaudit.kernel.dsl import ModifyConfig, Policy
from crossaudit.kernel.errors import CrossAuditError
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, Status, Verdict
from orchestrator.engine import actions
from orchestrator.engine.engine import Engine
from orchestrator.engine.replay import Replay
from orchestrator.evaluators.base import EvaluationInput, Evaluator

WITNESS_AT = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.UTC)  # the clock of every witness (time.* pinned when read)
STAGES = ("", "input", "output")
NO_VERDICT = "no verdict (analysis witness)"


class _Stub(Evaluator):
    """An evaluator that is never called: every result of a witness is recorded."""

    def __init__(self, name: str, kind: str) -> None:
        super().__init__(name)
        self.kind = kind  # type: ignore[misc]

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:  # pragma: no cover
        raise AssertionError(f"analysis witness: evaluator {self.name!r} was called")


class _StubFactory:
    def build(self, spec: Any, policy: Any) -> Evaluator:
        return _Stub(spec.name, spec.kind.value)


@dataclass
class Witness:
    stage: str
    evaluators: dict[str, dict[str, Any]]
    context: dict[str, Any]
    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # evaluator -> details

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage or None, "evaluators": self.evaluators, "context": self.context}

    def describe(self) -> str:
        parts = []
        for name, r in sorted(self.evaluators.items()):
            if "error" in r:
                parts.append(f"{name}: {r['error']}")
            else:
                parts.append(f"{name} score {r['score']:g}" + (" passed=false" if r.get("passed") is False else ""))
        ctx = ", ".join(f"{k}={v!r}" for k, v in _flatten(self.context))
        stage = f"stage {self.stage}; " if self.stage else ""
        return stage + "; ".join(parts) + (f"; context {ctx}" if ctx else "")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


# --- from a model ---------------------------------------------------------------------------


def _float(model: z3.ModelRef, term: z3.ArithRef) -> float:
    v = model.eval(term, model_completion=True)
    if z3.is_rational_value(v):
        return float(v.numerator_as_long()) / float(v.denominator_as_long())
    if z3.is_int_value(v):
        return float(v.as_long())
    return float(v.as_decimal(17).rstrip("?"))


def _true(model: z3.ModelRef, term: z3.BoolRef) -> bool:
    return z3.is_true(model.eval(term, model_completion=True))


_ESCAPE = re.compile(r"\\u\{([0-9a-fA-F]+)\}")


def _text(model: z3.ModelRef, term: z3.SeqRef) -> str:
    raw = model.eval(term, model_completion=True).as_string()
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), raw)


def value_of(model: z3.ModelRef, v: Val, path: str = "") -> tuple[bool, Any]:
    """(present, the Python value) of ``v`` in ``model``."""
    if not _true(model, v.present):
        return False, None
    if _true(model, v.isnum):
        x = _float(model, v.num)
        return True, int(x) if path in INTEGER_FIELDS or (x.is_integer() and abs(x) < 2**53) else x
    if _true(model, v.isbool):
        return True, _true(model, v.boolean)
    if _true(model, v.isstr):
        if v.ip is not None and _true(model, v.isip):
            n = model.eval(v.ip, model_completion=True).as_long()
            return True, str(ipaddress.IPv4Address(n))
        if _true(model, v.strisnum):
            x = _float(model, v.strnum)
            return True, repr(x)
        return True, _text(model, v.text)
    return True, {}


def _set(ctx: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = ctx
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = cur[p] = {}
        cur = nxt
    if isinstance(value, dict) and isinstance(cur.get(parts[-1]), dict):
        return  # an object already holding its children
    cur[parts[-1]] = value


def witness_from(model: z3.ModelRef, world: World, evaluator_names: list[str]) -> Witness:
    stage = STAGES[model.eval(world.stage, model_completion=True).as_long()]
    evaluators: dict[str, dict[str, Any]] = {}
    for name in evaluator_names:
        if name not in world.evaluators:
            evaluators[name] = {"score": 1.0}
            continue
        ok, s, pf, to = world.evaluators[name]
        if not _true(model, ok):
            evaluators[name] = {"error": "timeout" if _true(model, to) else "error"}
            continue
        r: dict[str, Any] = {"score": _float(model, s)}
        if _true(model, pf):
            r["passed"] = False
        evaluators[name] = r
    context: dict[str, Any] = {}
    for path in sorted(world.fields, key=lambda p: p.count(".")):
        present, value = value_of(model, world.fields[path], path)
        if present:
            _set(context, path, value)
    details: dict[str, dict[str, Any]] = {}
    for (names, key), v in world.details.items():
        present, value = value_of(model, v)
        if present:
            for n in names:
                details.setdefault(n, {})[key] = value
    for n, d in details.items():
        if n in evaluators and "score" in evaluators[n]:
            evaluators[n]["details"] = d
    return Witness(stage=stage, evaluators=evaluators, context=context, details=details)


# --- what the model claims, and what the engine says ---------------------------------------------


def claimed(model: z3.ModelRef, enc: PolicyEncoding) -> dict[str, Any]:
    """The outcome the model gives ``enc``'s policy on the witness."""
    rules = {}
    for name, out in enc.rules.items():
        status = STATUSES[model.eval(out.status, model_completion=True).as_long()]
        rules[name] = status
    d = enc.decision
    modified = not _true(model, d.unredacted) and any(_true(model, e) for e in d.edits.values())
    return {
        "passed": _true(model, d.passed),
        "action": ACTIONS[model.eval(d.action, model_completion=True).as_long()].value,
        "modified": modified,
        "rules": rules,
    }


def modified_response(policy: Policy, decision: Decision, response: str) -> str | None:
    """The modified response of ``decision``, as ``Engine._decide`` makes it (a replay leaves it
    out: it compares verdicts and actions): none when a ``modify`` rule got no verdict, else the
    engine's edits of the failed ``modify`` rules."""
    by_name = {r.name: r for r in policy.rules}
    if any(
        by_name[r.rule].action is Action.MODIFY and r.status in (Status.ERROR, Status.TIMEOUT) for r in decision.rules
    ):
        return None
    edits = []
    for r in decision.rules:
        if not r.passed and r.action is Action.MODIFY:
            cfg = by_name[r.rule].typed_action_config
            edits.append((cfg if isinstance(cfg, ModifyConfig) else ModifyConfig(), r))
    return actions.apply_modifications(response, edits)


def observed(policy: Policy, decision: Decision, response: str, names: list[str]) -> dict[str, Any]:
    by = {r.rule: r for r in decision.rules}
    return {
        "passed": decision.passed,
        "action": decision.action.value,
        "modified": modified_response(policy, decision, response) is not None,
        "rules": {n: by[n].status.value for n in names if n in by},
    }


def differences(claim: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    out = [f"{k}: analysis {claim[k]!r}, engine {seen.get(k)!r}" for k in ("passed", "action", "modified")
           if claim[k] != seen.get(k)]  # fmt: skip
    for rule, status in claim["rules"].items():
        if seen["rules"].get(rule) != status:
            out.append(f"rule {rule}: analysis {status}, engine {seen['rules'].get(rule)}")
    return out


def response_of(policy: Policy) -> str:
    """The witness's response: a word per evaluator (its violation), so redactions show."""
    return " ".join(f"finding{i}" for i in range(len(policy.evaluators))) + "."


class Runner:
    """Evaluates witnesses with the real engine (one engine; stubs for evaluators)."""

    def __init__(self) -> None:
        self.engine = Engine(_StubFactory())

    def decide(self, policy: Policy, w: Witness) -> Decision:
        return asyncio.run(self._decide(policy, w))

    async def _decide(self, policy: Policy, w: Witness) -> Decision:
        results: dict[str, EvaluatorResult] = {}
        for i, spec in enumerate(policy.evaluators):
            identity = self.engine.identity_of(policy, spec.name)
            r = w.evaluators.get(spec.name, {"score": 1.0})
            word = f"finding{i}"
            if "error" in r:
                status = Status.TIMEOUT if r["error"] == "timeout" else Status.ERROR
                results[identity] = EvaluatorResult(
                    evaluator=spec.name, kind=spec.kind.value, status=status, error=NO_VERDICT,
                    error_type="EvaluatorError", identity=identity)  # fmt: skip
                continue
            results[identity] = EvaluatorResult(
                evaluator=spec.name, kind=spec.kind.value, status=Status.PASS, score=r["score"],
                passed=r.get("passed"), details=dict(r.get("details", {})), violations=[word], identity=identity,
            )  # fmt: skip
        replay = Replay(results=results, at=WITNESS_AT, may_run=lambda _kind: False)
        decision = await self.engine.evaluate(
            policy, "analysis witness", response_of(policy), w.context, stage=w.stage, replay=replay
        )
        return decision

    def check(self, policy: Policy, w: Witness, claim: Mapping[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
        """(differences between the claim and the engine, what the engine decided)."""
        try:
            decision = self.decide(policy, w)
        except CrossAuditError as e:
            return [f"the engine refused the witness: {type(e).__name__}: {e.message}"], None
        seen = observed(policy, decision, response_of(policy), list(claim["rules"]))
        return differences(claim, seen), seen
