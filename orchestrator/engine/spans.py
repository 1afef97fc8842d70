"""The engine's spans (docs/observability.md): one per policy evaluation, per rule and per
evaluator call, through the OpenTelemetry API (:mod:`crossaudit.kernel.tracing`). Every helper
here is called only when tracing is on; off, the engine makes no span and calls none of them.

Attributes are names, kinds, counts, scores and statuses: never an input, a context value, a
verdict's details or an error message (which may quote an input)."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry.trace import Span, Status, StatusCode

from crossaudit.kernel import tracing
from crossaudit.kernel.dsl import Rule
from crossaudit.kernel.results import Decision, EvaluatorResult, RuleResult
from crossaudit.kernel.results import Status as ResultStatus

# True in the calls a rule's ``fallback.evaluator`` makes (the task of the call inherits it).
_FALLBACK: ContextVar[bool] = ContextVar("crossaudit_fallback_call", default=False)
_NO_VERDICT = (ResultStatus.ERROR, ResultStatus.TIMEOUT)
F = TypeVar("F", bound=Callable[..., Awaitable[Decision]])


def traced_evaluate(fn: F) -> F:
    """``Engine.evaluate`` in a span when tracing is on (one flag check when off)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, policy: Any, prompt: str, response: str, *args: Any, **kwargs: Any) -> Decision:
        if not tracing.enabled():
            return await fn(self, policy, prompt, response, *args, **kwargs)
        attributes = {
            "crossaudit.policy": policy.name,
            "crossaudit.policy.rules": len(policy.rules),
            "crossaudit.stage": kwargs.get("stage") or "",
            "crossaudit.replay": kwargs.get("replay") is not None,
        }
        with tracing.span(tracing.ENGINE, attributes) as sp:
            decision = await fn(self, policy, prompt, response, *args, **kwargs)
            if sp.is_recording():
                sp.set_attributes({
                    "crossaudit.verdict": "passed" if decision.passed else "failed",
                    "crossaudit.action": decision.action.value,
                    "crossaudit.rules.from_cache": sum(
                        1 for r in decision.rules if r.evaluators and all(e.cached for e in r.evaluators)
                    ),
                })  # fmt: skip
            return decision

    return wrapper  # type: ignore[return-value]


def now() -> int:
    """A span's start time (ns since the epoch), taken before the work it covers."""
    return time.time_ns()


def start_rule(rule: Rule, start_ns: int) -> Span:
    return tracing.start_span(
        tracing.RULE,
        {"crossaudit.rule.name": rule.name, "crossaudit.rule.action": rule.action.value},
        start_time=start_ns,
    )


def decided_rule(rule: Rule, res: RuleResult, start_ns: int) -> None:
    """A rule decided at once, with no call to wait for (its evaluators' verdicts were cached, or
    its conditions skipped it): microseconds of work, a span only when ``tracing.rule_spans`` is
    ``all``; else the engine's span counts it."""
    if tracing.all_rule_spans():
        end_rule(start_rule(rule, start_ns), res)


def end_rule(sp: Span, res: RuleResult) -> None:
    if sp.is_recording():
        sp.set_attributes({
            "crossaudit.rule.status": res.status.value,
            "crossaudit.rule.passed": res.passed,
            "crossaudit.rule.taken_action": res.action.value if res.action is not None else "",
            "crossaudit.rule.score": float(res.score) if res.score is not None else -1.0,
            "crossaudit.rule.evaluators": len(res.evaluators),
            "crossaudit.rule.cache_hits": sum(1 for e in res.evaluators if e.cached),
            "crossaudit.rule.fallback_used": res.fallback_used,
        })  # fmt: skip
        if res.status in _NO_VERDICT:
            sp.set_status(Status(StatusCode.ERROR, f"rule {res.status.value}"))
    sp.end()


def cancelled_rule(sp: Span) -> None:
    """A rule stopped before its verdict (an earlier rule stopped processing, or the deadline)."""
    sp.set_attribute("crossaudit.rule.cancelled", True)
    sp.end()


@contextmanager
def fallback_calls() -> Iterator[None]:
    """The evaluator calls made in the block are a rule's fallback (their spans say so)."""
    token = _FALLBACK.set(True)
    try:
        yield
    finally:
        _FALLBACK.reset(token)


def start_evaluator(name: str, kind: str, parent: Span | None = None) -> Span:
    return tracing.start_span(
        tracing.EVALUATOR,
        parent=parent,
        attributes={
            "crossaudit.evaluator.name": name,
            "crossaudit.evaluator.kind": kind,
            "crossaudit.evaluator.fallback": _FALLBACK.get(),
        },
    )


def end_evaluator(sp: Span, result: EvaluatorResult) -> None:
    if sp.is_recording():
        sp.set_attributes({
            "crossaudit.evaluator.kind": result.kind,
            "crossaudit.evaluator.cache_hit": result.cached,
            "crossaudit.evaluator.attempts": result.attempts,
            "crossaudit.evaluator.retries": max(0, result.attempts - 1),
            "crossaudit.evaluator.status": result.status.value,
        })  # fmt: skip
        if result.score is not None:
            sp.set_attribute("crossaudit.evaluator.score", float(result.score))
        if result.status in _NO_VERDICT:
            error = result.error_type or result.status.value
            sp.set_attribute("error.type", error)
            sp.set_status(Status(StatusCode.ERROR, error))
    sp.end()


async def traced_call(
    name: str, kind: str, call: Awaitable[EvaluatorResult], rule_span: Callable[[], Span | None]
) -> EvaluatorResult:
    """An evaluator call's task in its span, current (the sandbox's or LLM's span is its child): a
    child of the span of the rule that started it (``rule_span``: found once the task runs, as the
    rule's span is made after its calls start), else of the current one."""
    parent = rule_span()
    sp = start_evaluator(name, kind, parent)
    token = tracing.use(sp)
    try:
        result = await call
    except BaseException as exc:
        tracing.failed(sp, exc)
        sp.end()
        raise
    finally:
        tracing.release(token)
    end_evaluator(sp, result)
    return result
