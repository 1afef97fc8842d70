"""Evaluations: admit (per-tenant concurrency), decide within the caller's deadline, audit, answer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from crossaudit.api.records import AuditRecord, CandidateRecord, OutboxRecord, PolicyVersionRecord, ReviewRecord
from crossaudit.governance.evidence import EvidenceLog
from crossaudit.governance.records import audit_record, fit_audit, receipt_json, review_records
from crossaudit.governance.retention import Retention
from crossaudit.governance.rollout import Rollout
from crossaudit.kernel import tracing
from crossaudit.kernel.dsl import Stage
from crossaudit.kernel.errors import DeadlineExceededError, InvalidInputError, QuotaExceededError, RateLimitedError
from crossaudit.kernel.results import Action, Decision
from crossaudit.outbox.deliveries import Deliveries
from crossaudit.service import inputs
from crossaudit.service.catalog import PolicyCatalog
from crossaudit.service.config import ServiceLimits
from crossaudit.service.fairness import FairSlots
from crossaudit.service.logs import decision_scope, end_scope
from crossaudit.service.metrics import ServiceMetrics
from crossaudit.service.tenants import Tenants
from crossaudit.store.base import AUDIT_DAY_S, Store
from orchestrator.policy import Policy

AUDIT_DAY_KEY = "limits.max_audit_bytes_per_tenant_per_day"
REFUSED_LOG_INTERVAL_S = 60.0  # a tenant at its audit quota is logged at most this often

log = logging.getLogger("crossaudit.service.admission")


@dataclass
class EvaluationOutcome:
    decision: Decision
    revision: int
    environment: str
    review_ids: list[str] = field(default_factory=list)
    answer: Any = None  # what ``evaluate(encode=...)`` made of it before the audit write
    recorded: bool = True  # False: a provisional decision that passed (no audit record, review or webhook)


@dataclass
class _AuditUsage:
    """A tenant's audit bytes on ``day`` as this replica knows them: the store's sum as of
    ``checked`` (monotonic) plus what this replica wrote since."""

    day: int
    bytes: int
    checked: float


class Admission:
    def __init__(
        self,
        store: Store,
        tenants: Tenants,
        catalog: PolicyCatalog,
        *,
        limits: ServiceLimits,
        metrics: ServiceMetrics,
        audit_raw_text: bool,
        deliveries: Deliveries | None = None,
        shares: Mapping[str, float] | None = None,
        retention: Retention | None = None,
        rollout: Rollout | None = None,
        evidence: EvidenceLog | None = None,
    ) -> None:
        self.store = store
        self.retention = retention
        self.evidence = evidence  # told of each decision written, so checkpoints keep up
        self.tenants = tenants
        self.catalog = catalog
        self.limits = limits
        self.metrics = metrics
        self.audit_raw_text = audit_raw_text
        self.deliveries = deliveries
        self.rollout = rollout  # shadow and canary candidates (None: none are looked up)
        self._inflight: dict[str, int] = {}
        self._audit_usage: dict[str, _AuditUsage] = {}
        self._quota_logged: dict[str, float] = {}  # tenant -> when its audit quota refusal was last logged
        self.slots = FairSlots(
            limits.max_concurrent_evaluations,
            shares,
            per_tenant=int(limits.max_concurrent_evaluations * limits.max_concurrent_evaluations_tenant_fraction),
        )

    def budget(self, time_remaining: float | None) -> float:
        """Seconds the decision may take: the caller's remaining deadline minus what answering
        needs, or the default when the caller set no deadline."""
        if time_remaining is None:
            return self.limits.default_deadline_s
        margin = min(self.limits.answer_margin_s, self.limits.answer_margin_fraction * time_remaining)
        return min(time_remaining - margin, self.limits.default_deadline_s)

    async def evaluate(self, tenant: str, *, trace_parent: Any = None, **kwargs: Any) -> EvaluationOutcome:
        """:meth:`_evaluate` (decide, audit, answer), in an ``Evaluate`` span when tracing is on:
        a child of the caller's span when ``trace_parent`` (its propagated context) names one."""
        if not tracing.enabled():
            return await self._evaluate(tenant, **kwargs)
        attributes = {
            "rpc.system": "grpc",
            "rpc.service": "crossaudit.v1.EvaluationService",
            "rpc.method": "Evaluate",
            "crossaudit.tenant": tenant,
            "crossaudit.policy": str(kwargs.get("policy", ""))[: self.limits.max_name_length],
            "crossaudit.stage": str(kwargs.get("stage", "")),
            **tracing.text_attributes("crossaudit.prompt", kwargs.get("prompt", "")),
            **tracing.text_attributes("crossaudit.response", kwargs.get("response", "")),
        }
        with tracing.tracer().start_as_current_span(
            tracing.EVALUATE,
            context=trace_parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as sp:
            try:
                outcome = await self._evaluate(tenant, **kwargs)
            except BaseException as exc:
                tracing.failed(sp, exc)
                raise
            if sp.is_recording():
                d = outcome.decision
                sp.set_attributes({
                    "crossaudit.decision_id": d.decision_id or "",
                    "crossaudit.policy.version": outcome.revision,
                    "crossaudit.environment": outcome.environment,
                    "crossaudit.verdict": "passed" if d.passed else "failed",
                    "crossaudit.action": d.action.value,
                    "crossaudit.recorded": outcome.recorded,
                })  # fmt: skip
            return outcome

    async def _evaluate(
        self,
        tenant: str,
        *,
        policy: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        environment: str = "",
        time_remaining: float | None = None,
        request_id: str = "",
        encode: Callable[[EvaluationOutcome], Any] | None = None,
        stage: str = "",
        provisional: bool = False,
    ) -> EvaluationOutcome:
        """Decide, audit, answer. ``encode`` turns the outcome into the answer (the wire message)
        *before* the audit record is written: if it fails, nothing is audited, so the audit log
        never holds a decision the caller did not receive. ``stage``: only that stage's rules run.
        ``provisional`` (a streamed answer's window, docs/proxy.md): recorded only when it blocks."""
        t0 = time.monotonic()
        budget = self.budget(time_remaining)
        if budget <= 0:
            raise DeadlineExceededError("the deadline leaves no time to evaluate")
        policy = inputs.policy_name(policy, self.limits.max_name_length)  # NFC: either spelling finds it
        env = inputs.environment(environment)
        request_id = inputs.request_id(request_id, self.limits.max_request_id_chars)
        if provisional and stage != Stage.OUTPUT.value:
            raise InvalidInputError("a provisional decision is one of the output stage (stage: output)")
        await self._check_audit_quota(tenant, t0)
        inflight = self._inflight.get(tenant, 0)
        if inflight >= self.limits.max_inflight_evaluations_per_tenant:
            raise RateLimitedError(
                f"too many concurrent evaluations for this tenant (limit "
                f"{self.limits.max_inflight_evaluations_per_tenant}); retry later"
            )
        self._inflight[tenant] = inflight + 1
        self.metrics.inflight.inc()
        decision_id = str(uuid.uuid4())
        scope = decision_scope(decision_id, tenant, policy, request_id)  # log lines name the decision
        stopping: asyncio.Future[Any] | None = None  # cancelled work still stopping holds the slot
        try:
            hard = self._hard_stop(budget, time_remaining)
            # A fair turn at one of the server's evaluation slots, within the same hard stop; the
            # slot is held until the work has really stopped (a cancelled sandbox's cleanup too).
            await self._take_slot(tenant, hard - (time.monotonic() - t0))
            task = asyncio.ensure_future(
                self._decide(tenant, policy, env, prompt, response, context, decision_id, stage, t0 + budget)
            )
            task.add_done_callback(lambda _: self.slots.release(tenant))
            try:
                done, _ = await asyncio.wait({task}, timeout=max(0.0, hard - (time.monotonic() - t0)))
            except asyncio.CancelledError:  # the caller went away: stop the evaluators too
                task.cancel()
                stopping = task
                raise
            if not done:
                # Cancel, but do not wait for the sandbox's cleanup: the answer must make the deadline.
                task.cancel()
                task.add_done_callback(_consume)
                stopping = task
                raise DeadlineExceededError(f"no decision within the deadline ({budget:.3f}s)")
            rec, pol, decision, candidate = task.result()
            decision.decision_id = decision_id
            outcome = await self._record(
                tenant, rec, pol, decision, env, prompt, response, context, request_id=request_id, encode=encode,
                stage=stage, provisional=provisional,
            )  # fmt: skip
            self.metrics.observe_decision(decision, time.monotonic() - t0, tenant)
            if outcome.recorded and candidate is not None and self.rollout is not None:  # a shadow sample, a recount
                self.rollout.decided(candidate, rec.version, decision, prompt, response, context, stage)
            if log.isEnabledFor(logging.DEBUG):
                verdict = "passed" if decision.passed else "failed"
                log.debug("decision %s: policy %s %s, %s", decision_id, policy, verdict, decision.action.value)
            return outcome
        finally:
            end_scope(scope)
            if stopping is None:
                self._release(tenant)
            else:  # exact under cancellation: the slot is freed when the work has really stopped
                stopping.add_done_callback(lambda _: self._release(tenant))

    async def _decide(
        self,
        tenant: str,
        policy: str,
        env: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None,
        decision_id: str,
        stage: str,
        deadline: float,
    ) -> tuple[PolicyVersionRecord, Policy, Decision, CandidateRecord | None]:
        """The deployed policy evaluated within what is left until ``deadline`` (monotonic); a
        canary candidate's version instead when it answers this request (docs/rollout.md)."""
        if tracing.enabled():  # the Evaluate span (current here): a decision that fails names its id too
            trace.get_current_span().set_attribute("crossaudit.decision_id", decision_id)
        await self.tenants.load_feedback(tenant)
        rec, pol = await self.catalog.deployed_policy(tenant, policy, env)
        candidate = await self.rollout.candidate(tenant, policy, env) if self.rollout is not None else None
        if candidate is not None and self.rollout is not None:
            routed = await self.rollout.canary_policy(candidate, context)
            if routed is not None:
                rec, pol = routed
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceededError("the deadline ran out before the policy could be evaluated")
        decision = await self.tenants.engine(tenant).evaluate(
            pol, prompt, response, dict(context or {}), timeout=left, decision_id=decision_id, stage=stage
        )
        return rec, pol, decision, candidate

    def _hard_stop(self, budget: float, time_remaining: float | None) -> float:
        """Seconds from the start to stop at, just before the caller's deadline, so that the answer
        is ours (a decision or DEADLINE_EXCEEDED), never the transport's."""
        if time_remaining is None:
            return budget + self.limits.answer_margin_s
        return time_remaining - min(self.limits.cutoff_margin_s, self.limits.cutoff_margin_fraction * time_remaining)

    async def _record(
        self,
        tenant: str,
        rec: PolicyVersionRecord,
        pol: Policy,
        decision: Decision,
        env: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None,
        *,
        request_id: str,
        encode: Callable[[EvaluationOutcome], Any] | None,
        stage: str = "",
        provisional: bool = False,
    ) -> EvaluationOutcome:
        """The answer, then its audit record, reviews and outbox rows in one write: the audit log
        never holds a decision that could not be sent, and the answer names only what was kept.
        A provisional decision that does not block is not final (the caller decides the whole
        answer later, audited): answered, nothing written."""
        if provisional and decision.action is not Action.BLOCK:
            outcome = EvaluationOutcome(decision, rec.version, env, recorded=False)
            outcome.answer = encode(outcome) if encode is not None else None
            return outcome
        reviews = review_records(tenant, decision, rec.version, env, time.time())
        outcome = EvaluationOutcome(decision, rec.version, env, [r.id for r in reviews])
        if encode is not None:
            outcome.answer = encode(outcome)
        audit = _traced(audit_record(  # with its trace's ids, beside it (not in the leaf or receipt)
            tenant,
            decision,
            rec,
            env,
            prompt,
            response,
            context,
            raw=self.audit_raw_text or pol.settings.audit_all_evaluations,
            request_id=request_id,
            now=time.time(),
            stage=stage,
        ))  # fmt: skip
        # the inputs, sealed when the tenant and policy retain them: written with the record
        retained = None
        if self.retention is not None:
            retained = await self.retention.seal(
                tenant, pol, decision, env, prompt, response, context, stage=stage, now=audit.created_at
            )
            if retained is not None:
                audit = dataclasses.replace(audit, inputs_retained_until=retained.expires_at)
        receipt = receipt_json(audit.receipt)  # encoded once: measured, then written as it is
        audit, size, rules_json = fit_audit(audit, self.limits.max_audit_bytes_per_decision, receipt)
        if retained is not None:
            size += retained.size  # retained bytes count toward the tenant's audit quota
        messages = self.deliveries.rows(decision, audit, time.time()) if self.deliveries else []
        # a webhook over its tenant's pending quota is not written; the decision always is
        quotas = self.deliveries.quotas if self.deliveries else None
        refused = await self._write(
            audit,
            reviews,
            messages,
            max_pending=quotas,
            audit_bytes=size,
            rules_json=rules_json,
            receipt_json=receipt,
            max_open_reviews=self.limits.max_open_reviews_per_tenant,  # over it: answered, audited, not opened
            retained=retained,
        )
        if self.evidence is not None:
            self.evidence.written(tenant)
        not_opened = {r.id for r in refused if isinstance(r, ReviewRecord)}
        if not_opened:  # the open-reviews quota: the answer names only the reviews that opened
            outcome.review_ids = [i for i in outcome.review_ids if i not in not_opened]
            if encode is not None:
                outcome.answer = encode(outcome)
        usage = self._audit_usage.get(tenant)
        if usage is not None and usage.day == int(audit.created_at // AUDIT_DAY_S):
            usage.bytes += size
        if self.deliveries is not None:
            self.deliveries.recorded(messages, [m for m in refused if isinstance(m, OutboxRecord)])
        return outcome

    async def _take_slot(self, tenant: str, timeout: float) -> None:
        """A fair turn at one of the server's evaluation slots (an admission-wait span when traced
        and the call waits: a slot taken at once makes none)."""
        if not tracing.enabled() or self.slots.free_for(tenant):
            await self.slots.acquire(tenant, timeout)
            return
        with tracing.span(tracing.ADMISSION_WAIT, {"crossaudit.tenant": tenant}):
            await self.slots.acquire(tenant, timeout)

    async def _write(self, audit: Any, *args: Any, **kwargs: Any) -> Any:
        """The store's one write of a decision (an audit-commit span when traced)."""
        if not tracing.enabled():
            return await self.store.record_decision(audit, *args, **kwargs)
        with tracing.span(tracing.AUDIT_COMMIT, {"crossaudit.audit.bytes": kwargs.get("audit_bytes", 0)}):
            return await self.store.record_decision(audit, *args, **kwargs)

    def _release(self, tenant: str) -> None:
        self._inflight[tenant] -= 1
        self.metrics.inflight.dec()

    async def _check_audit_quota(self, tenant: str, now: float) -> None:
        """QuotaExceededError once ``tenant``'s audit bytes today reach the daily quota, before
        anything is evaluated. No store round trip per call: the store's sum is read once per
        tenant per ``audit_usage_recheck_s`` (the first caller reads, the others go on with the
        count they have), and this replica's own writes are added as they commit."""
        day = int(time.time() // AUDIT_DAY_S)
        usage = self._audit_usage.get(tenant)
        if usage is None or usage.day != day:
            usage = self._audit_usage[tenant] = _AuditUsage(day, 0, now)
            usage.bytes = await self.store.audit_bytes(tenant, day)
        elif now - usage.checked >= self.limits.audit_usage_recheck_s:
            usage.checked = now
            usage.bytes = await self.store.audit_bytes(tenant, day)
        quota = self.limits.max_audit_bytes_per_tenant_per_day
        if usage.bytes >= quota:
            if now - self._quota_logged.get(tenant, -REFUSED_LOG_INTERVAL_S) >= REFUSED_LOG_INTERVAL_S:
                self._quota_logged[tenant] = now  # one key per tenant that has keys: bounded
                log.warning(
                    "tenant %s: evaluations refused, its audit bytes today (%d) are at %s (%d)",
                    tenant, usage.bytes, AUDIT_DAY_KEY, quota,
                )  # fmt: skip
            raise QuotaExceededError(
                f"this tenant's audit log reached its quota for today ({usage.bytes} of {quota} bytes, "
                f"{AUDIT_DAY_KEY}); evaluations resume at 00:00 UTC",
                setting=AUDIT_DAY_KEY,
            )


def _traced(audit: AuditRecord) -> AuditRecord:
    """``audit`` with the ids of the current (Evaluate) span, when tracing is on and it is sampled."""
    if not tracing.enabled():
        return audit
    sc = trace.get_current_span().get_span_context()
    if not (sc.is_valid and sc.trace_flags.sampled):
        return audit
    return dataclasses.replace(audit, trace_id=format(sc.trace_id, "032x"), span_id=format(sc.span_id, "016x"))


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve a cancelled evaluation's outcome so that nothing is logged as never retrieved."""
    if not task.cancelled():
        task.exception()
