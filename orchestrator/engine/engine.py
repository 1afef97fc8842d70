"""The decision engine: a validated Policy + a request → a Decision.

How a request runs:
1. The context is built (``time.*``, ``content.*`` derived) and the rules are planned:
   enabled rules by priority (higher first, then file order), a rule that reads
   ``previous_rule.X`` after X.
2. Every rule starts at once as a task. A rule checks its conditions (waiting only for
   the rules it reads), then calls its evaluator(s). Calls are shared within a request
   (two rules using one evaluator cost one call), cached across requests when the policy
   asks, retried on retryable errors with backoff, and bounded by what is left of the
   deadline. So a policy costs about its slowest evaluator, not the sum.
   A request that names a stage (``input`` or ``output``: the guard proxy's two steps; an
   agent's ``tool_call`` or ``tool_result``, docs/agents.md) runs only the rules of that stage
   (``stage: both``, the default, is of input and output, never of a tool stage); the others are
   reported as skipped, like disabled rules.
3. Results are *applied* in priority order: a failed ``block`` (or ``warn`` with
   ``continue_processing: false``) stops lower-priority rules, which are cancelled and
   reported as skipped.
4. Errors are fail-closed: an evaluator with no verdict and no fallback fails its rule with
   the rule's action; ``fallback.evaluator`` is tried first, then ``fallback.on_error``
   (``allow`` = fail-open). The decision lists every rule that errored. A rule that failed
   for want of a verdict does not stop the rules after it (step 3): it judged nothing, so the
   others' verdicts are all the decision knows of the content, and hiding them behind one
   outage (an LLM key missing, a model not installed) would leave the record blank.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from crossaudit.kernel import tracing
from crossaudit.kernel.dsl import (
    EVALUATION_STAGES,
    RULE_STAGES,
    ConsensusStrategy,
    FallbackOnError,
    ModifyConfig,
    Policy,
    Rule,
    Stage,
    TemplateFields,
    WarnConfig,
)
from crossaudit.kernel.errors import (
    CrossAuditError,
    DeadlineExceededError,
    EvaluatorError,
    EvaluatorTimeoutError,
    InvalidInputError,
    NotReplayableError,
)
from crossaudit.kernel.limits import EngineLimits
from crossaudit.kernel.lru import EvictingLRU
from crossaudit.kernel.results import (
    Action,
    ActionOutcome,
    Decision,
    EvaluatorResult,
    RuleResult,
    Status,
    Verdict,
    trusted,
    wire_text,
)
from orchestrator.engine import actions, consensus, spans, tools
from orchestrator.engine.cache import ResultCache
from orchestrator.engine.conditions import check_all
from orchestrator.engine.context import build_context
from orchestrator.engine.ratelimit import LimiterFactory, RateLimiter, local_limiter
from orchestrator.engine.replay import RecordedResults, Replay, Unreplayable, unreplayable_reason
from orchestrator.engine.thresholds import FeedbackStats, rule_threshold
from orchestrator.evaluators.base import Called, EvaluationInput, Evaluator, EvaluatorFactory, merge_provenance

FeedbackSource = Callable[[str, str], FeedbackStats | None]  # (policy name, rule name) -> stats
TIMEOUT_GRACE_S = 0.02  # the engine's own backstop after an evaluator's timeout


def plan(policy: Policy) -> list[Rule]:
    """Enabled rules in execution order: priority desc, file order, readers after what they read."""
    enabled = [r for r in policy.rules if r.enabled]
    index = {r.name: i for i, r in enumerate(policy.rules)}
    pending = sorted(enabled, key=lambda r: (-r.priority, index[r.name]))
    done: set[str] = set()
    ordered: list[Rule] = []
    names = {r.name for r in enabled}
    while pending:  # validation rejects cycles, so each pass places at least one rule
        for r in pending:
            if all(d in done or d not in names for d in r.depends_on):
                ordered.append(r)
                done.add(r.name)
                pending.remove(r)
                break
        else:  # pragma: no cover - defensive: cycle slipped past validation
            ordered.extend(pending)
            break
    return ordered


def applies_at(rule: Rule, stage: str) -> bool:
    """Whether ``rule`` runs for a request of ``stage`` ("" = no stage named: every rule);
    ``both`` is input and output, never a tool stage."""
    return not stage or stage in RULE_STAGES[rule.stage]


TOOL_STAGES = (Stage.TOOL_CALL.value, Stage.TOOL_RESULT.value)  # their context has ``tool``
FAIL_CLOSED = "fail-closed"
ALLOWED_ON_ERROR = "allowed by fallback.on_error"
MODIFY_ESCALATED = "fail-closed: modify had no verdict to redact with, escalated to block"


def no_verdict_action(rule: Rule) -> tuple[Action | None, str]:
    """The action a rule takes when its evaluators give no verdict, and how it was chosen: its
    own action (fail-closed), ``fallback.on_error``'s, or None when that is ``allow`` (fail-open).
    One place, so the engine and the checks that predict it (``policy validate``) agree."""
    on_error = rule.fallback.on_error if rule.fallback else None
    if on_error is FallbackOnError.ALLOW:
        return None, ALLOWED_ON_ERROR
    action = Action(on_error.value) if on_error else rule.action
    how = f"fallback.on_error={on_error.value}" if on_error else FAIL_CLOSED
    if action is Action.MODIFY:
        # Nothing to redact with: answering ``modify`` would hand back the original text.
        return Action.BLOCK, MODIFY_ESCALATED
    return action, how


def no_verdict_head(how: str) -> str:
    """The start of the reason of a rule with no verdict, before what each evaluator said: made
    of ``how`` alone (:func:`no_verdict_action`'s), so of policy values."""
    return f"no verdict, {how}: " if how == ALLOWED_ON_ERROR else f"no verdict ({how}): "


# Every head :func:`no_verdict_head` writes: what an audit record may keep of a no-verdict reason
# (crossaudit.governance.records.recorded_reason), matched whole, never cut out of the reason's text.
NO_VERDICT_HEADS = frozenset(
    no_verdict_head(how)
    for how in (
        FAIL_CLOSED,
        ALLOWED_ON_ERROR,
        MODIFY_ESCALATED,
        *(f"fallback.on_error={v.value}" for v in FallbackOnError if v is not FallbackOnError.ALLOW),
    )
)


def no_verdict_reason(how: str, parts: list[str]) -> str:
    """The reason of a rule with no verdict: :func:`no_verdict_head`, then ``parts`` (one per
    evaluator that gave none, ``name: what it said``) joined by ``"; "``."""
    return no_verdict_head(how) + "; ".join(parts)


@dataclass(frozen=True)
class _Built:
    evaluator: Evaluator
    identity: str  # the result cache's view of it (see Engine._cache_identity)
    limiter: RateLimiter | None  # the spec's rate_limit


@dataclass
class _Request:
    policy: Policy
    inp: EvaluationInput
    raw_context: Mapping[str, Any]
    deadline: float
    decision_id: str
    replay: Replay | None = None
    stage: str = ""  # the request's ("" = every rule)
    # replay only: evaluators this request could not run faithfully, by name -> (reason, why)
    unreplayable: dict[str, tuple[Unreplayable, str]] = field(default_factory=dict)
    # a cache hit is a done future (no task); a call that runs is a task
    calls: dict[tuple[str, float, int, float], asyncio.Future[EvaluatorResult]] = field(default_factory=dict)
    rule_tasks: dict[str, asyncio.Future[RuleResult]] = field(default_factory=dict)
    inputs_digest: str = ""  # the cache key's part from the inputs, computed once a decision (_cache_key)
    rule_spans: dict[str, Any] = field(default_factory=dict)  # tracing: the span of a rule that runs as a task
    # replay only: evaluator identities by name (None: does not build), looked up once a decision
    identities: dict[str, str | None] = field(default_factory=dict)


class Engine:
    """Evaluates policies. One engine serves many policies and concurrent requests."""

    def __init__(
        self,
        factory: EvaluatorFactory,
        *,
        limits: EngineLimits | None = None,
        cache: ResultCache | None = None,
        feedback: FeedbackSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        scope: str = "",
        limiters: LimiterFactory = local_limiter,
        bucket_scope: str = "",
    ) -> None:
        """``scope`` names whose verdicts this engine caches (the service passes the tenant), so a
        cache handed to two engines still never serves one tenant's verdict to another.
        ``limiters`` keeps the evaluators' ``rate_limit`` buckets (in memory by default; the
        service passes a shared one when replicas share a store). ``bucket_scope`` names those
        buckets when they must not be the scope's (a shadow engine: buckets of its own, while its
        verdicts keep the live identities); "" = the scope. Set it before the first evaluation."""
        self.scope = scope
        self.bucket_scope = bucket_scope
        self.limiters = limiters
        self.factory = factory
        self.limits = limits or EngineLimits()
        self.cache = cache if cache is not None else ResultCache(self.limits.cache_entries, clock)
        self.feedback = feedback
        self.clock = clock
        self.now = now
        # built evaluators by (policy version, name); old policy versions age out and are closed
        self._evaluators: EvictingLRU[tuple[str, str], _Built] = EvictingLRU(
            self.limits.evaluator_instances, self._close_evicted
        )
        self._closing: set[asyncio.Task[None]] = set()
        # plans by policy object (kept beside it, so a reused id never answers another's plan)
        self._plans: LRUCache[int, tuple[Policy, list[Rule]]] = LRUCache(max(1, self.limits.evaluator_instances))

    # -- evaluators ---------------------------------------------------------------------------

    def evaluator_for(self, policy: Policy, name: str) -> Evaluator:
        return self._evaluator(policy, name).evaluator

    def identity_of(self, policy: Policy, name: str) -> str:
        """The identity results of evaluator ``name`` carry (it is built once, as a call would)."""
        return self._evaluator(policy, name).identity

    def _evaluator(self, policy: Policy, name: str) -> _Built:
        """The built evaluator, its cache identity and its rate limiter (once per policy version)."""
        key = (policy.digest or str(id(policy)), name)
        hit = self._evaluators.get(key)
        if hit is not None:
            return hit
        spec = policy.evaluator(name)
        ev = self.factory.build(spec, policy)
        cfg = spec.typed_config
        rpm = getattr(cfg, "rate_limit", None)
        burst = getattr(cfg, "rate_limit_burst", None)
        buckets = self.bucket_scope or self.scope
        limiter = self.limiters(f"{buckets}/{policy.name}/{name}", rpm, burst, name) if rpm else None
        built = self._evaluators[key] = _Built(ev, self._cache_identity(ev, spec.model_dump(mode="json")), limiter)
        return built

    def _plan(self, policy: Policy) -> list[Rule]:
        """:func:`plan` of ``policy``, computed once per policy object (a replay evaluates one
        policy thousands of times; the live path one deployed version many times)."""
        hit = self._plans.get(id(policy))
        if hit is None or hit[0] is not policy:
            hit = self._plans[id(policy)] = (policy, plan(policy))
        return hit[1]

    def _close_evicted(self, _key: tuple[str, str], built: _Built) -> None:
        """An evaluator evicted for room is closed off the request path (it may hold a sandbox
        pool or an HTTP client); the task is kept so it is not collected mid-close."""
        task = asyncio.get_running_loop().create_task(built.evaluator.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _cache_identity(self, evaluator: Evaluator, spec: Mapping[str, Any]) -> str:
        """Everything a cached verdict depends on besides the input: the scope (tenant), the
        evaluator's identity (kind, name, code + dependency digest for custom code) and its
        whole spec as written, so ``${NAME}`` secrets count by name, never by value. A redeploy
        that changes any of these, or another policy's evaluator of the same name, never hits."""
        material = json.dumps([self.scope, evaluator.identity(), spec], sort_keys=True, default=str)
        return hashlib.sha256(material.encode()).hexdigest()

    async def aclose(self) -> None:
        for built in self._evaluators.drain():
            await built.evaluator.aclose()

    # -- evaluation -----------------------------------------------------------------------------

    @spans.traced_evaluate
    async def evaluate(
        self,
        policy: Policy,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        decision_id: str | None = None,
        stage: str = "",
        replay: Replay | None = None,
    ) -> Decision:
        """``stage``: ``input`` or ``output`` runs only that stage's rules; "" runs every rule.
        ``replay``: re-evaluate a recorded decision (:mod:`orchestrator.engine.replay`): recorded
        verdicts are reused by identity, the clock is the decision's; raises NotReplayableError
        when an applied rule needed a verdict it could not faithfully get."""
        start = self.clock()
        if stage and stage not in EVALUATION_STAGES:
            raise InvalidInputError(f"unknown stage {stage[:64]!r}: {', '.join(EVALUATION_STAGES)} or none (all rules)")
        budget = self._budget(policy, timeout, prompt, response)
        now = replay.at if replay is not None else self.now()
        ctx = build_context(context, response, timezone=policy.settings.timezone, now=now)
        if stage in TOOL_STAGES:
            # name, call id, parsed arguments; at tool_call the arguments judged as the tool reads them
            ctx["tool"], response = tools.tool_context(stage, ctx, response, self.limits)
        req = _Request(
            policy=policy,
            inp=EvaluationInput(prompt=prompt, response=response, context=ctx),
            raw_context=dict(context or {}),
            deadline=start + budget,
            decision_id=decision_id or str(uuid.uuid4()),
            replay=replay, stage=stage,
        )  # fmt: skip
        order = [r for r in self._plan(policy) if applies_at(r, stage)] if stage else self._plan(policy)
        results: list[RuleResult] = []
        stopped_by: str | None = None
        decided: dict[str, RuleResult] = {}  # rules decided at once (nothing to wait for): no task each
        try:
            if replay is None:
                self._start_rules(req, order, decided)
            else:
                await self._replay_rules(req, order, results)
            for rule in order if replay is None else ():
                task = req.rule_tasks.get(rule.name)
                if stopped_by is not None:
                    if task is not None:
                        task.cancel()
                    results.append(_skipped(rule, f"not applied: rule {stopped_by!r} stopped processing"))
                    continue
                res = decided.get(rule.name)
                if res is None:
                    assert task is not None
                    res = await task
                results.append(res)
                if not res.passed and self._stops(policy, rule, res):
                    stopped_by = rule.name
        finally:
            futures: list[asyncio.Future[Any]] = [*req.rule_tasks.values(), *req.calls.values()]
            pending = [t for t in futures if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for rule in policy.rules:
            if not rule.enabled:
                results.append(_skipped(rule, "disabled"))
            elif not applies_at(rule, stage):
                results.append(_skipped(rule, f"not applied at the {stage} stage (stage: {rule.stage.value})"))
        if req.unreplayable and replay is not None and not replay.live:  # a shadow keeps the errors, as live
            _raise_unreplayable(req, results)
        return self._decide(req, results, start)

    def _budget(self, policy: Policy, timeout: float | None, prompt: str, response: str) -> float:
        """The seconds a decision may take (the policy's timeout, the caller's if shorter), once the
        texts are known to fit engine_limits.max_content_bytes."""
        budget = policy.settings.timeout or self.limits.default_timeout_s
        if timeout is not None:
            budget = min(budget, timeout)
        if budget <= 0:
            raise DeadlineExceededError("no time left to evaluate the policy")
        size = len(prompt.encode()) + len(response.encode())
        if size > self.limits.max_content_bytes:
            raise InvalidInputError(
                f"prompt + response are {size} bytes, over the {self.limits.max_content_bytes} bytes a decision "
                "takes (engine_limits.max_content_bytes)"
            )
        return budget

    def _start_rules(self, req: _Request, order: list[Rule], decided: dict[str, RuleResult]) -> None:
        """Every rule started in plan order, as the live path always did: a rule whose evaluators'
        results are at hand (cache hits, calls another rule finished) and that reads no other rule
        is decided here, without a task, a suspension and the loop's callbacks (most rules of a
        cached policy); the others run as tasks, concurrently, their calls started at once."""
        loop = asyncio.get_running_loop()
        read = _read_rules(order)
        traced = tracing.enabled()
        for rule in order:
            started = spans.now() if traced else 0
            res = self._rule_now(req, rule)
            if res is None and traced:  # its span, before any of its call tasks starts (they find it)
                sp = req.rule_spans[rule.name] = spans.start_rule(rule, started)
                token = tracing.use(sp)
                try:
                    task = asyncio.create_task(self._traced_rule(req, rule, sp), name=f"rule:{rule.name}")
                finally:
                    tracing.release(token)
                req.rule_tasks[rule.name] = task
                continue
            if res is None:
                req.rule_tasks[rule.name] = asyncio.create_task(self._run_rule(req, rule), name=f"rule:{rule.name}")
                continue
            if traced:  # decided at once (cached verdicts, or skipped): a span only when asked for
                spans.decided_rule(rule, res, started)
            decided[rule.name] = res
            if rule.name in read:  # what a reader of previous_rule.<name> awaits: already done
                done: asyncio.Future[RuleResult] = loop.create_future()
                done.set_result(res)
                req.rule_tasks[rule.name] = done

    def _rule_now(self, req: _Request, rule: Rule) -> RuleResult | None:
        """``rule``'s result when it needs nothing to wait for (no rule it reads, every evaluator's
        result at hand, no fallback to call), else None: it then runs as a task (:meth:`_run_rule`),
        which finds the calls started here."""
        if rule.conditions and rule.depends_on:
            return None
        t0 = self.clock()
        ctx = req.inp.context
        ok, why = check_all(rule.conditions, ctx)
        if not ok:
            return _skipped(rule, why)
        weights = _weights(rule)
        calls = [self._start_call(req, rule, name) for name, _ in weights]
        if not all(c.done() for c in calls):
            return None
        evaluated = [_own_copy(c.result()) for c in calls]
        errored = [r for r in evaluated if r.status in (Status.ERROR, Status.TIMEOUT)]
        if errored and rule.fallback and rule.fallback.evaluator:
            return None  # the fallback is called by the rule's task
        stats = self.feedback(req.policy.name, rule.name) if self.feedback and rule.feedback_config else None
        threshold, why_threshold = rule_threshold(rule, ctx, stats)
        return self._verdict(rule, t0, threshold, why_threshold, weights, evaluated, errored, False)

    async def _replay_rules(self, req: _Request, order: list[Rule], results: list[RuleResult]) -> None:
        """Replay runs the rules one after the other in plan order (readers after what they read),
        without a task each: their verdicts are mostly recorded, so there is nothing to overlap, and
        a replay overlaps decisions instead. A rule after one that stops processing is skipped, as
        the live path's cancelled rule is."""
        loop = asyncio.get_running_loop()
        read = _read_rules(order)
        for i, rule in enumerate(order):
            if tracing.enabled():
                res = await self._traced_rule(req, rule, spans.start_rule(rule, spans.now()))
            else:
                res = await self._run_rule(req, rule)
            results.append(res)
            if rule.name in read:  # what a reader of previous_rule.<name> awaits: already done
                done: asyncio.Future[RuleResult] = loop.create_future()
                done.set_result(res)
                req.rule_tasks[rule.name] = done
            if not res.passed and self._stops(req.policy, rule, res):
                results.extend(
                    _skipped(r, f"not applied: rule {rule.name!r} stopped processing") for r in order[i + 1 :]
                )
                return

    @staticmethod
    def _stops(policy: Policy, rule: Rule, res: RuleResult) -> bool:
        """Whether ``res`` stops the rules after it: a failed verdict of ``block`` (or of ``warn``
        without ``continue_processing``). A rule with no verdict still fails closed, but does
        not stop the others (module docstring, step 4)."""
        if res.status in (Status.ERROR, Status.TIMEOUT):
            return False
        if res.action is Action.BLOCK:
            return policy.settings.stop_on_block
        if res.action is Action.WARN and isinstance(rule.typed_action_config, WarnConfig):
            return not rule.typed_action_config.continue_processing
        return False

    async def _context_of(self, req: _Request, rule: Rule) -> Mapping[str, Any]:
        """The request's context, with ``previous_rule`` once the rules this one reads have ended
        (a copy then; the request's own, read only, otherwise)."""
        if not (rule.conditions and rule.depends_on):
            return req.inp.context
        ctx: dict[str, Any] = dict(req.inp.context)
        if rule.depends_on:
            previous: dict[str, Any] = {}
            for dep in rule.depends_on:
                task = req.rule_tasks.get(dep)
                if task is None:
                    continue  # a disabled rule: validation prevents reading it
                previous[dep] = self._as_previous(await asyncio.shield(task))
            ctx["previous_rule"] = previous
        return ctx

    async def _with_fallback(
        self, req: _Request, rule: Rule, evaluated: list[EvaluatorResult], errored: list[EvaluatorResult]
    ) -> tuple[list[EvaluatorResult], list[EvaluatorResult], bool]:
        """The fallback evaluator in place of the ones that gave no verdict, when it gives one (their
        errors stay on record after the verdicts); (results, still errored, fallback used)."""
        if not (errored and rule.fallback and rule.fallback.evaluator):
            return evaluated, errored, False
        if tracing.enabled():
            with spans.fallback_calls():
                fb = await self._call(req, rule, rule.fallback.evaluator)
        else:
            fb = await self._call(req, rule, rule.fallback.evaluator)
        if fb.status in (Status.ERROR, Status.TIMEOUT):
            return [*evaluated, fb], errored, False
        replaced = [fb if r in errored else r for r in evaluated]
        return [*replaced, *errored], [], True

    async def _traced_rule(self, req: _Request, rule: Rule, sp: Any) -> RuleResult:
        """:meth:`_run_rule` in the rule's span (current here, so the calls it starts are its
        children; those started before, by :meth:`_start_rules`, find it in ``req.rule_spans``)."""
        token = tracing.use(sp)
        try:
            res = await self._run_rule(req, rule)
        except asyncio.CancelledError:
            spans.cancelled_rule(sp)
            raise
        except BaseException as exc:
            tracing.failed(sp, exc)
            sp.end()
            raise
        finally:
            tracing.release(token)
        spans.end_rule(sp, res)
        return res

    async def _run_rule(self, req: _Request, rule: Rule) -> RuleResult:
        t0 = self.clock()
        ctx = await self._context_of(req, rule)
        ok, why = check_all(rule.conditions, ctx)
        if not ok:
            return _skipped(rule, why)
        stats = self.feedback(req.policy.name, rule.name) if self.feedback and rule.feedback_config else None
        threshold, why_threshold = rule_threshold(rule, ctx, stats)

        weights = _weights(rule)
        recorded = []
        if req.replay is not None:
            recorded = [r for name, _ in weights if (r := self._replayed(req, name)) is not None]
        if recorded and len(recorded) == len(weights):  # replay: every verdict recorded, nothing to wait for
            evaluated = recorded
        elif len(weights) == 1:  # the common case: no gather (a future and callbacks per rule)
            evaluated = [await self._call(req, rule, weights[0][0])]
        else:
            evaluated = list(await asyncio.gather(*(self._call(req, rule, name) for name, _ in weights)))
        errored = [r for r in evaluated if r.status in (Status.ERROR, Status.TIMEOUT)]
        evaluated, errored, fallback_used = await self._with_fallback(req, rule, evaluated, errored)
        return self._verdict(rule, t0, threshold, why_threshold, weights, evaluated, errored, fallback_used)

    # Long: the rule's verdict from its evaluators' results, one function for the single-evaluator,
    # consensus, disagreement and no-verdict cases so that they are read (and kept) side by side.
    def _verdict(
        self,
        rule: Rule,
        t0: float,
        threshold: float,
        why_threshold: str,
        weights: list[tuple[str, float]],
        evaluated: list[EvaluatorResult],
        errored: list[EvaluatorResult],
        fallback_used: bool,
    ) -> RuleResult:
        answered = [r for r in evaluated[: len(weights)] if r.status not in (Status.ERROR, Status.TIMEOUT)]
        for r in evaluated[: len(weights)]:
            if r.score is not None:
                r.status = Status.PASS if self._vote(r, threshold) else Status.FAIL

        latency = (self.clock() - t0) * 1000
        if not answered:
            return self._errored(rule, evaluated, threshold, latency, errored)
        if len(weights) == 1:
            score = evaluated[0].score or 0.0
            passed = self._vote(evaluated[0], threshold)
            reason = why_threshold
        else:
            strategy = rule.consensus_strategy or ConsensusStrategy.WEIGHTED_AVERAGE
            ballots = [
                consensus.Ballot(
                    score=r.score if r.score is not None else None, weight=w, vote=self._vote(r, threshold)
                )
                for r, (_, w) in zip(evaluated, weights, strict=False)
            ]
            score, passed, reason = consensus.combine(strategy, ballots, threshold)
            split = (
                consensus.disagreement(ballots, rule.on_disagreement.min_spread)
                if rule.on_disagreement is not None and rule.on_disagreement.reviews
                else None
            )
            if split is not None:  # not decided here: a reviewer does (the rule's own action is not taken)
                silent = f"{len(errored)} evaluator(s) gave no verdict" if errored else ""
                return trusted(RuleResult, {
                    "rule": rule.name,
                    "status": Status.FAIL,
                    "passed": False,
                    "score": float(score),
                    "threshold": float(threshold),
                    "action": Action.REQUIRE_REVIEW,
                    "evaluators": evaluated,
                    "fallback_used": fallback_used,
                    "reason": wire_text("; ".join(x for x in (split, reason, why_threshold, silent) if x)),
                    "latency_ms": latency,
                    "disagreement": True,
                })  # fmt: skip
            reason = "; ".join(x for x in (reason, why_threshold) if x)
        if errored:
            reason = "; ".join(x for x in (reason, f"{len(errored)} evaluator(s) gave no verdict") if x)
        # Built without validation (``trusted``): every value is our own, of the field's type; what
        # the validators would do is done here (floats as floats, the reason made sendable).
        return trusted(RuleResult, {
            "rule": rule.name,
            "status": Status.PASS if passed else Status.FAIL,
            "passed": bool(passed),
            "score": float(score),
            "threshold": float(threshold),
            "action": None if passed else rule.action,
            "evaluators": evaluated,
            "fallback_used": fallback_used,
            "reason": wire_text(reason),
            "latency_ms": latency,
        })  # fmt: skip

    @staticmethod
    def _vote(r: EvaluatorResult, threshold: float) -> bool:
        # Both verdicts must agree: the score clears the threshold and the evaluator did not
        # explicitly say it failed.
        return r.score is not None and r.score >= threshold and r.passed is not False

    @staticmethod
    def _as_previous(r: RuleResult) -> dict[str, Any]:
        details: dict[str, Any] = {}
        for ev in r.evaluators:
            for k, v in ev.details.items():
                details.setdefault(k, v)
        return {
            **details,
            "score": r.score,
            "passed": r.passed,
            "status": r.status.value,
            "action": r.action.value if r.action else None,
            "threshold": r.threshold,
        }

    def _errored(
        self,
        rule: Rule,
        evaluated: list[EvaluatorResult],
        threshold: float,
        latency: float,
        errored: list[EvaluatorResult],
    ) -> RuleResult:
        timed_out = all(r.status is Status.TIMEOUT for r in errored) and bool(errored)
        status = Status.TIMEOUT if timed_out else Status.ERROR
        action, how = no_verdict_action(rule)
        # The answer quotes each message; the audit record rebuilds this reason from the rule's
        # parts with a digest in place of each message (crossaudit.governance.records).
        reason = no_verdict_reason(how, [f"{r.evaluator}: {r.error}" for r in errored if r.error])
        return RuleResult(
            rule=rule.name,
            status=status,
            passed=action is None,  # fail-open (fallback.on_error: allow): no action, the rule passes
            threshold=threshold,
            action=action,
            evaluators=evaluated,
            reason=reason,
            latency_ms=latency,
        )

    async def _call(self, req: _Request, rule: Rule, name: str) -> EvaluatorResult:
        """One evaluator's result for this request, shared between rules that ask alike."""
        if req.replay is not None:
            replayed = self._replayed(req, name)
            if replayed is not None:
                return replayed
        call = self._start_call(req, rule, name)
        # A finished call (another rule's, or a cache hit) needs no shield and no suspension.
        return _own_copy(call.result() if call.done() else await asyncio.shield(call))

    def _start_call(self, req: _Request, rule: Rule, name: str) -> asyncio.Future[EvaluatorResult]:
        """The call of ``name`` ``rule`` makes, shared with the rules that ask alike: a cache hit is
        a done future (no task), anything else a task started now."""
        spec = req.policy.evaluator(name)
        cfg_timeout = getattr(spec.typed_config, "timeout", None)
        per_call = rule.settings.timeout or cfg_timeout or self.limits.default_rule_timeout_s
        retries = rule.settings.retries
        if retries is None:
            retries = req.policy.settings.retries or 0
            if rule.settings.retry_on_failure and retries == 0:
                retries = 1
        if rule.settings.retry_on_failure is False:
            retries = 0
        retries = min(retries, self.limits.max_retries)
        ttl = 0.0
        if req.policy.settings.cache_results or rule.settings.cache_duration is not None:
            ttl = (
                rule.settings.cache_duration
                if rule.settings.cache_duration is not None
                else req.policy.settings.cache_duration or self.limits.default_cache_duration_s
            )
        key = (name, per_call, retries, ttl)
        call = req.calls.get(key)
        if call is None:
            call = req.calls[key] = self._begin(req, name, per_call, retries, ttl, rule.name)
        return call

    def _begin(
        self, req: _Request, name: str, per_call: float, retries: int, ttl: float, rule: str = ""
    ) -> asyncio.Future[EvaluatorResult]:
        """A done future holding ``name``'s cached result for this request, or the call's task.
        The cache is read here once; the task does not read it again after a miss."""
        looked_up = False
        if ttl > 0 and req.replay is None:
            t0 = self.clock()
            try:
                built = self._evaluator(req.policy, name)
            except Exception:  # reported by _invoke, as a call that cannot be made
                built = None
            if built is not None:
                looked_up = True
                hit = self.cache.entry(self._cache_key(req, built.identity))
                if hit is not None:  # the provenance of the call that produced it
                    done: asyncio.Future[EvaluatorResult] = asyncio.get_running_loop().create_future()
                    done.set_result(
                        self._result(name, built.evaluator.kind, hit[0], t0, attempts=0, cached=True,
                                     identity=built.identity, provenance=hit[1])
                    )  # fmt: skip
                    return done  # no call, no span: the rule's span counts its cache hits
        call = self._invoke(req, name, per_call, retries, ttl, looked_up)
        if tracing.enabled():
            kind = req.policy.evaluator(name).kind.value
            call = spans.traced_call(name, kind, call, lambda: req.rule_spans.get(rule))
        return asyncio.create_task(call, name=f"eval:{name}")

    def _cache_key(self, req: _Request, identity: str) -> str:
        """The result cache's key of ``identity``'s verdict on this request's inputs; the inputs'
        part (texts, context and stage, the large part) is encoded and hashed once a decision. The
        stage counts: at a tool stage the evaluators' context has the engine's own ``tool`` (the
        parsed arguments), so a verdict given at another stage on the same texts and caller context
        was given on another context and is never served there."""
        if not req.inputs_digest:
            inputs = [req.inp.prompt, req.inp.response, req.raw_context]
            if req.stage in TOOL_STAGES:  # the other stages' keys are unchanged (a warm cache stays warm)
                inputs.append(req.stage)
            material = json.dumps(inputs, sort_keys=True, default=str)
            req.inputs_digest = hashlib.sha256(material.encode()).hexdigest()
        return hashlib.sha256(f"{identity}\n{req.inputs_digest}".encode()).hexdigest()

    def _replayed(self, req: _Request, name: str) -> EvaluatorResult | None:
        """Replay: a rule's own copy of the verdict this very evaluator recorded for the decision
        (no call, no task), or None when there is none."""
        assert req.replay is not None
        if name in req.identities:
            identity = req.identities[name]
        else:
            try:
                identity = self._evaluator(req.policy, name).identity
            except Exception:  # an evaluator that does not build has no verdict: ``_invoke`` reports it
                identity = None
            req.identities[name] = identity
        if identity is None:
            return None
        results = req.replay.results
        if isinstance(results, RecordedResults):  # validated from the document for this rule alone: no copy
            return results.result(identity, evaluator=name, cached=False, attempts=0)
        recorded = results.get(identity)
        return None if recorded is None else _own_copy(recorded, evaluator=name, cached=False, attempts=0)

    async def _invoke(
        self, req: _Request, name: str, per_call: float, retries: int, ttl: float, looked_up: bool = False
    ) -> EvaluatorResult:
        """``looked_up``: the cache was read for this call already (a miss), not read again."""
        t0 = self.clock()
        try:
            built = self._evaluator(req.policy, name)
            evaluator, identity = built.evaluator, built.identity
        except Exception as e:  # a misconfigured evaluator fails its rules (closed), not the request
            err = e if isinstance(e, CrossAuditError) else EvaluatorError(f"{type(e).__name__}: {e}")
            if req.replay is not None:
                req.unreplayable.setdefault(name, (Unreplayable.BUILD_FAILED, f"evaluator {name!r} did not build"))
            return EvaluatorResult(
                evaluator=name,
                kind=req.policy.evaluator(name).kind.value,
                status=Status.ERROR,
                error=err.message,
                error_type=type(err).__name__,
            )
        kind = evaluator.kind
        if req.replay is not None and not req.replay.may_run(kind):  # recorded ones never get here (_call)
            reason = unreplayable_reason(kind, name, req.replay.results)
            why = f"evaluator {name!r} ({kind}) has no recorded verdict and may not run again ({reason.value})"
            req.unreplayable.setdefault(name, (reason, why))
            return EvaluatorResult(
                evaluator=name,
                kind=kind,
                status=Status.ERROR,
                error=why,
                error_type=NotReplayableError.__name__,
                identity=identity,
            )
        cache_key = ""
        if ttl > 0:
            cache_key = self._cache_key(req, identity)
            hit = None if looked_up else self.cache.entry(cache_key)
            if hit is not None:  # the provenance of the call that produced it
                return self._result(
                    name, kind, hit[0], t0, attempts=0, cached=True, identity=identity, provenance=hit[1]
                )
        attempts = 0

        async def attempt() -> Called:
            nonlocal attempts
            attempts += 1
            return await self._attempt(req, built, per_call)

        try:
            called: Called = await self._retrying(req, retries)(attempt)
        except CrossAuditError as last:
            status = Status.TIMEOUT if isinstance(last, EvaluatorTimeoutError) else Status.ERROR
            if req.replay is not None:  # what it would decide is unknown: not a flip
                why = f"evaluator {name!r} ran again and gave no verdict ({type(last).__name__})"
                req.unreplayable.setdefault(name, (Unreplayable.EVALUATOR_FAILED, why))
            return EvaluatorResult(
                evaluator=name,
                kind=kind,
                status=status,
                error=last.message,
                error_type=type(last).__name__,
                attempts=attempts,
                latency_ms=(self.clock() - t0) * 1000,
                identity=identity,
                provenance=self._provenance(evaluator, {}),  # what failed: its static facts
            )
        provenance = self._provenance(evaluator, called.facts)
        if cache_key:
            self.cache.put(cache_key, called.verdict, ttl, provenance)
        return self._result(name, kind, called.verdict, t0, attempts=attempts, identity=identity, provenance=provenance)

    @staticmethod
    def _provenance(evaluator: Evaluator, facts: Mapping[str, str]) -> dict[str, str]:
        """The evaluator's static facts, then the call's own (never overriding them): both come from
        host-side code, never from the verdict (tenant code's output for custom evaluators)."""
        try:
            static = evaluator.provenance()
        except Exception:  # an adapter bug must not fail a verdict it gave: the kind is still known
            static = {}
        return merge_provenance({**static, "kind": evaluator.kind}, facts)

    def _retrying(self, req: _Request, retries: int) -> AsyncRetrying:
        """The one retry policy of evaluator calls: a retryable error is tried again, at most
        ``retries`` times, after a backoff doubling from ``retry_backoff_s`` or the provider's
        ``Retry-After`` when that is longer; no wait that would end past the deadline is begun
        (the last error is the rule's). A pure retry loop, so tenacity's, not one of our own."""
        base = self.limits.retry_backoff_s

        def wait(state: RetryCallState) -> float:
            failed = state.outcome.exception() if state.outcome is not None else None
            asked = getattr(failed, "retry_after", None) or 0.0
            return max(base * 2 ** (state.attempt_number - 1), asked)

        def stop(state: RetryCallState) -> bool:
            # Computes the wait itself: tenacity before 8.3 asks ``stop`` before ``wait``.
            return state.attempt_number > retries or self.clock() + wait(state) >= req.deadline

        return AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, CrossAuditError) and e.retryable),
            stop=stop,
            wait=wait,
            reraise=True,
        )

    async def _attempt(self, req: _Request, built: _Built, per_call: float) -> Called:
        """One call of an evaluator within what is left of the deadline, every failure typed:
        an adapter bug must not take the decision down, it fails its rule closed."""
        remaining = req.deadline - self.clock()
        if remaining <= 0:
            raise EvaluatorTimeoutError("the request's deadline ran out before the evaluator answered")
        timeout = min(per_call, remaining)
        try:
            if built.limiter is not None:  # rate_limit, for every evaluator kind
                timeout -= await built.limiter.acquire(timeout)
            called = await asyncio.wait_for(built.evaluator.call(req.inp, timeout=timeout), timeout + TIMEOUT_GRACE_S)
            # an adapter may have extended the verdict without validation
            return Called(called.verdict.rechecked(), called.facts)
        except TimeoutError:
            raise EvaluatorTimeoutError(f"no answer within {timeout:.3f}s") from None
        except (CrossAuditError, asyncio.CancelledError):
            raise
        except Exception as e:
            raise EvaluatorError(f"{type(e).__name__}: {e}") from e

    def _result(
        self,
        name: str,
        kind: str,
        v: Verdict,
        t0: float,
        *,
        attempts: int,
        cached: bool = False,
        identity: str = "",
        provenance: dict[str, str] | None = None,
    ) -> EvaluatorResult:
        # Without validation: a verdict is checked where it is made (Verdict's validators, the wire check).
        return trusted(EvaluatorResult, {
            "evaluator": name,
            "kind": kind,
            "status": Status.PASS if v.passed is not False else Status.FAIL,
            "score": float(v.score),  # a verdict built by model_copy(update=) may hold an int
            "passed": v.passed,
            "violations": list(v.violations),
            "details": dict(v.details),
            "spans": list(v.spans),
            "latency_ms": (self.clock() - t0) * 1000,
            "attempts": attempts,
            "cached": cached,
            "identity": identity,
            "provenance": dict(provenance or {}),
        })  # fmt: skip

    # -- the decision -------------------------------------------------------------------------

    def _decide(self, req: _Request, results: list[RuleResult], start: float) -> Decision:
        policy = req.policy
        moment = req.replay.at if req.replay is not None else self.now()
        outcomes: list[ActionOutcome] = []
        edits: list[tuple[ModifyConfig, RuleResult]] = []
        worst = Action.ALLOW
        by_name = {r.name: r for r in policy.rules}
        for res in results:
            if res.passed or res.action is None:
                continue
            rule = by_name[res.rule]
            if res.action.severity > worst.severity:
                worst = res.action
            if req.replay is not None:  # replay compares verdicts and actions: nothing is rendered or sent
                continue
            fields = TemplateFields(
                rule_name=rule.name,
                rule_score=res.score,
                rule_threshold=res.threshold,
                rule_action=res.action.value,
                rule_status=res.status.value,
                policy_name=policy.name,
                policy_version=policy.version,
                content_hash=req.inp.context["content"]["hash"],
                content_length=req.inp.context["content"]["length"],
                timestamp=moment.isoformat(),
                decision_id=req.decision_id,
            ).values()
            res.outcome = actions.build_outcome(
                rule,
                res,
                res.action,
                fields=fields,
                now=moment,
                config=rule.on_disagreement if res.disagreement else None,
            )
            outcomes.append(res.outcome)
            if res.action is Action.MODIFY:
                cfg = rule.typed_action_config
                edits.append((cfg if isinstance(cfg, ModifyConfig) else ModifyConfig(), res))
        passed = all(r.passed or r.action in (Action.CONTINUE, Action.ALLOW) for r in results)
        errored = [
            r.rule
            for r in results
            if r.status in (Status.ERROR, Status.TIMEOUT)
            or any(e.status in (Status.ERROR, Status.TIMEOUT) for e in r.evaluators if not r.fallback_used)
        ]
        # A modify rule that produced no verdict (errored, timed out) means the response may hold
        # what it should have redacted: never return it as the modified response.
        unredacted = any(
            by_name[r.rule].action is Action.MODIFY and r.status in (Status.ERROR, Status.TIMEOUT)
            for r in results
            if r.rule in by_name
        )
        return trusted(Decision, {  # without validation: every value is the engine's own, typed
            "policy": policy.name,
            "policy_version": policy.version,
            "passed": passed,
            "action": worst,
            "rules": results,
            "modified_response": None if unredacted else _modified(req, edits),
            "outcomes": outcomes,
            "errored_rules": errored,
            "latency_ms": (self.clock() - start) * 1000,
            "decision_id": req.decision_id,
        })  # fmt: skip


