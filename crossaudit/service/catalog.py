"""Tenants' policies: validate, deploy, roll back, and the loaded versions evaluations run on.

A deployed version is parsed, its uploaded evaluators resolved and its sandboxes prepared once,
then kept in a bounded cache, so that an evaluation never parses YAML or builds an image.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from crossaudit.api.records import DeploymentRecord, PolicySummaryRecord, PolicyVersionRecord
from crossaudit.kernel.dsl import EvaluatorType
from crossaudit.kernel.errors import (
    CrossAuditError,
    DeadlineExceededError,
    InvalidInputError,
    NotFoundError,
    PolicyIssue,
    PolicyValidationError,
    QuotaExceededError,
)
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.kernel.results import Action
from crossaudit.modelserver.pool import ModelBackend
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.service import inputs
from crossaudit.service.config import ServiceLimits
from crossaudit.service.grants import TenantGrants
from crossaudit.service.hosted import hosted_checks
from crossaudit.service.tenants import Tenants
from crossaudit.store.base import Store
from orchestrator.policy import Policy, envvars, load_policy
from orchestrator.policy.models import model_check
from orchestrator.runtime import Runtime
from sandbox.base import Sandbox

log = logging.getLogger("crossaudit.service")


@dataclass
class _Deployed:
    record: PolicyVersionRecord
    policy: Policy


def _custom_specs(policy: Policy) -> list[tuple[int, Any]]:
    return [(i, e) for i, e in enumerate(policy.evaluators) if e.kind is EvaluatorType.CUSTOM]


def _builtin_specs(policy: Policy) -> list[Any]:
    return [e for e in policy.evaluators if e.kind is EvaluatorType.BUILTIN]


def _inline_code(spec: Any) -> bool:
    cfg = spec.config or {}
    return bool(cfg.get("code") or cfg.get("code_file"))


def _scoped(progress: ProgressCallback, name: str, index: int, count: int) -> ProgressCallback:
    """One evaluator's progress as part of a deploy's: its name first, its fraction a share of all."""
    return lambda message, fraction: progress(f"{name}: {message}", (index + fraction) / count)


class PolicyCatalog:
    def __init__(
        self,
        store: Store,
        tenants: Tenants,
        *,
        sandbox: Sandbox | None,
        model_backend: ModelBackend | None = None,
        limits: ServiceLimits,
        grants: TenantGrants,
        max_webhook_rules: int = DeliveryLimits.max_webhook_rules_per_policy,
    ) -> None:
        self.store = store
        self.tenants = tenants
        self.sandbox = sandbox
        self.model_backend = model_backend  # the builtins' model servers (None: nothing to start)
        self._warming: set[asyncio.Task[None]] = set()  # model-server starts a load left running
        self.limits = limits
        self.grants = grants
        self.max_webhook_rules = max_webhook_rules  # DeliveryLimits.max_webhook_rules_per_policy
        # parsed policies by immutable (tenant, name, version): nothing to release on eviction
        self._policies: LRUCache[tuple[str, str, int], _Deployed] = LRUCache(max(1, limits.policy_cache_entries))
        # (tenant, name, env) -> (deployed version, monotonic time it was read): another replica
        # may deploy or roll back, so an entry is trusted for ``deployment_recheck_s`` only.
        self._deployed: dict[tuple[str, str, str], tuple[int, float]] = {}

    async def parse(self, tenant: str, text: str, filename: str, *, models: bool = False) -> Policy:
        """Parse and validate for ``tenant``: ``${NAME}`` only as granted to it, and the
        service's rules (no file references, allowlisted LLM hosts), each issue located.
        ``models``: also refuse builtins whose model the operator does not provide (validate and
        deploy; a version already deployed still loads, its calls name the missing model)."""
        hosted = hosted_checks(self.grants.hosts(tenant), self.grants.webhook(tenant))
        checks = (hosted, *((model_check(),) if models else ()))
        return await _parse(text, filename, env=self.grants.source(tenant), checks=checks)

    async def validate_policy(self, content: str, filename: str = "", *, tenant: str = "") -> Policy:
        return await self.parse(tenant, content, filename or "<policy>", models=True)

    async def deploy_policy(
        self,
        tenant: str,
        content: str,
        *,
        environment: str = "",
        filename: str = "",
        progress: ProgressCallback | None = None,
    ) -> tuple[PolicyVersionRecord, DeploymentRecord, bool]:
        """``progress(message, fraction)`` hears the preparation of the custom evaluators (their
        images may be built first: minutes, the longest part of a deploy)."""
        env = inputs.environment(environment)
        policy = await self.prepare_policy(tenant, content, filename, progress)
        version, deployment, created = await self.store.deploy_policy(
            tenant,
            name=policy.name,
            declared_version=policy.version,
            description=policy.description,
            content=content,
            environment=env,
        )
        self._deployed[(tenant, policy.name, env)] = (version.version, time.monotonic())
        self._cache(tenant, version, policy)
        log.info("tenant %s deployed %s v%d to %s", tenant, policy.name, version.version, env)
        return version, deployment, created

    async def prepare_policy(
        self, tenant: str, content: str, filename: str = "", progress: ProgressCallback | None = None
    ) -> Policy:
        """What a deploy checks and prepares before storing anything (a candidate's too): the
        located validation errors, the webhook-rule cap, uploads resolved, sandboxes ready."""
        policy = await self.parse(tenant, content, filename or "<policy>", models=True)
        self._check_webhook_rules(policy)
        await self._resolve_uploads(tenant, policy)
        await self._prepare(tenant, policy, strict=True, progress=progress)
        return policy

    def remember(self, tenant: str, rec: PolicyVersionRecord, policy: Policy) -> None:
        """Keep a version just stored (a candidate's) loaded: its first request does not parse it."""
        self._cache(tenant, rec, policy)

    def deployed(self, tenant: str, name: str, env: str, version: int) -> None:
        """``version`` became active in ``env`` here (a promoted candidate)."""
        self._deployed[(tenant, name, env)] = (version, time.monotonic())

    async def version_policy(self, tenant: str, name: str, version: int) -> tuple[PolicyVersionRecord, Policy]:
        """A stored version (a candidate's), loaded and cached by its immutable number."""
        hit = self._policies.get((tenant, name, version))
        if hit is not None:
            return hit.record, hit.policy
        rec = await self.store.get_policy_version(tenant, name, version)
        return rec, await self._load(tenant, rec)

    def _check_webhook_rules(self, policy: Policy) -> None:
        """Each failed ``custom`` rule writes one outbox row per decision: their number per policy
        is a named cap, so one decision cannot write an unbounded number of webhooks."""
        rules = [r.name for r in policy.rules if r.action is Action.CUSTOM]
        if len(rules) > self.max_webhook_rules:
            raise QuotaExceededError(
                f"policy {policy.name!r} has {len(rules)} rules whose action sends a webhook (custom); at most "
                f"{self.max_webhook_rules} (delivery_limits.max_webhook_rules_per_policy)",
                setting="delivery_limits.max_webhook_rules_per_policy",
            )

    async def get_policy(
        self, tenant: str, name: str, *, environment: str = "", version: int = 0
    ) -> tuple[PolicyVersionRecord, list[DeploymentRecord]]:
        name = inputs.policy_name(name, self.limits.max_name_length)
        if version:
            rec = await self.store.get_policy_version(tenant, name, version)
        else:
            rec = await self._deployed_record(tenant, name, inputs.environment(environment))
        return rec, await self.store.list_deployments(tenant, name)

    async def list_policies(self, tenant: str, environment: str = "") -> list[PolicySummaryRecord]:
        env = inputs.environment(environment) if environment else None
        return await self.store.list_policies(tenant, env, limit=self.limits.max_list_items)

    async def rollback_policy(
        self, tenant: str, name: str, *, environment: str = "", to_version: int = 0
    ) -> tuple[DeploymentRecord, int]:
        name = inputs.policy_name(name, self.limits.max_name_length)
        env = inputs.environment(environment)
        if to_version < 0:
            raise InvalidInputError("to_version must be positive (or 0 for the previous deployment)")
        if to_version:  # the target must still be a valid policy for this tenant
            await self._load(tenant, await self.store.get_policy_version(tenant, name, to_version))
        try:
            dep, previous = await self.store.rollback_policy(tenant, name, env, to_version or None)
        except NotFoundError:
            await self._where_deployed(tenant, name, env)  # not deployed there: say where it is
            raise  # deployed there, but no earlier version (or no such version)
        self._deployed[(tenant, name, env)] = (dep.version, time.monotonic())
        log.info("tenant %s rolled %s back to v%d in %s", tenant, name, dep.version, env)
        return dep, previous

    async def deployed_policy(self, tenant: str, name: str, env: str) -> tuple[PolicyVersionRecord, Policy]:
        """The version deployed in ``env``, loaded. The store is the truth for what is deployed:
        this process trusts what it last read for ``deployment_recheck_s`` (so a deploy or
        rollback on another replica sharing the store applies here within that bound), and its
        parsed policies are cached by immutable version."""
        cached = self._deployed.get((tenant, name, env))
        if cached is not None and time.monotonic() - cached[1] < self.limits.deployment_recheck_s:
            hit = self._policies.get((tenant, name, cached[0]))  # marks it used
            if hit is not None:
                return hit.record, hit.policy
        rec = await self._deployed_record(tenant, name, env)
        policy = await self._load(tenant, rec)
        self._deployed[(tenant, name, env)] = (rec.version, time.monotonic())
        return rec, policy

    async def _deployed_record(self, tenant: str, name: str, env: str) -> PolicyVersionRecord:
        """The version of ``name`` deployed in ``env``; NOT_FOUND names where it is deployed."""
        try:
            return await self.store.get_deployed_policy(tenant, name, env)
        except NotFoundError:
            await self._where_deployed(tenant, name, env)
            raise

    async def _where_deployed(self, tenant: str, name: str, env: str) -> None:
        """Raise NOT_FOUND for ``name`` not deployed in ``env``, listing the environments where
        it is deployed, so a caller who used the default environment learns which one to name.
        Only ``tenant``'s deployments are read: another tenant's policy of the same name stays
        invisible (the answer is the one a policy that exists nowhere gets). Returns when
        ``name`` *is* deployed in ``env`` (the caller's own error then stands)."""
        deployed = [d.environment for d in await self.store.list_deployments(tenant, name)]
        if env in deployed:
            return
        message = f"policy {name!r} is not deployed to {env!r}"
        if not deployed:
            raise NotFoundError(f"{message} (nor to any other environment; crossaudit policy list shows what is)")
        raise NotFoundError(
            f"{message}; it is deployed to: {', '.join(deployed)} (pass --environment {deployed[0]}, "
            f"or environment={deployed[0]!r} to the Client)"
        )

    async def _resolve_uploads(self, tenant: str, policy: Policy) -> None:
        """Check every custom evaluator that references an upload, and load those uploads.

        A custom evaluator's ``id`` must be one of this tenant's uploads; one without id or
        inline code uses the tenant's latest upload of the same name when there is one.
        """
        issues: list[PolicyIssue] = []
        up = self.tenants.uploads(tenant)
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

    async def _prepare(
        self, tenant: str, policy: Policy, *, strict: bool, progress: ProgressCallback | None = None
    ) -> None:
        """Make every custom evaluator of ``policy`` runnable (images built, pools warm): the
        sandbox never builds at call time. ``strict``: raise (deploy); else log (load).
        ``progress`` hears each evaluator's steps as ``<name>: <step>``, the fraction over all.
        The LLM judges' SDKs are imported here too (off the event loop): an SDK's import takes
        seconds, which the first call's deadline would otherwise pay."""
        warming = self._start_model_servers(policy)
        from orchestrator.evaluators.llm import import_sdk

        providers = {spec.typed_config.provider for spec in policy.evaluators if spec.kind is EvaluatorType.LLM}
        for provider in sorted(providers):
            try:
                await import_sdk(provider)
            except Exception as e:  # not installed here: its rules fail, naming it, when called
                log.warning("the %s SDK does not import: %s: %s", provider, type(e).__name__, e)
        if strict:  # a deploy answers once its builtins' servers are ready; a load goes on meanwhile
            await asyncio.gather(*warming)
        if self.sandbox is None:
            return
        runtime = Runtime(self.sandbox, resolver=self.tenants.uploads(tenant), tenant=tenant)
        specs = _custom_specs(policy)
        for n, (_, spec) in enumerate(specs):
            say = None if progress is None else _scoped(progress, spec.name, n, len(specs))
            try:
                bundle = runtime.bundle_for(spec, policy)
                async with asyncio.timeout(self.limits.upload_timeout_s):
                    await self.sandbox.prepare(bundle, say)
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

    def _start_model_servers(self, policy: Policy) -> list[asyncio.Task[None]]:
        """Start the model servers of ``policy``'s builtins and load their models (``prepare``) now,
        so that a rule's timeout bounds its evaluation, never a server's one-time start (tens of
        seconds on a loaded machine; bounded by ``ModelServerLimits.start_timeout_s``). Best effort:
        validation already refused a missing model, and a server that cannot start fails the calls
        of its rules, closed, naming why. A config with ``${NAME}`` is resolved per call (its
        secrets are not expanded here); its server starts on its first call."""
        if self.model_backend is None:
            return []
        from orchestrator.evaluators.builtin import build_builtin

        started = []
        for spec in _builtin_specs(policy):
            if envvars.references(dict(spec.config or {})):
                continue
            try:
                evaluator = build_builtin(spec.name, spec.config, backend=self.model_backend)
            except CrossAuditError as e:  # validated already; its calls report it, typed
                log.warning("builtin evaluator %s of %s does not build: %s", spec.name, policy.name, e.message)
                continue
            task = asyncio.create_task(self._warm_builtin(policy.name, evaluator), name=f"prepare-builtin-{spec.name}")
            self._warming.add(task)
            task.add_done_callback(self._warming.discard)
            started.append(task)
        return started

    async def _warm_builtin(self, policy: str, evaluator: Any) -> None:
        # prepare's deadline is the deploy's bound; the pool bounds the start itself (start_timeout_s)
        try:
            await evaluator.prepare(timeout=self.limits.upload_timeout_s)
        except CrossAuditError as e:
            log.warning("builtin evaluator %s of %s is not ready: %s", evaluator.name, policy, e.message)
        except Exception:  # best effort: its calls report the failure, typed
            log.exception("preparing builtin evaluator %s of %s failed", evaluator.name, policy)

    async def _load(self, tenant: str, rec: PolicyVersionRecord) -> Policy:
        key = (tenant, rec.name, rec.version)
        hit = self._policies.get(key)
        if hit is not None:
            return hit.policy
        policy = await self.parse(tenant, rec.content, f"{rec.name}@{rec.version}")
        await self._resolve_uploads(tenant, policy)
        await self._prepare(tenant, policy, strict=False)
        self._cache(tenant, rec, policy)
        return policy

    def _cache(self, tenant: str, rec: PolicyVersionRecord, policy: Policy) -> None:
        self._policies[(tenant, rec.name, rec.version)] = _Deployed(rec, policy)

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
                        await self.deployed_policy(tenant, summary.name, dep.environment)
                        count += 1
                    except CrossAuditError as e:
                        log.warning(
                            "deployed policy %s (%s) does not load: %s",
                            summary.name,
                            dep.environment,
                            e.message.splitlines()[0],
                        )
        return count


async def _parse(text: str, filename: str, **options: Any) -> Policy:
    """Parse and validate off the event loop: a large policy must not stall other requests."""
    return await asyncio.to_thread(functools.partial(load_policy, text, filename, **options))
