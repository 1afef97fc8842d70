"""Evaluate a dataset's rows through the real engine (in-process) or a running server.

In-process, the rows go through :class:`crossaudit.sdk.PolicyTester`: the sandboxes, model-server
batching and deadlines of the server, at most ``concurrency`` requests in flight. With a server
(``--server``), through :class:`crossaudit.sdk.Client` against the deployed policy of that name,
the same bound on calls in flight. Either way the first ``LATENCY_ROWS`` rows run one at a time
first: their latency is one call's own, not a queue's.

A rule not applied to a row (an earlier rule stopped processing) has no verdict on it: a
label for it there counts as *unjudged*, as does one whose evaluator errored or timed out.

A row naming a ``stage`` (a tool call, a tool result: :mod:`crossaudit.evals.dataset`) is
evaluated at that stage only, as a server evaluates a request naming it; a rule of another stage
is not applied there (unjudged, like one an earlier rule stopped).

A row without text (``prompt``/``response`` None: a production row whose inputs were not
retained) cannot be evaluated again: each rule with a recorded score is judged from it against
the rule's threshold (*threshold-only*: no condition, no chaining, no decision), and a rule
without a recorded score, or with a dynamic threshold, is left unjudged for that row.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from crossaudit.evals.dataset import MAX_NESTING, Row, nesting
from crossaudit.kernel.dsl import EvaluatorType, Policy
from crossaudit.kernel.errors import CrossAuditError, InvalidInputError
from crossaudit.kernel.limits import PoolLimits
from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES, cost_usd, price_for
from crossaudit.kernel.results import Decision, Status

# Requests in flight (in-process or to a server): the warm sandboxes one evaluator may have
# (PoolLimits.max_size); more would only wait in its pool's queue.
DEFAULT_CONCURRENCY = PoolLimits().max_size
MAX_CONCURRENCY = 256
# Rows evaluated one at a time before the others run ``concurrency`` at a time. Rows in flight
# together queue for the same sandboxes, model servers and cores, so their latency is the wait
# plus the work (p50 1.8-3.0 s at 4 in flight against 273 ms alone on 2 cores, for the same wall
# time): these rows' latency is what one call costs, the figure the report gives per rule.
LATENCY_ROWS = 20
RowProgress = Callable[[int, int], None]  # (rows done, rows in all)
# A skipped rule whose reason starts so was not applied (an earlier rule stopped processing, or
# another stage): it has no verdict on that row (unjudged). A rule skipped because its condition
# was not met applied and passed: that is its verdict.
NOT_APPLIED = "not applied"


@dataclass(frozen=True)
class RuleOutcome:
    passed: bool | None  # None: no verdict (the evaluator errored or timed out)
    status: str
    score: float | None
    threshold: float | None
    latency_ms: float
    reason: str = ""


@dataclass(frozen=True)
class RowOutcome:
    row: Row
    passed: bool | None  # the decision's; None: no decision (threshold-only row, or an error)
    action: str | None
    rules: dict[str, RuleOutcome]
    error: str = ""  # the request could not be evaluated
    latency_ms: float = 0.0
    threshold_only: bool = False
    alone: bool = False  # evaluated with no other row in flight: its latency is its own work


@dataclass
class LLMUsage:
    """Tokens and cost per (provider, model) of the LLM calls an evaluation made."""

    calls: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, provider: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        with self.lock:
            entry = self.calls[(provider, model)]
            entry[0] += 1
            entry[1] += prompt_tokens
            entry[2] += completion_tokens

    def cost(self, provider: str, model: str) -> float | None:
        """USD of the calls to one model at the built-in list prices; None when it is not priced."""
        price = price_for(DEFAULT_LLM_PRICES, model)
        _, prompt, completion = self.calls.get((provider, model), (0, 0, 0))
        return None if price is None else cost_usd(price, prompt, completion)


@dataclass
class EvalRun:
    policy: Policy
    outcomes: list[RowOutcome]
    wall_s: float
    where: str  # "process sandbox", "docker sandbox", "server host:port"
    usage: LLMUsage
    notes: list[str] = field(default_factory=list)
    source: str = ""  # the policy file as given, or "deployed NAME": what tells two runs apart
    concurrency: int = 1  # rows in flight after the first LATENCY_ROWS

    def rule_cost(self, rule: str) -> float | None:
        """USD of the LLM calls of a rule's evaluators (docs/evals.md: a model shared by several
        evaluators has its cost split evenly among them). None: the rule uses no LLM."""
        specs = {s.name: s for s in self.policy.evaluators}
        by_model: dict[tuple[str, str], int] = defaultdict(int)
        for s in self.policy.evaluators:
            if s.kind is EvaluatorType.LLM:
                by_model[_llm_key(s)] += 1
        r = next(r for r in self.policy.rules if r.name == rule)
        names = set(r.evaluator_names) | ({r.fallback.evaluator} if r.fallback and r.fallback.evaluator else set())
        total, any_llm = 0.0, False
        for name in names:
            spec = specs.get(name)
            if spec is None or spec.kind is not EvaluatorType.LLM:
                continue
            any_llm = True
            key = _llm_key(spec)
            cost = self.usage.cost(*key)
            total += (cost or 0.0) / by_model[key]
        return total if any_llm else None


def _llm_key(spec: Any) -> tuple[str, str]:
    cfg = spec.config
    get = cfg.get if isinstance(cfg, Mapping) else lambda k, d=None: getattr(cfg, k, d)
    return str(get("provider", "")), str(get("model", ""))


def numeric_threshold(policy: Policy, rule: str) -> float | None:
    r = next((r for r in policy.rules if r.name == rule), None)
    return float(r.threshold) if r is not None and isinstance(r.threshold, int | float) else None


def rule_names(policy: Policy) -> list[str]:
    return [r.name for r in policy.rules if r.enabled]


def _unsendable(row: Row) -> RowOutcome | None:
    """The errored outcome of a row no engine or server takes (rows built elsewhere than
    :func:`crossaudit.evals.dataset.load_dataset`, which refuses them), else None."""
    if nesting(row.context) > MAX_NESTING:
        return RowOutcome(row, None, None, {}, error=f"context: nested deeper than {MAX_NESTING} levels (MAX_NESTING)")
    return None


def _outcome(row: Row, answer: Decision | CrossAuditError) -> RowOutcome:
    if isinstance(answer, CrossAuditError):
        return RowOutcome(row, None, None, {}, error=answer.message)
    rules = {
        r.rule: RuleOutcome(
            passed=None
            if r.status in (Status.ERROR, Status.TIMEOUT)
            or (r.status is Status.SKIPPED and r.reason.startswith(NOT_APPLIED))
            else r.passed,
            status=r.status.value,
            score=r.score,
            threshold=r.threshold,
            latency_ms=r.latency_ms,
            reason=r.reason,
        )
        for r in answer.rules
    }
    return RowOutcome(row, answer.passed, answer.action.value, rules, latency_ms=answer.latency_ms)


def threshold_only(policy: Policy, row: Row) -> RowOutcome:
    """A rule not applied to a row (an earlier rule stopped processing) has no verdict on it: a
    label for it there counts as *unjudged*, as does one whose evaluator errored or timed out.

    A row without text, judged per rule from its recorded scores (module docstring)."""
    rules = {}
    for name, score in row.scores.items():
        t = numeric_threshold(policy, name)
        if t is None:
            continue
        rules[name] = RuleOutcome(score >= t, "pass" if score >= t else "fail", score, t, 0.0, "threshold-only")
    return RowOutcome(row, None, None, rules, threshold_only=True)


def _check_concurrency(concurrency: int) -> None:
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise InvalidInputError(f"--concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")


def run_local(
    tester: Any,
    rows: Sequence[Row],
    *,
    usage: LLMUsage,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: RowProgress | None = None,
) -> EvalRun:
    """``rows`` through a PolicyTester (built with ``llm_usage=usage``)."""
    _check_concurrency(concurrency)
    policy: Policy = tester.policy
    live = [i for i, r in enumerate(rows) if r.response is not None]
    outcomes: list[RowOutcome | None] = [None] * len(rows)
    done = [0]
    lock = threading.Lock()

    def tick() -> None:
        with lock:
            done[0] += 1
            n = done[0]
        if progress is not None:
            progress(n, len(rows))

    for i, r in enumerate(rows):
        if r.response is None:
            outcomes[i] = threshold_only(policy, r)
            tick()
        elif (refused := _unsendable(r)) is not None:
            outcomes[i] = refused
            live.remove(i)
            tick()
    t0 = time.perf_counter()
    alone, together = _split(live, concurrency)
    for indices, n in ((alone, 1), (together, concurrency)):
        requests = [(rows[i].prompt or "", rows[i].response or "", rows[i].context, rows[i].stage) for i in indices]
        answers = tester.evaluate_many(requests, concurrency=n, on_done=lambda _i, _a: tick()) if requests else []
        for i, answer in zip(indices, answers, strict=True):
            outcomes[i] = dataclasses.replace(_outcome(rows[i], answer), alone=n == 1)
    wall = time.perf_counter() - t0
    where = f"{tester.sandbox_name} sandbox"
    return EvalRun(policy, [o for o in outcomes if o is not None], wall, where, usage, concurrency=concurrency)


def _split(live: list[int], concurrency: int) -> tuple[list[int], list[int]]:
    """The rows evaluated alone (the first LATENCY_ROWS; every row at concurrency 1), and the rest."""
    if concurrency == 1:
        return live, []
    return live[:LATENCY_ROWS], live[LATENCY_ROWS:]


def run_server(
    client: Any,
    name: str,
    policy: Policy,
    rows: Sequence[Row],
    *,
    environment: str,
    address: str,
    timeout: float | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: RowProgress | None = None,
) -> EvalRun:
    """``rows`` through a server's deployed policy ``name`` (whose content is ``policy``)."""
    _check_concurrency(concurrency)
    outcomes: list[RowOutcome | None] = [None] * len(rows)
    done = [0]
    lock = threading.Lock()

    def one(i: int, alone: bool = False) -> None:
        r = rows[i]
        if r.response is None:
            outcomes[i] = threshold_only(policy, r)
        elif (refused := _unsendable(r)) is not None:
            outcomes[i] = refused
        else:
            try:
                answer: Decision | CrossAuditError = client.evaluate(
                    name, r.prompt or "", r.response, r.context, environment=environment, timeout=timeout, stage=r.stage
                )
            except CrossAuditError as e:
                answer = e
            except Exception as e:  # one row the client cannot send is that row's error, not the run's end
                from crossaudit.sdk.tester import unevaluable  # (the SDK's engine side: imported when needed)

                answer = unevaluable(e)
            outcomes[i] = dataclasses.replace(_outcome(r, answer), alone=alone)
        with lock:
            done[0] += 1
            n = done[0]
        if progress is not None:
            progress(n, len(rows))

    t0 = time.perf_counter()
    alone, _ = _split([i for i, r in enumerate(rows) if r.response is not None and _unsendable(r) is None], concurrency)
    for i in alone:  # one at a time, here (see LATENCY_ROWS)
        one(i, alone=True)
    first = set(alone)
    rest = [i for i in range(len(rows)) if i not in first]
    with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(rest))), thread_name_prefix="eval") as pool:
        list(pool.map(one, rest))
    wall = time.perf_counter() - t0
    notes = ["LLM cost is not measured through a server (its metrics count it: crossaudit_llm_cost_usd_total)"]
    return EvalRun(
        policy,
        [o for o in outcomes if o is not None],
        wall,
        f"server {address}",
        LLMUsage(),
        notes,
        concurrency=concurrency,
    )