def _modified(req: _Request, edits: list[tuple[ModifyConfig, RuleResult]]) -> str | None:
    """The modified text: at the tool_call stage the arguments redacted inside their values (still
    valid JSON: :mod:`orchestrator.engine.tools`), else the response as the actions modify it."""
    if req.stage != Stage.TOOL_CALL.value or not edits:
        return actions.apply_modifications(req.inp.response, edits)
    return tools.redact_arguments(req.inp.response, actions.redactions(req.inp.response, edits))


def _raise_unreplayable(req: _Request, results: list[RuleResult]) -> None:
    """Raise NotReplayableError when a rule that was applied used an evaluator the replay could
    not run faithfully (a rule stopped or skipped before it did not: its verdict was not needed)."""
    used = {e.evaluator for r in results if r.status is not Status.SKIPPED for e in r.evaluators}
    for name, (reason, why) in req.unreplayable.items():
        if name in used:
            raise NotReplayableError(why, reason=reason.value)


def _own_copy(result: EvaluatorResult, **changes: Any) -> EvaluatorResult:
    """A rule's own copy of a result that rules share (each sets its copy's status), with
    ``changes``. Containers are copied; nested details deeply, only when there are any (spans are
    immutable)."""
    details = result.details
    nested = any(isinstance(v, dict | list) for v in details.values())
    return trusted(EvaluatorResult, {  # a copy of a validated result: no validation again
        **result.__dict__,
        "violations": list(result.violations),
        "details": copy.deepcopy(details) if nested else dict(details),
        "spans": list(result.spans),
        "provenance": dict(result.provenance),
        **changes,
    })  # fmt: skip


def _weights(rule: Rule) -> list[tuple[str, float]]:
    """(evaluator, weight) of each evaluator ``rule`` combines (one, weight 1, for ``evaluator:``)."""
    return [(e.name, e.weight) for e in rule.evaluators] if rule.evaluators else [(rule.evaluator or "", 1.0)]


def _read_rules(order: list[Rule]) -> set[str]:
    """The rules some rule of ``order`` reads (``previous_rule`` in its conditions)."""
    return {dep for r in order if r.conditions for dep in r.depends_on}


def _skipped(rule: Rule, reason: str) -> RuleResult:
    """A rule that did not apply: it passes, and ``reason`` says why."""
    return RuleResult(rule=rule.name, status=Status.SKIPPED, passed=True, reason=reason)
