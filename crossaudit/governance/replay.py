"""``policy replay``: what a candidate policy would have decided on a tenant's recorded traffic.

One replay, in order:

1. The candidate is validated and made runnable exactly as a deploy would
   (:meth:`PolicyCatalog.candidate`: located issues are INVALID_ARGUMENT), and ``against`` must be
   one of the caller's policies deployed in the environment (another tenant's is NOT_FOUND, as
   one that exists nowhere).
2. The tenant's audit records of ``against`` in that environment and time range are read most
   recent first, a page at a time (keyset-paged, ``limits.replay_page_size``), at most
   ``limits.max_replay_decisions`` (and the request's ``limit``).
3. Each page's retained inputs are loaded (and decrypted) in one batch; a record without them is
   counted as not replayable by why: never retained, expired, erased.
4. Each retained decision is evaluated by a *dedicated* engine (its own evaluator instances,
   result cache and rate-limit buckets: replay never takes a live request's tokens) under the
   candidate, with the verdicts recorded with it (``orchestrator.engine.replay``): an evaluator
   whose identity is unchanged is not called, one that changed runs again, except LLM judges
   without ``rerun_llm``. At most ``limits.replay_concurrency`` at once.
5. Each is compared with its record (:mod:`crossaudit.api.replayreport`); progress is yielded
   after every page, the report last.

Nothing is written: a replay changes no deployment, no record, no counter of the live path.
Retained text stays in this process's memory for the page being replayed, never in an error,
a log line or the report (which carries ids, counts and scores).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.api.records import AuditRecord
from crossaudit.api.replayreport import LLMEstimate, RecordedDecision, ReplayProgress, ReplayReport
from crossaudit.governance.retention import DEV_RETENTION_HINT, RetainedInputs, Retention
from crossaudit.kernel.dsl import LLMConfig
from crossaudit.kernel.errors import (
    CrossAuditError,
    InvalidInputError,
    NotReplayableError,
    QuotaExceededError,
)
from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES, LLMPrice, cost_usd, estimated_prompt_tokens, price_for
from crossaudit.service import inputs
from crossaudit.service.catalog import PolicyCatalog
from crossaudit.service.config import ServiceLimits
from crossaudit.service.shared import Slots
from crossaudit.service.tenants import Tenants
from crossaudit.store.base import Store
from orchestrator.engine.engine import Engine
from orchestrator.engine.ratelimit import local_limiter
from orchestrator.engine.replay import LLM_KIND, RecordedResults, Replay, Unreplayable, llm_only_with_permission
from orchestrator.policy import Policy

log = logging.getLogger("crossaudit.service")

RETENTION_HINT = (
    "{n} decision(s) had no retained inputs: policy {policy!r} did not keep them. Retention is opt-in: the "
    "tenant's `retention: {{inputs: 7d}}` in the API-keys file, an operator key (retention.operator_key_file) and, "
    "for this policy alone, `settings: retention: {{inputs: ...}}`; decisions made after that can be replayed "
    "(docs/retention.md, docs/replay.md)"
)


@dataclass(frozen=True)
class ReplayRequest:
    content: str  # the candidate policy's text (code inlined by the client)
    against: str  # the deployed policy whose records are replayed
    filename: str = ""
    environment: str = ""  # "" = the default environment
    since: float | None = None  # epoch seconds, inclusive
    until: float | None = None
    limit: int = 0  # 0 = limits.max_replay_decisions
    rerun_llm: bool = False
    samples: int = 0  # sample ids per category; 0 = limits.max_replay_samples
    estimate_only: bool = False  # evaluate nothing: estimate what a rerun_llm replay would spend on LLM calls


class Replays:
    def __init__(
        self,
        store: Store,
        tenants: Tenants,
        catalog: PolicyCatalog,
        retention: Retention,
        *,
        limits: ServiceLimits,
        prices: Mapping[str, LLMPrice] = DEFAULT_LLM_PRICES,
        clock: Any = time.time,
        data_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.tenants = tenants
        self.catalog = catalog
        self.retention = retention
        self.limits = limits
        self.clock = clock
        self.prices = prices
        # one server's replays, whichever worker runs them (data_dir None: this process's)
        self._running = Slots(data_dir, "replays")

    async def replay(self, tenant: str, request: ReplayRequest) -> AsyncIterator[ReplayProgress | ReplayReport]:
        """Progress after every page, then the report (the last item)."""
        env, limit, samples = self._checked(request)
        with self._slot(tenant):
            against = inputs.policy_name(request.against, self.limits.max_name_length)
            await self.catalog.get_policy(tenant, against, environment=env)  # NOT_FOUND names where it is
            policy = await self.catalog.prepare_policy(tenant, request.content, request.filename or "<candidate>")
            report = ReplayReport(
                policy=against,
                candidate=policy.name,
                environment=env,
                since=request.since,
                until=request.until,
                max_samples=samples,
                estimate=LLMEstimate() if request.estimate_only else None,
            )
            engine = self.tenants.dedicated_engine(tenant)
            if isinstance(engine, Engine):  # replay's re-runs are paced in buckets of their own
                engine.limiters = local_limiter
            try:
                async for step in self._pages(tenant, engine, policy, report, request, env, limit):
                    yield step
            finally:
                await engine.aclose()
            not_retained = report.not_replayable.get(Unreplayable.NOT_RETAINED.value)
            if not_retained is not None:
                report.hint = RETENTION_HINT.format(n=not_retained.count, policy=against)
                if self.retention.grants.development and not self.retention.grants.retention:
                    report.hint += f"; {DEV_RETENTION_HINT}"
            yield report

    def _checked(self, request: ReplayRequest) -> tuple[str, int, int]:
        env = inputs.environment(request.environment)
        if request.limit < 0:
            raise InvalidInputError("limit must not be negative (0: limits.max_replay_decisions)")
        if request.samples < 0:
            raise InvalidInputError("samples must not be negative")
        for what, value in (("since", request.since), ("until", request.until)):
            if value is not None and not (0 <= value < 1e11):
                raise InvalidInputError(f"{what} must be epoch seconds")
        if request.since is not None and request.until is not None and request.since > request.until:
            raise InvalidInputError("since is after until: the time range is empty")
        if not request.content.strip():
            raise InvalidInputError("the candidate policy is empty")
        if not request.against:
            raise InvalidInputError("name the deployed policy to replay against (--against NAME)")
        limit = min(request.limit or self.limits.max_replay_decisions, self.limits.max_replay_decisions)
        samples = min(request.samples or self.limits.max_replay_samples, self.limits.max_replay_samples)
        return env, limit, samples

    @contextlib.contextmanager
    def _slot(self, tenant: str) -> Any:
        cap = self.limits.max_concurrent_replays_per_tenant
        with self._running.hold(tenant, cap) as held:
            if not held:
                raise QuotaExceededError(
                    f"{cap} replays of this tenant are running (limits.max_concurrent_replays_per_tenant)",
                    setting="limits.max_concurrent_replays_per_tenant",
                )
            yield

    async def _pages(
        self,
        tenant: str,
        engine: Any,
        policy: Policy,
        report: ReplayReport,
        request: ReplayRequest,
        env: str,
        limit: int,
    ) -> AsyncIterator[ReplayProgress]:
        """Each page is read (records, then retained inputs) while the one before it is evaluated:
        the store's round trips overlap the engine, and at most two pages of text are held."""
        may_run = llm_only_with_permission(request.rerun_llm)
        judges = _judges(engine, policy) if request.estimate_only else []
        workers = self.limits.replay_concurrency
        page_size = self.limits.replay_page_size
        fetch = asyncio.create_task(self._fetch(tenant, report, request, env, None, min(page_size, limit)))
        try:
            for _ in range(-(-limit // page_size)):  # pages within the limit: the loop's bound
                records, retained, want = await fetch
                if not records:
                    return
                report.read += len(records)
                after = (records[-1].created_at, records[-1].decision_id)
                left = limit - report.read
                if len(records) == want and left > 0:
                    fetch = asyncio.create_task(self._fetch(tenant, report, request, env, after, min(page_size, left)))
                elif len(records) == want:  # the limit is reached: is there more in the range?
                    report.more = bool(await self._page(tenant, report, request, env, after, 1))
                todo = iter([(rec, retained.get(rec.decision_id)) for rec in records])

                async def worker() -> None:  # replay_concurrency workers per page, not a task per record
                    for rec, kept in todo:  # noqa: B023 - the page's own iterator, consumed before the next
                        await self._one(engine, policy, report, rec, kept, may_run, judges)

                await asyncio.gather(*(worker() for _ in range(min(workers, len(records)))))
                del retained  # this page's text leaves memory
                yield ReplayProgress(
                    read=report.read,
                    replayed=report.replayed,
                    not_replayable=report.not_replayable_count,
                    limit=limit,
                    message=f"{report.read} record(s) read",
                )
                if len(records) < want or left <= 0:
                    return
        finally:
            if not fetch.done():  # a prefetch nobody will read (the replay was cancelled or failed)
                fetch.cancel()
            fetch.add_done_callback(_consumed)

    async def _fetch(
        self,
        tenant: str,
        report: ReplayReport,
        request: ReplayRequest,
        env: str,
        after: tuple[float, str] | None,
        want: int,
    ) -> tuple[list[AuditRecord], dict[str, RetainedInputs], int]:
        records = await self._page(tenant, report, request, env, after, want)
        return records, await self._load(tenant, [r.decision_id for r in records]), want

    async def _load(self, tenant: str, ids: list[str]) -> dict[str, RetainedInputs]:
        """One page's retained inputs, in loads of at most retention.max_load_ids."""
        batch = self.retention.config.max_load_ids
        found: dict[str, RetainedInputs] = {}
        for i in range(0, len(ids), batch):
            found.update(await self.retention.load(tenant, ids[i : i + batch]))
        return found

    async def _page(
        self,
        tenant: str,
        report: ReplayReport,
        request: ReplayRequest,
        env: str,
        after: tuple[float, str] | None,
        want: int,
    ) -> list[AuditRecord]:
        return await self.store.page_decisions(
            tenant,
            policy=report.policy,
            environment=env,
            since=request.since,
            until=request.until,
            after=after,
            limit=want,
        )

    async def _one(
        self,
        engine: Any,
        policy: Policy,
        report: ReplayReport,
        rec: AuditRecord,
        kept: RetainedInputs | None,
        may_run: Any,
        judges: list[_Judge],
    ) -> None:
        if kept is None:
            report.unreplayable(rec.decision_id, _missing_reason(rec, self.clock()).value)
            return
        if report.estimate is not None:
            self._estimate(report.estimate, kept, judges)
            return
        await self._evaluate(engine, policy, report, rec, kept, may_run)

    def _estimate(self, estimate: LLMEstimate, kept: RetainedInputs, judges: list[_Judge]) -> None:
        calls = [j for j in judges if j.identity not in kept.results]
        if not calls:
            return
        estimate.decisions += 1
        for j in calls:
            prompt = estimated_prompt_tokens(j.instructions, kept.prompt, kept.response)
            estimate.calls += 1
            estimate.prompt_tokens += prompt
            estimate.completion_tokens += j.max_tokens
            price = price_for(self.prices, j.model)
            if price is None:
                if j.model not in estimate.unpriced_models:
                    estimate.unpriced_models.append(j.model)
            else:
                estimate.cost_usd += cost_usd(price, prompt, j.max_tokens)

    async def _evaluate(
        self, engine: Any, policy: Policy, report: ReplayReport, rec: AuditRecord, kept: RetainedInputs, may_run: Any
    ) -> None:
        try:
            results = RecordedResults(kept.results)
            decision = await engine.evaluate(
                policy,
                kept.prompt,
                kept.response,
                kept.context,
                decision_id=rec.decision_id,
                stage=kept.stage,
                replay=Replay(results, dt.datetime.fromtimestamp(rec.created_at, dt.UTC), may_run),
            )
        except NotReplayableError as e:
            report.unreplayable(rec.decision_id, e.reason)
            return
        except InvalidInputError:
            report.unreplayable(rec.decision_id, Unreplayable.INVALID_INPUT.value)
            return
        except CrossAuditError as e:  # the type only: a message could quote the text
            log.info("replay of decision %s failed: %s", rec.decision_id, type(e).__name__)
            report.unreplayable(rec.decision_id, Unreplayable.EVALUATOR_FAILED.value)
            return
        report.compare(RecordedDecision.of(rec.decision_id, rec.passed, rec.action, rec.rules), decision)


@dataclass(frozen=True)
class _Judge:
    identity: str
    model: str
    max_tokens: int
    instructions: str


def _judges(engine: Any, policy: Policy) -> list[_Judge]:
    """The candidate's LLM judges that an enabled rule may call, with their identities."""
    names: set[str] = set()
    for rule in policy.rules:
        if rule.enabled:
            names.update(n for n in (rule.evaluator, rule.fallback.evaluator if rule.fallback else None) if n)
            names.update(e.name for e in rule.evaluators or ())
    found = []
    for spec in policy.evaluators:
        cfg = spec.typed_config
        if spec.name not in names or spec.kind.value != LLM_KIND or not isinstance(cfg, LLMConfig):
            continue
        try:
            identity = engine.identity_of(policy, spec.name)
        except Exception:  # does not build here: a replay would count it as not replayable, not call it
            log.info("replay estimate: evaluator %s does not build", spec.name)
            continue
        found.append(_Judge(identity, cfg.model, cfg.max_tokens, cfg.system_prompt or ""))
    return found


def _consumed(task: asyncio.Task[Any]) -> None:
    """Retrieve a dropped prefetch's outcome, so its failure is not reported as never retrieved."""
    if not task.cancelled():
        task.exception()


def _missing_reason(rec: AuditRecord, now: float) -> Unreplayable:
    """Why a record has no retained inputs, as far as the record knows."""
    if rec.inputs_erased_at is not None:
        return Unreplayable.ERASED
    if rec.inputs_retained_until is not None and rec.inputs_retained_until <= now:
        return Unreplayable.EXPIRED
    return Unreplayable.NOT_RETAINED
