"""The service's behaviour, independent of gRPC: tenants' policies, decisions, uploads.

Servicers (``servicers.py``) only convert messages and map errors; everything here works
on plain models and the :class:`~crossaudit.store.Store`. The decision engine is
injected per tenant (``EngineProvider``): each tenant gets its own engine, so evaluator
instances and cached results are never shared between tenants.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from crossaudit.kernel.dsl import NAME_PATTERN, EvaluatorType
from crossaudit.kernel.errors import (
    CrossAuditError,
    DeadlineExceededError,
    EvaluatorCodeError,
    InvalidInputError,
    NotFoundError,
    PolicyIssue,
    PolicyValidationError,
    RateLimitedError,
)
from crossaudit.kernel.limits import DependencyLimits, SandboxLimits
from crossaudit.kernel.results import Action, Decision
from crossaudit.orchestrator.engine.thresholds import FeedbackStats
from crossaudit.orchestrator.policy import Policy, load_policy
from crossaudit.orchestrator.runtime import StoredEvaluator
from crossaudit.sandbox.base import CodeBundle, ProgressCallback, Sandbox
from crossaudit.service.config import DEFAULT_ENVIRONMENT, ServiceLimits
from crossaudit.service.grants import TenantGrants
from crossaudit.service.hosted import hosted_checks
from crossaudit.service.metrics import ServiceMetrics
from crossaudit.store.base import (
    AuditRecord,
    DeploymentRecord,
    EvaluatorRecord,
    FeedbackRecord,
    PolicySummaryRecord,
    PolicyVersionRecord,
    ReviewKind,
    ReviewRecord,
    ReviewState,
    Store,
    sha256_json,
    sha256_text,
)

log = logging.getLogger("crossaudit.service")

NAME = re.compile(NAME_PATTERN)  # evaluator names: the DSL's rule
ENVIRONMENT = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
REVIEW_ACTIONS = {Action.REQUIRE_REVIEW: ReviewKind.REQUIRE_REVIEW, Action.FLAG: ReviewKind.FLAG}


class DecisionEngine(Protocol):
    """What the service needs from the engine (``crossaudit.orchestrator.engine.Engine`` satisfies it)."""

    async def evaluate(
        self,
        policy: Policy,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        decision_id: str | None = None,
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

    # crossaudit.orchestrator.runtime.EvaluatorResolver
    def by_id(self, evaluator_id: str) -> StoredEvaluator | None:
        rec = self.by_id_records.get(evaluator_id)
        return None if rec is None else _stored(rec)

    def by_name(self, name: str) -> StoredEvaluator | None:
        rec = self.by_name_records.get(name)
        return None if rec is None else _stored(rec)


def _stored(rec: EvaluatorRecord) -> StoredEvaluator:
    return StoredEvaluator(id=rec.id, name=rec.name, code=rec.code, dependencies=rec.dependencies)


class TenantFeedback:
    """Rule-level feedback counts of one tenant, for the engine's feedback loops
    (``feedback_config.update_model``): loaded once from the store, updated on each label."""

    def __init__(self) -> None:
        self.loaded = False
        self.counts: dict[tuple[str, str], FeedbackStats] = {}

    def __call__(self, policy: str, rule: str) -> FeedbackStats | None:  # engine.FeedbackSource
        return self.counts.get((policy, rule))

    def add(self, policy: str, rule: str, label: str) -> None:
        old = self.counts.get((policy, rule)) or FeedbackStats()
        self.counts[(policy, rule)] = FeedbackStats(
            total=old.total + 1,
            false_positive=old.false_positive + (label == "false_positive"),
            false_negative=old.false_negative + (label == "false_negative"),
        )


# (tenant, its uploaded evaluators, its feedback) -> that tenant's engine
EngineProvider = Callable[[str, UploadedEvaluators, TenantFeedback], DecisionEngine]


@dataclass
class EvaluationOutcome:
    decision: Decision
    revision: int
    environment: str
    review_ids: list[str] = field(default_factory=list)
    answer: Any = None  # what ``evaluate(encode=...)`` made of it before the audit write


@dataclass
class _Deployed:
    record: PolicyVersionRecord
    policy: Policy


def _custom_specs(policy: Policy) -> list[tuple[int, Any]]:
    return [(i, e) for i, e in enumerate(policy.evaluators) if e.kind is EvaluatorType.CUSTOM]


def _inline_code(spec: Any) -> bool:
    cfg = spec.config or {}
    return bool(cfg.get("code") or cfg.get("code_file"))


class CrossAuditService:
    def __init__(
        self,
        store: Store,
        engines: EngineProvider,
        *,
        sandbox: Sandbox | None = None,
        limits: ServiceLimits | None = None,
        sandbox_limits: SandboxLimits | None = None,
        dependency_limits: DependencyLimits | None = None,
        metrics: ServiceMetrics | None = None,
        audit_raw_text: bool = False,
        grants: TenantGrants | None = None,
    ) -> None:
        self.store = store
        self.sandbox = sandbox
        self.limits = limits or ServiceLimits()
        self.sandbox_limits = sandbox_limits or (sandbox.limits if sandbox else SandboxLimits())
        self.dependency_limits = dependency_limits or DependencyLimits()
        self.metrics = metrics or ServiceMetrics()
        self.audit_raw_text = audit_raw_text
        # What each tenant's ${NAME} and LLM endpoints may reach; default: nothing but the
        # providers' default endpoints (the service passes the API-keys file's grants).
        self.grants = grants if grants is not None else TenantGrants()
        self._engine_provider = engines
        self._engines: dict[str, DecisionEngine] = {}
        self._uploads: dict[str, UploadedEvaluators] = {}
        self._feedback: dict[str, TenantFeedback] = {}
        self._policies: OrderedDict[tuple[str, str, int], _Deployed] = OrderedDict()
        self._deployed: dict[tuple[str, str, str], int] = {}
        self._inflight: dict[str, int] = {}
        self._uploading: dict[str, int] = {}

    # --- helpers ------------------------------------------------------------------------

    def engine(self, tenant: str) -> DecisionEngine:
        eng = self._engines.get(tenant)
        if eng is None:
            eng = self._engine_provider(tenant, self.uploads(tenant), self.feedback(tenant))
            self._engines[tenant] = eng
        return eng

    def feedback(self, tenant: str) -> TenantFeedback:
        fb = self._feedback.get(tenant)
        if fb is None:
            fb = self._feedback[tenant] = TenantFeedback()
        return fb

    async def _load_feedback(self, tenant: str) -> None:
        fb = self.feedback(tenant)
        if fb.loaded:
            return
        counts = await self.store.feedback_counts(tenant)
        if not fb.loaded:
            for key, (total, fp, fn) in counts.items():
                fb.counts[key] = FeedbackStats(total=total, false_positive=fp, false_negative=fn)
            fb.loaded = True

    def uploads(self, tenant: str) -> UploadedEvaluators:
        up = self._uploads.get(tenant)
        if up is None:
            up = self._uploads[tenant] = UploadedEvaluators(tenant)
        return up

    def _name(self, value: str, what: str) -> str:
        if not value:
            raise InvalidInputError(f"{what} is required")
        if len(value) > self.limits.max_name_length:
            raise InvalidInputError(f"{what} is longer than {self.limits.max_name_length} characters")
        return value

    @staticmethod
    def _environment(value: str) -> str:
        env = value or DEFAULT_ENVIRONMENT
        if not ENVIRONMENT.match(env):
            raise InvalidInputError(
                f"invalid environment {env!r}: lowercase letters, digits, '_' and '-', starting with a letter"
            )
        return env

    async def _resolve_uploads(self, tenant: str, policy: Policy) -> None:
        """Check every custom evaluator that references an upload, and load those uploads.

        A custom evaluator's ``id`` must be one of this tenant's uploads; one without id or
        inline code uses the tenant's latest upload of the same name when there is one.
        """
        issues: list[PolicyIssue] = []
        up = self.uploads(tenant)
        for i, spec in _custom_specs(policy):
            if spec.id:
                try:  # an id always means an upload (the runtime runs the upload's code)
                    up.add(await self.store.get_evaluator(tenant, spec.id))
                except NotFoundError:
                    issues.append(
                        PolicyIssue(
                            message=f"evaluator id {spec.id!r} is not an evaluator uploaded by this tenant",
                            path=f"evaluators[{i}].id",
                        )
                    )
            elif not _inline_code(spec):
                # The service never looks for evaluators/<name>.py (the CLI and Client inline it):
                # without an upload of that name there is no code, whatever exists on this disk.
                try:
                    up.add(await self.store.get_evaluator_by_name(tenant, spec.name), as_name=True)
                except NotFoundError:
                    issues.append(
                        PolicyIssue(
                            message=f"custom evaluator {spec.name!r} has no code: give config.code or an id, or "
                            f"upload an evaluator named {spec.name!r} (`crossaudit policy deploy` inlines "
                            f"evaluators/{spec.name}.py from next to the policy file)",
                            path=f"evaluators[{i}]",
                        )
                    )
        if issues:
            raise PolicyValidationError(issues)

    async def _prepare(self, tenant: str, policy: Policy, *, strict: bool) -> None:
        """Make every custom evaluator of ``policy`` runnable (images built, pools warm): the
        sandbox never builds at call time. ``strict``: raise (deploy); else log (load)."""
        if self.sandbox is None:
            return
        from crossaudit.orchestrator.runtime import Runtime

        runtime = Runtime(self.sandbox, resolver=self.uploads(tenant), tenant=tenant)
        for _, spec in _custom_specs(policy):
            try:
                bundle = runtime.bundle_for(spec, policy)
                async with asyncio.timeout(self.limits.upload_timeout_s):
                    await self.sandbox.prepare(bundle)
            except TimeoutError:
                if strict:
                    raise DeadlineExceededError(
                        f"preparing evaluator {spec.name!r} took longer than {self.limits.upload_timeout_s:.0f}s"
                    ) from None
                log.warning("preparing evaluator %s of %s timed out", spec.name, policy.name)
            except CrossAuditError as e:
                if strict:
                    raise
                log.warning("evaluator %s of %s is not runnable: %s", spec.name, policy.name, e.message)

    async def _load(self, tenant: str, rec: PolicyVersionRecord) -> Policy:
        key = (tenant, rec.name, rec.version)
        hit = self._policies.get(key)
        if hit is not None:
            self._policies.move_to_end(key)
            return hit.policy
        policy = await self._parse(tenant, rec.content, f"{rec.name}@{rec.version}")
        await self._resolve_uploads(tenant, policy)
        await self._prepare(tenant, policy, strict=False)
        self._cache(tenant, rec, policy)
        return policy

    def _cache(self, tenant: str, rec: PolicyVersionRecord, policy: Policy) -> None:
        self._policies[(tenant, rec.name, rec.version)] = _Deployed(rec, policy)
        self._policies.move_to_end((tenant, rec.name, rec.version))
        while len(self._policies) > self.limits.policy_cache_entries:
            self._policies.popitem(last=False)

    # --- policies -----------------------------------------------------------------------

    async def _parse(self, tenant: str, text: str, filename: str) -> Policy:
        """Parse and validate for ``tenant``: ``${NAME}`` only as granted to it, and the
        service's rules (no file references, allowlisted LLM hosts), each issue located."""
        return await _parse(
            text, filename, env=self.grants.source(tenant), checks=(hosted_checks(self.grants.hosts(tenant)),)
        )

    async def validate_policy(self, content: str, filename: str = "", *, tenant: str = "") -> Policy:
        return await self._parse(tenant, content, filename or "<policy>")

    async def deploy_policy(
        self, tenant: str, content: str, *, environment: str = "", filename: str = ""
    ) -> tuple[PolicyVersionRecord, DeploymentRecord, bool]:
        env = self._environment(environment)
        policy = await self._parse(tenant, content, filename or "<policy>")
        await self._resolve_uploads(tenant, policy)
        await self._prepare(tenant, policy, strict=True)
        version, deployment, created = await self.store.deploy_policy(
            tenant,
            name=policy.name,
            declared_version=policy.version,
            description=policy.description,
            content=content,
            environment=env,
        )
        self._deployed[(tenant, policy.name, env)] = version.version
        self._cache(tenant, version, policy)
        log.info("tenant %s deployed %s v%d to %s", tenant, policy.name, version.version, env)
        return version, deployment, created

    async def get_policy(
        self, tenant: str, name: str, *, environment: str = "", version: int = 0
    ) -> tuple[PolicyVersionRecord, list[DeploymentRecord]]:
        self._name(name, "policy name")
        if version:
            rec = await self.store.get_policy_version(tenant, name, version)
        else:
            rec = await self.store.get_deployed_policy(tenant, name, self._environment(environment))
        return rec, await self.store.list_deployments(tenant, name)

    async def list_policies(self, tenant: str, environment: str = "") -> list[PolicySummaryRecord]:
        env = self._environment(environment) if environment else None
        return (await self.store.list_policies(tenant, env))[: self.limits.max_list_items]

    async def rollback_policy(
        self, tenant: str, name: str, *, environment: str = "", to_version: int = 0
    ) -> tuple[DeploymentRecord, int]:
        self._name(name, "policy name")
        env = self._environment(environment)
        if to_version < 0:
            raise InvalidInputError("to_version must be positive (or 0 for the previous deployment)")
        if to_version:  # the target must still be a valid policy for this tenant
            await self._load(tenant, await self.store.get_policy_version(tenant, name, to_version))
        dep, previous = await self.store.rollback_policy(tenant, name, env, to_version or None)
        self._deployed[(tenant, name, env)] = dep.version
        log.info("tenant %s rolled %s back to v%d in %s", tenant, name, dep.version, env)
        return dep, previous

    async def _deployed_policy(self, tenant: str, name: str, env: str) -> tuple[PolicyVersionRecord, Policy]:
        version = self._deployed.get((tenant, name, env))
        if version is not None:
            hit = self._policies.get((tenant, name, version))
            if hit is not None:
                self._policies.move_to_end((tenant, name, version))
                return hit.record, hit.policy
        rec = await self.store.get_deployed_policy(tenant, name, env)
        policy = await self._load(tenant, rec)
        self._deployed[(tenant, name, env)] = rec.version
        return rec, policy

    # --- decisions ----------------------------------------------------------------------

    def budget(self, time_remaining: float | None) -> float:
        """Seconds the decision may take: the caller's remaining deadline minus what answering
        needs, or the default when the caller set no deadline."""
        if time_remaining is None:
            return self.limits.default_deadline_s
        margin = min(self.limits.answer_margin_s, self.limits.answer_margin_fraction * time_remaining)
        return min(time_remaining - margin, self.limits.default_deadline_s)

    async def evaluate(
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
    ) -> EvaluationOutcome:
        """Decide, audit, answer. ``encode`` turns the outcome into the answer (the wire message)
        *before* the audit record is written: if it fails, nothing is audited, so the audit log
        never holds a decision the caller did not receive."""
        t0 = time.monotonic()
        budget = self.budget(time_remaining)
        if budget <= 0:
            raise DeadlineExceededError("the deadline leaves no time to evaluate")
        self._name(policy, "policy")
        env = self._environment(environment)
        inflight = self._inflight.get(tenant, 0)
        if inflight >= self.limits.max_inflight_evaluations_per_tenant:
            raise RateLimitedError(
                f"too many concurrent evaluations for this tenant (limit "
                f"{self.limits.max_inflight_evaluations_per_tenant}); retry later"
            )
        self._inflight[tenant] = inflight + 1
        self.metrics.inflight.inc()
        try:
            decision_id = str(uuid.uuid4())

            async def decide() -> tuple[PolicyVersionRecord, Policy, Decision]:
                await self._load_feedback(tenant)
                rec, pol = await self._deployed_policy(tenant, policy, env)
                left = budget - (time.monotonic() - t0)
                if left <= 0:
                    raise DeadlineExceededError("the deadline ran out before the policy could be evaluated")
                decision = await self.engine(tenant).evaluate(
                    pol, prompt, response, dict(context or {}), timeout=left, decision_id=decision_id
                )
                return rec, pol, decision

            # Hard stop just before the caller's deadline, so that the answer is ours (a decision
            # or DEADLINE_EXCEEDED), never the transport's.
            if time_remaining is None:
                hard = budget + self.limits.answer_margin_s
            else:
                cutoff = min(self.limits.cutoff_margin_s, self.limits.cutoff_margin_fraction * time_remaining)
                hard = time_remaining - cutoff
            task = asyncio.ensure_future(decide())
            try:
                done, _ = await asyncio.wait({task}, timeout=max(0.0, hard - (time.monotonic() - t0)))
            except asyncio.CancelledError:  # the caller went away: stop the evaluators too
                task.cancel()
                raise
            if not done:
                # Cancel, but do not wait for the sandbox's cleanup: the answer must make the deadline.
                task.cancel()
                task.add_done_callback(_consume)
                raise DeadlineExceededError(f"no decision within the deadline ({budget:.3f}s)")
            rec, pol, decision = task.result()
            decision.decision_id = decision_id
            reviews = self._reviews(tenant, decision, rec.version, env)
            outcome = EvaluationOutcome(decision, rec.version, env, [r.id for r in reviews])
            if encode is not None:
                outcome.answer = encode(outcome)
            await self.store.record_decision(
                self._audit(tenant, decision, rec, env, prompt, response, context, pol, request_id), reviews
            )
            self.metrics.observe_decision(decision, time.monotonic() - t0)
            return outcome
        finally:
            self._inflight[tenant] -= 1
            self.metrics.inflight.dec()

    def _reviews(self, tenant: str, d: Decision, revision: int, env: str) -> list[ReviewRecord]:
        now = time.time()
        out = []
        for r in d.rules:
            if r.passed or r.action not in REVIEW_ACTIONS:
                continue
            out.append(
                ReviewRecord(
                    id=str(uuid.uuid4()),
                    tenant=tenant,
                    decision_id=d.decision_id,
                    policy=d.policy,
                    policy_revision=revision,
                    environment=env,
                    rule=r.rule,
                    kind=REVIEW_ACTIONS[r.action],
                    state=ReviewState.OPEN,
                    params=dict(r.outcome.params) if r.outcome else {},
                    created_at=now,
                )
            )
        return out

    def _audit(
        self,
        tenant: str,
        d: Decision,
        rec: PolicyVersionRecord,
        env: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None,
        policy: Policy,
        request_id: str,
    ) -> AuditRecord:
        raw = self.audit_raw_text or policy.settings.audit_all_evaluations
        rules = []
        for r in d.rules:
            rules.append(
                {
                    "rule": r.rule,
                    "status": r.status.value,
                    "passed": r.passed,
                    "score": r.score,
                    "threshold": r.threshold,
                    "action": r.action.value if r.action else None,
                    "latency_ms": round(r.latency_ms, 3),
                    "fallback_used": r.fallback_used,
                    "reason": r.reason,
                    "evaluators": [
                        {
                            "evaluator": e.evaluator,
                            "kind": e.kind,
                            "status": e.status.value,
                            "score": e.score,
                            "latency_ms": round(e.latency_ms, 3),
                            "attempts": e.attempts,
                            "cached": e.cached,
                            "error_type": e.error_type,
                            "violations": list(e.violations) if raw else len(e.violations),
                        }
                        for e in r.evaluators
                    ],
                }
            )
        return AuditRecord(
            decision_id=d.decision_id,
            tenant=tenant,
            policy=d.policy,
            policy_revision=rec.version,
            policy_version=d.policy_version,
            policy_digest=rec.digest,
            environment=env,
            passed=d.passed,
            action=d.action.value,
            rules=rules,
            errored_rules=list(d.errored_rules),
            latency_ms=d.latency_ms,
            prompt_sha256=sha256_text(prompt),
            response_sha256=sha256_text(response),
            context_sha256=sha256_json(dict(context or {})),
            created_at=time.time(),
            request_id=request_id,
            prompt=prompt if raw else None,
            response=response if raw else None,
            modified_response_sha256=sha256_text(d.modified_response) if d.modified_response is not None else None,
        )

    async def submit_feedback(
        self, tenant: str, decision_id: str, *, rule: str = "", label: str, comment: str = ""
    ) -> FeedbackRecord:
        self._name(decision_id, "decision_id")
        if not LABEL.match(label or ""):
            raise InvalidInputError("label must be 1-64 characters: letters, digits, '_', '.', ':' or '-'")
        if len(comment.encode()) > self.limits.max_feedback_comment_bytes:
            raise InvalidInputError(f"comment is longer than {self.limits.max_feedback_comment_bytes} bytes")
        await self._load_feedback(tenant)  # before adding, so the new label is counted once
        rec = await self.store.add_feedback(tenant, decision_id, rule=rule, label=label, comment=comment)
        if rule:
            decision = await self.store.get_decision(tenant, decision_id)
            self.feedback(tenant).add(decision.policy, rule, label)
        return rec

    # --- evaluators ---------------------------------------------------------------------

    def check_upload(self, name: str, code: str, language: str, dependencies: list[str]) -> tuple[str, ...]:
        """Validate an upload without running anything; returns the dependencies to store."""
        if not NAME.match(name or ""):
            raise InvalidInputError(
                f"invalid evaluator name {name!r}: letters, digits, '_' and '-', starting with a letter or '_'"
            )
        if (language or "python") != "python":
            raise InvalidInputError(f"unsupported language {language!r}: only python is supported")
        cap = min(self.limits.max_code_bytes, self.sandbox_limits.code_bytes)
        if len(code.encode()) > cap:
            raise EvaluatorCodeError(f"code is larger than {cap} bytes")
        if len(dependencies) > self.limits.max_dependencies:
            raise InvalidInputError(f"more than {self.limits.max_dependencies} dependencies")
        _check_code(code)
        return _check_dependencies(dependencies, self.dependency_limits)

    async def upload_evaluator(
        self,
        tenant: str,
        *,
        name: str,
        code: str,
        language: str = "python",
        dependencies: list[str] | tuple[str, ...] = (),
        description: str = "",
        progress: ProgressCallback | None = None,
    ) -> tuple[EvaluatorRecord, bool]:
        deps = self.check_upload(name, code, language, list(dependencies))
        bundle = CodeBundle(code=code, dependencies=deps, language=language or "python", tenant=tenant)
        uploading = self._uploading.get(tenant, 0)
        if uploading >= self.limits.max_concurrent_uploads_per_tenant:
            raise RateLimitedError(
                f"this tenant already has {uploading} upload(s) being prepared "
                f"(limit {self.limits.max_concurrent_uploads_per_tenant}); retry later"
            )
        self._uploading[tenant] = uploading + 1
        try:
            if self.sandbox is not None:
                async with asyncio.timeout(self.limits.upload_timeout_s):
                    await self.sandbox.prepare(bundle, progress)
        except TimeoutError:
            raise DeadlineExceededError(
                f"preparing the evaluator took longer than {self.limits.upload_timeout_s:.0f}s"
            ) from None
        finally:
            self._uploading[tenant] -= 1
        rec, created = await self.store.put_evaluator(
            tenant,
            name=name,
            code=code,
            language=bundle.language,
            dependencies=deps,
            digest=bundle.digest,
            description=description[: self.limits.max_feedback_comment_bytes],
        )
        self.metrics.uploads.labels(str(created).lower()).inc()
        log.info("tenant %s uploaded evaluator %s v%d (%s)", tenant, name, rec.version, rec.id)
        return rec, created

    async def get_evaluator(self, tenant: str, *, evaluator_id: str = "", name: str = "", version: int = 0):
        if evaluator_id:
            return await self.store.get_evaluator(tenant, evaluator_id)
        if name:
            return await self.store.get_evaluator_by_name(tenant, name, version or None)
        raise InvalidInputError("give an evaluator id or a name")

    async def list_evaluators(self, tenant: str, name: str = "") -> list[EvaluatorRecord]:
        return (await self.store.list_evaluators(tenant, name or None))[: self.limits.max_list_items]

    # --- audit --------------------------------------------------------------------------

    async def get_decision(self, tenant: str, decision_id: str) -> AuditRecord:
        self._name(decision_id, "decision_id")
        return await self.store.get_decision(tenant, decision_id)

    async def list_decisions(self, tenant: str, *, policy: str = "", limit: int = 0) -> list[AuditRecord]:
        if limit < 0:
            raise InvalidInputError("limit must not be negative")
        cap = min(limit or self.limits.max_list_items, self.limits.max_list_items)
        return await self.store.list_decisions(tenant, policy=policy or None, limit=cap)

    # --- reviews ------------------------------------------------------------------------

    async def list_reviews(
        self, tenant: str, *, state: ReviewState | None = None, policy: str = "", limit: int = 0
    ) -> list[ReviewRecord]:
        if limit < 0:
            raise InvalidInputError("limit must not be negative")
        cap = min(limit or self.limits.max_list_items, self.limits.max_list_items)
        await self.store.auto_approve_due(tenant, time.time())
        return await self.store.list_reviews(tenant, state=state, policy=policy or None, limit=cap)

    async def resolve_review(
        self, tenant: str, review_id: str, state: ReviewState, *, reviewer: str = "", note: str = ""
    ) -> ReviewRecord:
        self._name(review_id, "review id")
        if state is ReviewState.OPEN:
            raise InvalidInputError("resolve a review as approved, rejected or dismissed")
        if len(note.encode()) > self.limits.max_feedback_comment_bytes:
            raise InvalidInputError(f"note is longer than {self.limits.max_feedback_comment_bytes} bytes")
        await self.store.auto_approve_due(tenant, time.time())
        return await self.store.resolve_review(
            tenant, review_id, state, reviewer=reviewer[: self.limits.max_name_length], note=note
        )

    # --- lifecycle ----------------------------------------------------------------------

    async def bootstrap(self, tenants: list[str], files: list[tuple[str, str]], environment: str) -> list[str]:
        """Deploy ``files`` [(filename, text)] for every tenant, once per data directory.
        Returns one line per problem (invalid files are skipped, not fatal)."""
        if await self.store.get_meta("bootstrapped"):
            return []
        if files:
            log.info(
                "first start: deploying %d policy file(s) to %s for %d tenant(s) (may build sandbox images)",
                len(files),
                environment,
                len(tenants),
            )
        problems = []
        for tenant in tenants:
            for filename, text in files:
                try:
                    await self.deploy_policy(tenant, text, environment=environment, filename=filename)
                except CrossAuditError as e:
                    problems.append(f"{filename}: not deployed for tenant {tenant}: {e.message.splitlines()[0]}")
        await self.store.set_meta("bootstrapped", str(time.time()))
        return problems

    async def warm(self, tenants: list[str]) -> int:
        """Load (and prepare) every deployed policy version, so that the first request after a
        restart does not pay for it. Returns how many were loaded."""
        count = 0
        for tenant in tenants:
            for summary in await self.store.list_policies(tenant):
                for dep in summary.deployments:
                    try:
                        await self._deployed_policy(tenant, summary.name, dep.environment)
                        count += 1
                    except CrossAuditError as e:
                        log.warning(
                            "deployed policy %s (%s) does not load: %s",
                            summary.name,
                            dep.environment,
                            e.message.splitlines()[0],
                        )
        return count

    async def aclose(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for eng in engines:
            try:
                await eng.aclose()
            except Exception:  # closing must go on for the others
                log.exception("closing an engine failed")


async def _parse(text: str, filename: str, **options: Any) -> Policy:
    """Parse and validate off the event loop: a large policy must not stall other requests."""
    return await asyncio.to_thread(functools.partial(load_policy, text, filename, **options))


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve a cancelled evaluation's outcome so that nothing is logged as never retrieved."""
    if not task.cancelled():
        task.exception()


def _check_code(code: str) -> None:
    try:
        from crossaudit.kernel.codecheck import check_code
    except ImportError:
        from crossaudit.orchestrator.policy.validate import check_evaluator_code

        why = check_evaluator_code(code)
        if why:
            raise EvaluatorCodeError(why) from None
        return
    check_code(code)


def _check_dependencies(deps: list[str], limits: DependencyLimits) -> tuple[str, ...]:
    from crossaudit.kernel.depspec import validate_dependencies

    validated = validate_dependencies(deps, limits)
    return tuple(str(d) for d in validated)
