"""Per-tenant state: each tenant's engine, the uploaded evaluators its policies reference, and its
feedback counts.

The decision engine is injected (``EngineProvider``) and built once per tenant, so evaluator
instances and cached results are never shared between tenants.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from crossaudit.api.records import EvaluatorRecord
from crossaudit.kernel.results import Decision
from crossaudit.store.base import Store
from orchestrator.engine.calibration import FEEDBACK_SHOULD_PASS
from orchestrator.engine.replay import Replay
from orchestrator.engine.thresholds import FEEDBACK_SCORES_PER_RULE, FeedbackStats
from orchestrator.policy import Policy
from orchestrator.runtime import StoredEvaluator

log = logging.getLogger("crossaudit.service")
# Feedback labels (most recent first, every rule of the tenant) whose scores a tenant's feedback
# loops load when the service starts: FEEDBACK_SCORES_PER_RULE per rule at most are kept.
MAX_FEEDBACK_SCORES_LOADED = 100_000


class DecisionEngine(Protocol):
    """What the service needs from the engine (``orchestrator.engine.engine.Engine`` satisfies it)."""

    async def evaluate(
        self,
        policy: Policy,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        decision_id: str | None = None,
        stage: str = "",  # "input" | "output": only that stage's rules run
        replay: Replay | None = None,  # recorded verdicts reused by identity (replay, shadow)
    ) -> Decision: ...

    async def aclose(self) -> None: ...


class UploadedEvaluators:
    """One tenant's uploaded evaluators that its deployed policies reference, by id and by name.

    Filled (async, from the store) when a policy version is deployed or first loaded, read
    synchronously by the runtime (``EvaluatorResolver``) while the engine builds evaluators.
    A by-name reference binds to the latest upload of that name at that moment.
    """

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.by_id_records: dict[str, EvaluatorRecord] = {}
        self.by_name_records: dict[str, EvaluatorRecord] = {}

    def add(self, rec: EvaluatorRecord, *, as_name: bool = False) -> None:
        self.by_id_records[rec.id] = rec
        if as_name:
            self.by_name_records[rec.name] = rec

    # orchestrator.runtime.EvaluatorResolver
    def by_id(self, evaluator_id: str) -> StoredEvaluator | None:
        rec = self.by_id_records.get(evaluator_id)
        return None if rec is None else _stored(rec)

    def by_name(self, name: str) -> StoredEvaluator | None:
        rec = self.by_name_records.get(name)
        return None if rec is None else _stored(rec)


def _stored(rec: EvaluatorRecord) -> StoredEvaluator:
    return StoredEvaluator(id=rec.id, name=rec.name, code=rec.code, dependencies=rec.dependencies)


class TenantFeedback:
    """Rule-level feedback of one tenant, for the engine's feedback loops
    (``feedback_config.update_model``): counts, and the most recent labelled scores
    (``FEEDBACK_SCORES_PER_RULE`` per rule) that calibration uses; loaded once from the store,
    updated on each label."""

    def __init__(self) -> None:
        self.loaded = False
        self.counts: dict[tuple[str, str], FeedbackStats] = {}

    def __call__(self, policy: str, rule: str) -> FeedbackStats | None:  # engine.FeedbackSource
        return self.counts.get((policy, rule))

    def add(self, policy: str, rule: str, label: str, score: float | None = None) -> None:
        old = self.counts.get((policy, rule)) or FeedbackStats()
        should_pass = FEEDBACK_SHOULD_PASS.get(label)
        scores = old.scores
        if score is not None and should_pass is not None:
            scores = (*scores, (score, should_pass))[-FEEDBACK_SCORES_PER_RULE:]
        self.counts[(policy, rule)] = FeedbackStats(
            total=old.total + 1,
            false_positive=old.false_positive + (label == "false_positive"),
            false_negative=old.false_negative + (label == "false_negative"),
            scores=scores,
        )


# (tenant, its uploaded evaluators, its feedback) -> that tenant's engine
EngineProvider = Callable[[str, UploadedEvaluators, TenantFeedback], DecisionEngine]


class Tenants:
    """Each tenant's engine, uploads and feedback, created on first use."""

    def __init__(self, store: Store, engines: EngineProvider) -> None:
        self.store = store
        self._engine_provider = engines
        self._engines: dict[str, DecisionEngine] = {}
        self._shadow_engines: dict[str, DecisionEngine] = {}
        self._uploads: dict[str, UploadedEvaluators] = {}
        self._feedback: dict[str, TenantFeedback] = {}

    def engine(self, tenant: str) -> DecisionEngine:
        eng = self._engines.get(tenant)
        if eng is None:
            eng = self._engine_provider(tenant, self.uploads(tenant), self.feedback(tenant))
            self._engines[tenant] = eng
        return eng

    def dedicated_engine(self, tenant: str) -> DecisionEngine:
        """A new engine of ``tenant`` that no request shares (its own evaluator instances and
        result cache; same scope, so its evaluators have the identities live ones have): replay
        evaluates candidates on one, then closes it."""
        return self._engine_provider(tenant, self.uploads(tenant), self.feedback(tenant))

    def shadow_engine(self, tenant: str) -> DecisionEngine:
        """A second engine of ``tenant`` for shadow evaluations (crossaudit.governance.rollout): its
        own result cache and its own ``rate_limit`` buckets (their names say ``shadow``), so a
        shadow can neither spend the tokens the live answers wait for nor put its verdicts into
        their cache. Its scope stays the tenant, so its evaluators have the live identities and
        the live decision's verdicts are reused for those that did not change. The sandbox pools
        and model servers are the same."""
        eng = self._shadow_engines.get(tenant)
        if eng is None:
            eng = self._engine_provider(tenant, self.uploads(tenant), self.feedback(tenant))
            if isinstance(getattr(eng, "bucket_scope", None), str):
                eng.bucket_scope = f"{tenant}/shadow"  # type: ignore[attr-defined]
            self._shadow_engines[tenant] = eng
        return eng

    def uploads(self, tenant: str) -> UploadedEvaluators:
        up = self._uploads.get(tenant)
        if up is None:
            up = self._uploads[tenant] = UploadedEvaluators(tenant)
        return up

    def feedback(self, tenant: str) -> TenantFeedback:
        fb = self._feedback.get(tenant)
        if fb is None:
            fb = self._feedback[tenant] = TenantFeedback()
        return fb

    async def load_feedback(self, tenant: str) -> None:
        """Fill the tenant's counts from the store, once (a restarted service keeps learning)."""
        fb = self.feedback(tenant)
        if fb.loaded:
            return
        counts = await self.store.feedback_counts(tenant)
        recent = await self.store.feedback_scores(tenant, limit=MAX_FEEDBACK_SCORES_LOADED)
        scores: dict[tuple[str, str], list[tuple[float, bool]]] = {}
        for policy, rule, label, score in recent:  # most recent first: each rule keeps its latest
            kept = scores.setdefault((policy, rule), [])
            if score is not None and label in FEEDBACK_SHOULD_PASS and len(kept) < FEEDBACK_SCORES_PER_RULE:
                kept.append((score, FEEDBACK_SHOULD_PASS[label]))
        if not fb.loaded:
            for key, (total, fp, fn) in counts.items():
                labelled = tuple(reversed(scores.get(key, ())))  # oldest first, as add() appends
                fb.counts[key] = FeedbackStats(total=total, false_positive=fp, false_negative=fn, scores=labelled)
            fb.loaded = True

    def cache_stats(self) -> list[tuple[str, int, int, int]]:
        """(tenant, hits, misses, entries) of each engine's result cache, for the metrics scrape."""
        out = []
        for tenant, eng in list(self._engines.items()):
            cache = getattr(eng, "cache", None)
            if cache is not None:
                out.append((tenant, int(cache.hits), int(cache.misses), len(cache)))
        return out

    async def aclose(self) -> None:
        engines = [*self._engines.values(), *self._shadow_engines.values()]
        self._engines, self._shadow_engines = {}, {}
        for eng in engines:
            try:
                await eng.aclose()
            except Exception:  # closing must go on for the others
                log.exception("closing an engine failed")
