"""Shadow deployments and canaries: a candidate version tried beside the active one (docs/rollout.md).

- **Shadow**: the active version answers; a sample of decisions (by a hash of the decision id) is
  evaluated again under the candidate by a few workers reading a bounded queue, after the answer
  was recorded, reusing the live verdict of every evaluator the candidate did not change (the
  engine's replay hook): only changed or new evaluators are called. Nothing of it reaches the
  answer, the audit log, reviews or the outbox: only a diff per decision and running totals in
  the store. A full queue drops the sample and counts it.
- **Canary**: a sticky share of requests (a hash of tenant, policy, candidate version and the
  request context's ``canary_key`` value) is answered by the candidate, actions included, and
  audited under the candidate's revision. Its rates are recounted from the audit log (so they
  survive a restart and add up across replicas); past its bounds it is rolled back, with a
  history entry and a webhook through the outbox.

Every piece of state is in the store; a process keeps only caches, the queue and a count of
samples it dropped since its last write.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from crossaudit.api.models import RevisionCounts, ShadowReport
from crossaudit.api.records import (
    CandidateMode,
    CandidateRecord,
    CandidateState,
    DeploymentRecord,
    OutboxRecord,
    PolicyVersionRecord,
    ShadowDiffRecord,
)
from crossaudit.kernel.errors import CandidateStateError, CrossAuditError, InvalidInputError
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.kernel.results import Decision, EvaluatorResult, RuleResult
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.webhooks import KIND as WEBHOOK_KIND
from crossaudit.outbox.webhooks import webhook_payload
from crossaudit.service import inputs
from crossaudit.service.catalog import PolicyCatalog
from crossaudit.service.config import RolloutLimits, ServiceLimits
from crossaudit.service.grants import TenantGrants
from crossaudit.service.metrics import ServiceMetrics
from crossaudit.service.tenants import Tenants
from crossaudit.store.base import Store
from orchestrator.engine.replay import Replay, run_everything
from orchestrator.policy import Policy

log = logging.getLogger("crossaudit.service.rollout")

MAX_ERROR_CHARS = 300  # of a candidate's error, kept in its diff
SAMPLE_OVERHEAD_BYTES = 1_024  # a queued sample's fixed part (ids, the slim live decision), for the byte bound
MAX_NOTIFY_URL_CHARS = 2_048  # a canary's --notify URL (stored with it, sent at each delivery attempt)
NOTIFY_RULE = "canary_rollback"  # the outbox row's rule: what a receiver and `webhooks list` see
_HASH_SPACE = float(2**64)
_SETTING = "rollout_limits."


def _fraction(*parts: Any) -> float:
    """A stable number in [0, 1) from ``parts``: the same on every replica and after a restart."""
    data = json.dumps(parts, separators=(",", ":"), default=str, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") / _HASH_SPACE


def sampled(decision_id: str, share: float) -> bool:
    """Whether a shadow candidate evaluates this decision (deterministic by its id)."""
    return _fraction("shadow", decision_id) < share


def canary_routes(cand: CandidateRecord, context: Mapping[str, Any] | None) -> bool:
    """Whether the canary answers a request with this context: sticky per key value. A request
    whose context lacks the key (or holds null) goes to the active version."""
    if not cand.canary_key or not context:
        return False
    value = context.get(cand.canary_key)
    if value is None:
        return False
    return _fraction(cand.tenant, cand.name, cand.version, value) < cand.share


@dataclass
class _Sample:
    tenant: str
    candidate: CandidateRecord
    live: Decision
    prompt: str
    response: str
    context: dict[str, Any]
    stage: str
    at: float
    recorded: dict[str, EvaluatorResult]  # the live decision's evaluator results by identity
    size: int = 0  # sample_bytes, held against rollout_limits.shadow_queue_bytes while queued


def recorded_results(decision: Decision) -> dict[str, EvaluatorResult]:
    """The live decision's evaluator results by identity (one without an identity could never
    match): the candidate reuses the verdict of every evaluator whose identity it shares, so a
    threshold-only candidate calls nothing. Whole results: a condition reading ``previous_rule``
    sees their details, as it did live."""
    return {e.identity: e for r in decision.rules for e in r.evaluators if e.identity}


def results_bytes(results: Mapping[str, EvaluatorResult]) -> int:
    """About what the recorded results of a queued sample hold (as JSON), for the byte bound."""
    return sum(len(r.model_dump_json()) for r in results.values())


def _slim(decision: Decision) -> Decision:
    """What a diff needs of the live decision (the rules' verdicts; the evaluators' results,
    which may hold up to the sandbox's result size each, travel apart in ``_Sample.recorded``
    and are counted in the byte bound)."""
    rules = [
        RuleResult.model_construct(rule=r.rule, status=r.status, passed=r.passed, score=r.score, action=r.action)
        for r in decision.rules
    ]
    return Decision.model_construct(
        policy=decision.policy,
        policy_version=decision.policy_version,
        passed=decision.passed,
        action=decision.action,
        rules=rules,
        decision_id=decision.decision_id,
    )


def sample_bytes(prompt: str, response: str, context: Mapping[str, Any] | None) -> int:
    """About what a queued sample holds (its texts, its context as written), for the byte bound."""
    return len(prompt) + len(response) + (len(repr(context)) if context else 0) + SAMPLE_OVERHEAD_BYTES


def rule_diffs(live: Decision, cand: Decision) -> list[dict[str, Any]]:
    """Per rule, live beside candidate (a rule only one of them has is ``absent`` in the other,
    and passes there); ``flipped``: passed in one, failed in the other."""
    theirs = {r.rule: r for r in cand.rules}
    mine = {r.rule: r for r in live.rules}
    out = []
    for name in [*mine, *(n for n in theirs if n not in mine)]:
        a, b = mine.get(name), theirs.get(name)
        a_passed = a.passed if a is not None else True
        b_passed = b.passed if b is not None else True
        out.append(
            {
                "rule": name,
                "live_status": a.status.value if a is not None else "absent",
                "live_score": a.score if a is not None else None,
                "live_action": a.action.value if a is not None and a.action is not None else "",
                "candidate_status": b.status.value if b is not None else "absent",
                "candidate_score": b.score if b is not None else None,
                "candidate_action": b.action.value if b is not None and b.action is not None else "",
                "flipped": a_passed != b_passed,
            }
        )
    return out


def shadow_diff(sample: _Sample, decision_id: str, cand: Decision | None, error: str) -> ShadowDiffRecord:
    live = sample.live
    rules = rule_diffs(live, cand) if cand is not None else []
    passed = cand.passed if cand is not None else live.passed
    action = cand.action.value if cand is not None else ""
    changed = bool(error) or passed != live.passed or action != live.action.value
    changed = changed or any(r["flipped"] or r["live_status"] != r["candidate_status"] for r in rules)
    return ShadowDiffRecord(
        tenant=sample.tenant,
        candidate_id=sample.candidate.id,
        decision_id=decision_id,
        created_at=sample.at,
        live_passed=live.passed,
        live_action=live.action.value,
        candidate_passed=passed,
        candidate_action=action,
        rules=rules,
        error=error,
        changed=changed,
    )


class Rollout:
    """Candidates: start, promote, discard, report; the hook admission calls per decision."""

    def __init__(
        self,
        store: Store,
        tenants: Tenants,
        catalog: PolicyCatalog,
        *,
        grants: TenantGrants,
        limits: ServiceLimits,
        rollout: RolloutLimits,
        delivery: DeliveryLimits,
        metrics: ServiceMetrics,
    ) -> None:
        self.store = store
        self.tenants = tenants
        self.catalog = catalog
        self.grants = grants
        self.limits = limits
        self.config = rollout
        self.delivery = delivery
        self.metrics = metrics
        # (tenant, policy, env) -> the running candidate or None, trusted for deployment_recheck_s
        # (another replica may start or end one): no store round trip per decision.
        self._candidates: TTLCache[tuple[str, str, str], CandidateRecord | None] = TTLCache(
            rollout.candidate_cache_entries, limits.deployment_recheck_s
        )
        self._queue: asyncio.Queue[_Sample] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._dropped: dict[str, tuple[str, int]] = {}  # candidate id -> (tenant, dropped not yet written)
        self._queued_bytes = 0  # sample_bytes of the queued samples
        self._unwritten: list[ShadowDiffRecord] = []  # evaluated, waiting for the writer
        self._writing = False
        self._flushing = False  # drain or close: write at once, do not gather
        self._wake = asyncio.Event()  # the writer has something to write
        self._idle = asyncio.Event()  # the writer has written everything handed to it
        self._checked: TTLCache[str, float] = TTLCache(rollout.candidate_cache_entries, rollout.canary_check_interval_s)
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the shadow workers (needs a running loop)."""
        if self._queue is not None:
            return
        self._queue = asyncio.Queue(self.config.shadow_queue_size)
        self._workers = [asyncio.create_task(self._write(), name="shadow-writer")]
        self._workers += [
            asyncio.create_task(self._work(), name=f"shadow-{i}") for i in range(self.config.shadow_workers)
        ]

    async def aclose(self) -> None:
        """Stop the workers; what they evaluated and the drops counted are written first (a
        sample still queued is lost: it never decided anything)."""
        if self._queue is not None:
            self._flushing = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.shadow_timeout_s):
                    while self._unwritten or self._writing or self._dropped:
                        self._wake.set()
                        self._idle.clear()
                        await self._idle.wait()
        for task in [*self._workers, *self._tasks]:
            task.cancel()
        for task in [*self._workers, *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._workers.clear()

    # --- the authors' operations ------------------------------------------------------------

    async def deploy_candidate(
        self,
        tenant: str,
        content: str,
        *,
        mode: str,
        share: float,
        environment: str = "",
        filename: str = "",
        canary_key: str = "",
        notify_url: str = "",
        progress: ProgressCallback | None = None,
    ) -> tuple[PolicyVersionRecord, CandidateRecord, bool]:
        """Validate and prepare like a deploy, store the version without making it active, and
        start it as the environment's shadow or canary candidate."""
        env = inputs.environment(environment)
        kind = self._mode(mode)
        share = self._share(kind, share)
        canary_key = canary_key.strip()
        if kind is CandidateMode.CANARY and not canary_key:
            raise InvalidInputError(
                "a canary needs --canary-key: the request-context field whose value keeps it sticky"
            )
        if len(canary_key) > self.limits.max_name_length:
            raise InvalidInputError(f"canary_key is longer than {self.limits.max_name_length} characters")
        if notify_url:
            if len(notify_url) > MAX_NOTIFY_URL_CHARS:
                raise InvalidInputError(f"--notify is longer than {MAX_NOTIFY_URL_CHARS} characters")
            if kind is not CandidateMode.CANARY:
                raise InvalidInputError("--notify is for a canary (its automatic rollback is what is announced)")
            problem = self.grants.webhook(tenant).url_problem(notify_url)
            if problem is not None:
                raise InvalidInputError(f"--notify: {problem.replace('webhook_url', 'the URL', 1)}")
        policy = await self.catalog.prepare_policy(tenant, content, filename, progress)
        bounds = _bounds(self.config)
        version, cand, created = await self.store.start_candidate(
            tenant,
            name=policy.name,
            declared_version=policy.version,
            description=policy.description,
            content=content,
            environment=env,
            mode=kind,
            share=share,
            canary_key=canary_key if kind is CandidateMode.CANARY else "",
            notify_url=notify_url,
            bounds=bounds if kind is CandidateMode.CANARY else {},
        )
        self.catalog.remember(tenant, version, policy)
        self._candidates[(tenant, policy.name, env)] = cand
        log.info("tenant %s started %s v%d as a %s candidate in %s", tenant, policy.name, cand.version, kind.value, env)
        return version, cand, created

    async def promote(self, tenant: str, name: str, environment: str = "") -> tuple[CandidateRecord, DeploymentRecord]:
        """Make the running candidate the active version (a ``promote`` deployment) and end it."""
        name, env = self._key(name, environment)
        cand, dep = await self._end(tenant, name, env, CandidateState.PROMOTED, "promoted")
        assert dep is not None
        self.catalog.deployed(tenant, name, env, dep.version)
        return cand, dep

    async def discard(self, tenant: str, name: str, environment: str = "") -> CandidateRecord:
        name, env = self._key(name, environment)
        cand, _ = await self._end(tenant, name, env, CandidateState.DISCARDED, "discarded")
        return cand

    async def report(self, tenant: str, name: str, environment: str = "") -> ShadowReport:
        """The candidate of ``name`` in the environment (running, else the last one): NOT_FOUND
        for a policy of another tenant as for one without candidates."""
        name, env = self._key(name, environment)
        cand = await self.store.get_candidate(tenant, name, env)
        pending = self._dropped.get(cand.id)
        if pending is not None and cand.state is CandidateState.RUNNING:  # this process's, not yet written
            cand = dataclasses.replace(cand, dropped=cand.dropped + pending[1])
        flips = await self.store.shadow_rule_flips(tenant, cand.id)
        samples = await self.store.list_shadow_diffs(tenant, cand.id, limit=self.config.shadow_report_samples)
        history = await self.store.list_history(tenant, name, env, limit=self.config.shadow_report_samples)
        canary, active = RevisionCounts(), RevisionCounts()
        if cand.mode is CandidateMode.CANARY:
            canary, active = await self._counts(cand)
        return ShadowReport(cand, flips, tuple(samples), tuple(history), canary, active)

    def forget(self, tenant: str, name: str, env: str) -> None:
        """A deploy or rollback here ended any running candidate (the store did it in the same
        transaction): stop routing to it at once in this process."""
        self._candidates.pop((tenant, name, env), None)

    # --- per decision (admission) -----------------------------------------------------------

    async def candidate(self, tenant: str, policy: str, env: str) -> CandidateRecord | None:
        key = (tenant, policy, env)
        try:
            return self._candidates[key]
        except KeyError:
            pass
        found = await self.store.running_candidate(tenant, policy, env)
        self._candidates[key] = found
        return found

    async def canary_policy(
        self, cand: CandidateRecord, context: Mapping[str, Any] | None
    ) -> tuple[PolicyVersionRecord, Policy] | None:
        """The candidate's version when this canary answers the request, else None."""
        if cand.mode is not CandidateMode.CANARY or not canary_routes(cand, context):
            return None
        try:
            return await self.catalog.version_policy(cand.tenant, cand.name, cand.version)
        except CrossAuditError as exc:  # validated at deploy; should it stop loading, the active version answers
            log.warning(
                "canary v%d of %s (tenant %s) does not load: %s", cand.version, cand.name, cand.tenant, exc.message
            )
            return None

    def decided(
        self,
        cand: CandidateRecord,
        revision: int,
        decision: Decision,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None,
        stage: str,
    ) -> None:
        """After the answer was recorded: queue a shadow sample, or recount a canary's rates in
        the background. Never raises, never waits."""
        try:
            if cand.mode is CandidateMode.SHADOW:
                if sampled(decision.decision_id, cand.share):
                    recorded = recorded_results(decision)
                    size = sample_bytes(prompt, response, context) + results_bytes(recorded)
                    live = _slim(decision)
                    ctx = dict(context or {})
                    at = time.time() - decision.latency_ms / 1000  # when the live evaluation began: its time.*
                    self._offer(_Sample(cand.tenant, cand, live, prompt, response, ctx, stage, at, recorded, size))
            elif revision == cand.version and cand.id not in self._checked:
                self._checked[cand.id] = time.monotonic()
                task = asyncio.create_task(self._check_canary(cand))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception:  # the answer is already out: a candidate's trouble stays the candidate's
            log.exception("candidate %s of tenant %s: post-decision step failed", cand.id, cand.tenant)

    # --- shadow -----------------------------------------------------------------------------

    def _offer(self, sample: _Sample) -> None:
        if self._queue is None:
            self.start()
        assert self._queue is not None
        if self._queued_bytes + sample.size > self.config.shadow_queue_bytes:
            full = True
        else:
            try:
                self._queue.put_nowait(sample)
                self._queued_bytes += sample.size
                full = False
            except asyncio.QueueFull:
                full = True
        if full:
            self._count_dropped(sample.candidate.id, sample.tenant, 1)
            self.metrics.shadow_sample(sample.tenant, "dropped")

    def queued(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    async def drain(self) -> None:
        """Wait until every queued sample is evaluated and its diff written (shutdown, tests)."""
        if self._queue is None:
            return
        await self._queue.join()
        self._flushing = True
        try:
            while self._unwritten or self._writing:  # each turn the writer has written a batch
                self._wake.set()
                await self._idle.wait()
        finally:
            self._flushing = False

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            sample = await self._queue.get()
            self._queued_bytes -= sample.size
            try:
                self._written(await self._shadow(sample))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("shadow evaluation for candidate %s failed", sample.candidate.id)
            finally:
                self._queue.task_done()

    async def _shadow(self, sample: _Sample) -> ShadowDiffRecord:
        """One sample evaluated under the candidate: its diff (the candidate's error, if any)."""
        cand = sample.candidate
        decision_id = sample.live.decision_id
        error, decided = "", None
        timeout = self.config.shadow_timeout_s
        try:
            _, policy = await self.catalog.version_policy(cand.tenant, cand.name, cand.version)
            engine = self.tenants.shadow_engine(cand.tenant)
            async with asyncio.timeout(timeout + self.limits.answer_margin_s):
                decided = await engine.evaluate(
                    policy,
                    sample.prompt,
                    sample.response,
                    sample.context,
                    timeout=timeout,
                    decision_id=decision_id,
                    stage=sample.stage,
                    replay=self._replay(sample),
                )
        except TimeoutError:
            error = f"DeadlineExceededError: no decision within rollout_limits.shadow_timeout_s ({timeout}s)"
        except CrossAuditError as exc:
            error = f"{type(exc).__name__}: {exc.message}"[:MAX_ERROR_CHARS]
        except Exception as exc:  # a candidate's failure is recorded, never raised
            error = f"{type(exc).__name__}"
        self.metrics.shadow_sample(cand.tenant, "errored" if error else "evaluated")
        return shadow_diff(sample, decision_id, decided, error)

    @staticmethod
    def _replay(sample: _Sample) -> Replay:
        """The live decision's verdicts for the candidate's engine: an evaluator whose identity
        did not change is not called again (no sandbox, model or LLM call, no token, no cache);
        the others run, LLM judges included (a shadow is live traffic), at the live decision's time."""
        return Replay(sample.recorded, dt.datetime.fromtimestamp(sample.at, dt.UTC), run_everything, live=True)

    def _written(self, diff: ShadowDiffRecord) -> None:
        """Hand a diff to the writer: diffs are written in batches, one transaction each, so the
        shadow adds far fewer store transactions than it evaluates samples (the live decisions'
        audit writes share the store). A writer that far behind drops the diff (counted)."""
        if len(self._unwritten) >= self.config.shadow_write_backlog:
            self._count_dropped(diff.candidate_id, diff.tenant, 1)
            self.metrics.shadow_sample(diff.tenant, "dropped")
        else:
            self._unwritten.append(diff)
        self._idle.clear()
        self._wake.set()

    async def _write(self) -> None:
        while True:
            await self._wake.wait()
            if self.config.shadow_write_interval_s and not self._flushing:
                await asyncio.sleep(self.config.shadow_write_interval_s)  # gather a batch
            self._wake.clear()
            batch, self._unwritten = self._unwritten, []
            dropped, self._dropped = self._dropped, {}
            if batch or dropped:
                self._writing = True
                try:
                    await self.store.record_shadow_diffs(
                        batch, dropped=dropped, max_diffs=self.config.max_shadow_diffs_per_candidate
                    )
                except Exception as exc:  # the store is down: the diffs are lost, the drops kept; the writer lives on
                    why = exc.message if isinstance(exc, CrossAuditError) else type(exc).__name__
                    log.warning("shadow diffs not written (%d lost): %s", len(batch), why)
                    for cid, (tenant, n) in dropped.items():
                        self._count_dropped(cid, tenant, n)
                finally:
                    self._writing = False
            if not self._unwritten:
                self._idle.set()

    def _count_dropped(self, candidate_id: str, tenant: str, n: int) -> None:
        owner, m = self._dropped.get(candidate_id, (tenant, 0))
        self._dropped[candidate_id] = (owner, m + n)

    # --- canary -----------------------------------------------------------------------------

    async def _counts(self, cand: CandidateRecord) -> tuple[RevisionCounts, RevisionCounts]:
        counts = await self.store.revision_counts(
            cand.tenant, cand.name, cand.environment, cand.started_at, [cand.version, cand.active_version]
        )
        return RevisionCounts(*counts.get(cand.version, (0, 0, 0))), RevisionCounts(
            *counts.get(cand.active_version, (0, 0, 0))
        )

    def verdict(self, cand: CandidateRecord, canary: RevisionCounts, active: RevisionCounts) -> str:
        """Why the canary must be rolled back ("" while within its bounds), by the bounds it started with."""
        bounds = {**_bounds(self.config), **cand.bounds}
        if canary.decisions < int(bounds["canary_min_decisions"]):
            return ""
        for what, n_c, n_a, key in (
            ("evaluator-error", canary.errored, active.errored, "canary_max_error_rate_increase"),
            ("block", canary.blocked, active.blocked, "canary_max_block_rate_increase"),
        ):
            mine, theirs = canary.rate(n_c), active.rate(n_a)
            if mine - theirs > float(bounds[key]):
                return (
                    f"its {what} rate {mine:.1%} ({n_c} of {canary.decisions} decisions) exceeds the active "
                    f"v{cand.active_version}'s {theirs:.1%} ({n_a} of {active.decisions}) by more than "
                    f"{float(bounds[key]):.1%} ({_SETTING}{key})"
                )
        return ""

    async def _check_canary(self, cand: CandidateRecord) -> None:
        try:
            canary, active = await self._counts(cand)
            reason = self.verdict(cand, canary, active)
            if reason:
                await self._roll_back(cand, reason, canary, active)
        except CrossAuditError as exc:
            log.warning("canary %s of tenant %s: check failed: %s", cand.id, cand.tenant, exc.message)

    async def _roll_back(
        self, cand: CandidateRecord, reason: str, canary: RevisionCounts, active: RevisionCounts
    ) -> None:
        now = time.time()
        rows = []
        if cand.notify_url:
            body = {
                "event": "canary_rolled_back",
                "policy": cand.name,
                "environment": cand.environment,
                "candidate_version": cand.version,
                "active_version": cand.active_version,
                "reason": reason,
                "canary": _counts_doc(canary),
                "active": _counts_doc(active),
                "started_at": cand.started_at,
                "rolled_back_at": now,
            }
            payload = webhook_payload({"url": cand.notify_url, "method": "POST"}, body, self.delivery)
            rows.append(
                OutboxRecord(
                    id=str(uuid.uuid4()),
                    tenant=cand.tenant,
                    kind=WEBHOOK_KIND,
                    decision_id="",
                    rule=NOTIFY_RULE,
                    payload=payload,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
        try:
            await self.store.end_candidate(
                cand.tenant,
                cand.name,
                cand.environment,
                state=CandidateState.ROLLED_BACK,
                reason=reason,
                candidate_id=cand.id,
                outbox=rows,
            )
        except CandidateStateError:
            return  # ended meanwhile (promoted, discarded, or rolled back by another replica)
        self._candidates[(cand.tenant, cand.name, cand.environment)] = None
        self.metrics.canary_rollbacks.labels(self.metrics.tenant_label(cand.tenant)).inc()
        log.warning(
            "tenant %s: canary v%d of %s in %s rolled back: %s",
            cand.tenant,
            cand.version,
            cand.name,
            cand.environment,
            reason,
        )

    # --- helpers ----------------------------------------------------------------------------

    async def _end(
        self, tenant: str, name: str, env: str, state: CandidateState, reason: str
    ) -> tuple[CandidateRecord, DeploymentRecord | None]:
        try:
            cand, dep = await self.store.end_candidate(tenant, name, env, state=state, reason=reason)
        except CandidateStateError:
            await self.store.get_candidate(tenant, name, env)  # NOT_FOUND: never had one (or another tenant's)
            raise
        self._candidates[(tenant, name, env)] = None
        log.info("tenant %s: candidate v%d of %s in %s %s", tenant, cand.version, name, env, state.value)
        return cand, dep

    def _key(self, name: str, environment: str) -> tuple[str, str]:
        return inputs.policy_name(name, self.limits.max_name_length), inputs.environment(environment)

    @staticmethod
    def _mode(mode: str) -> CandidateMode:
        try:
            return CandidateMode(mode)
        except ValueError:
            raise InvalidInputError(f"candidate mode must be 'shadow' or 'canary', not {mode!r}") from None

    @staticmethod
    def _share(mode: CandidateMode, share: float) -> float:
        what = "--sample" if mode is CandidateMode.SHADOW else "--canary"
        if not (0.0 < share <= 1.0):  # NaN fails too
            raise InvalidInputError(f"{what} must be a fraction in (0, 1] (or a percentage up to 100%), not {share!r}")
        return float(share)


def _bounds(config: RolloutLimits) -> dict[str, Any]:
    return {
        "canary_min_decisions": config.canary_min_decisions,
        "canary_max_error_rate_increase": config.canary_max_error_rate_increase,
        "canary_max_block_rate_increase": config.canary_max_block_rate_increase,
    }


def _counts_doc(c: RevisionCounts) -> dict[str, Any]:
    return {
        "decisions": c.decisions,
        "errored": c.errored,
        "blocked": c.blocked,
        "error_rate": round(c.rate(c.errored), 6),
        "block_rate": round(c.rate(c.blocked), 6),
    }
