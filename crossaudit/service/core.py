"""The service's behaviour, independent of gRPC, composed from one component per job:

- :mod:`~crossaudit.service.tenants`: each tenant's engine, uploaded evaluators and feedback;
- :mod:`~crossaudit.service.catalog`: policies (validate, deploy, roll back, the loaded versions);
- :mod:`~crossaudit.service.admission`: evaluations (concurrency, deadlines, audit before answer);
- :mod:`~crossaudit.governance.rollout`: shadow and canary candidates (promote, discard, report);
- :mod:`~crossaudit.governance.records`: audit log, review queue, feedback;
- :mod:`~crossaudit.service.uploads`: evaluator uploads;
- :mod:`~crossaudit.outbox`: webhooks and the decision log (delivered from the outbox);
- :mod:`~crossaudit.governance.retention`: retained inputs (sealed, purged, erased; read by replay);
- :mod:`~crossaudit.governance.replay`: replaying recorded decisions under a candidate policy;
- :mod:`~crossaudit.governance.labels`: labels from production (reviews, feedback) for evals and calibration.

Servicers (``servicers.py``) only convert messages and map errors, calling this one object;
everything works on plain models and the :class:`~crossaudit.store.Store`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossaudit.governance.evidence import EvidenceLog
from crossaudit.governance.labels import Labels
from crossaudit.governance.records import Records
from crossaudit.governance.replay import Replays
from crossaudit.governance.retention import Retention
from crossaudit.governance.rollout import Rollout
from crossaudit.kernel.limits import DependencyLimits, SandboxLimits
from crossaudit.modelserver.pool import ModelBackend
from crossaudit.outbox.deliveries import Deliveries, DeliveryConfig
from crossaudit.service.admission import Admission
from crossaudit.service.catalog import PolicyCatalog
from crossaudit.service.config import RetentionConfig, RolloutLimits, ServiceLimits
from crossaudit.service.grants import TenantGrants
from crossaudit.service.metrics import ServiceMetrics
from crossaudit.service.tenants import EngineProvider, Tenants
from crossaudit.service.uploads import Uploads
from crossaudit.store.base import Store
from sandbox.base import Sandbox


class CrossAuditService:
    # Long: the whole composition in one place, one assignment per component and one alias per API
    # method; split, a reader would have to assemble it again.
    def __init__(
        self,
        store: Store,
        engines: EngineProvider,
        *,
        sandbox: Sandbox | None = None,
        model_backend: ModelBackend | None = None,
        limits: ServiceLimits | None = None,
        sandbox_limits: SandboxLimits | None = None,
        dependency_limits: DependencyLimits | None = None,
        metrics: ServiceMetrics | None = None,
        audit_raw_text: bool = False,
        grants: TenantGrants | None = None,
        delivery: DeliveryConfig | None = None,
        retention: RetentionConfig | None = None,
        rollout_limits: RolloutLimits | None = None,
        evidence: EvidenceLog | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.store = store
        # The signed decision logs (None: decisions still get their leaves, nothing signs them).
        self.evidence = evidence
        self.sandbox = sandbox
        self.limits = limits or ServiceLimits()
        self.metrics = metrics or ServiceMetrics()
        # What each tenant's ${NAME} and LLM endpoints may reach; default: nothing but the
        # providers' default endpoints (the service passes the API-keys file's grants).
        self.grants = grants if grants is not None else TenantGrants()
        if sandbox is not None:
            sandbox.tenant_shares = self.grants.shares  # CPU weights of the tenants' groups
        self.tenants = Tenants(store, engines)
        self.metrics.watch_caches(self.tenants.cache_stats)
        delivery_limits = (delivery or DeliveryConfig()).limits
        self.catalog = PolicyCatalog(
            store,
            self.tenants,
            sandbox=sandbox,
            model_backend=model_backend,
            limits=self.limits,
            grants=self.grants,
            max_webhook_rules=delivery_limits.max_webhook_rules_per_policy,
        )
        self.uploads = Uploads(
            store,
            sandbox=sandbox,
            limits=self.limits,
            sandbox_limits=sandbox_limits or (sandbox.limits if sandbox else SandboxLimits()),
            dependency_limits=dependency_limits or DependencyLimits(),
            metrics=self.metrics,
            data_dir=data_dir,  # concurrent uploads and replays are counted for every worker of the server
        )
        self.records = Records(store, self.tenants, limits=self.limits)
        self.deliveries = Deliveries(store, self.grants, delivery, registry=self.metrics.registry)
        self.retention = Retention(store, self.grants, retention)
        self.rollout = Rollout(
            store,
            self.tenants,
            self.catalog,
            grants=self.grants,
            limits=self.limits,
            rollout=rollout_limits or RolloutLimits(),
            delivery=delivery_limits,
            metrics=self.metrics,
        )
        self.admission = Admission(
            store,
            self.tenants,
            self.catalog,
            limits=self.limits,
            metrics=self.metrics,
            audit_raw_text=audit_raw_text,
            deliveries=self.deliveries,
            shares=self.grants.shares,
            retention=self.retention,
            rollout=self.rollout,
            evidence=evidence,
        )
        self.labels = Labels(store, self.retention, limits=self.limits)
        self.replays = Replays(
            store,
            self.tenants,
            self.catalog,
            self.retention,
            limits=self.limits,
            prices=self.metrics.prices,
            data_dir=data_dir,
        )

        # The API the servicers call; each method belongs to one component.
        self.validate_policy = self.catalog.validate_policy
        self.get_policy = self.catalog.get_policy
        self.list_policies = self.catalog.list_policies
        self.deploy_candidate = self.rollout.deploy_candidate
        self.promote_policy = self.rollout.promote
        self.discard_candidate = self.rollout.discard
        self.shadow_report = self.rollout.report
        self.bootstrap = self.catalog.bootstrap
        self.warm = self.catalog.warm
        self.budget = self.admission.budget
        self.evaluate = self.admission.evaluate
        self.check_upload = self.uploads.check_upload
        self.upload_evaluator = self.uploads.upload_evaluator
        self.get_evaluator = self.uploads.get_evaluator
        self.list_evaluators = self.uploads.list_evaluators
        self.get_decision = self.records.get_decision
        self.list_decisions = self.records.list_decisions
        self.submit_feedback = self.records.submit_feedback
        self.list_reviews = self.records.list_reviews
        self.resolve_review = self.records.resolve_review
        self.list_deliveries = self.deliveries.list_deliveries
        self.redeliver = self.deliveries.redeliver
        self.erase_inputs = self.retention.erase
        self.replay = self.replays.replay
        self.list_labels = self.labels.page

    def evidence_log(self) -> EvidenceLog:
        """The signed decision logs; a service built without one (an embedding that signs nothing)
        reads its logs unsigned."""
        if self.evidence is None:
            self.evidence = EvidenceLog(self.store, key=None)
        return self.evidence

    async def deploy_policy(self, tenant: str, content: str, **options: Any) -> Any:
        """:meth:`PolicyCatalog.deploy_policy`; a running candidate there ends with it (superseded)."""
        version, deployment, created = await self.catalog.deploy_policy(tenant, content, **options)
        self.rollout.forget(tenant, version.name, deployment.environment)
        return version, deployment, created

    async def rollback_policy(self, tenant: str, name: str, **options: Any) -> Any:
        """:meth:`PolicyCatalog.rollback_policy`; a running candidate there ends with it (superseded)."""
        deployment, previous = await self.catalog.rollback_policy(tenant, name, **options)
        self.rollout.forget(tenant, deployment.name, deployment.environment)
        return deployment, previous

    def start(self) -> None:
        """Start the background work (webhook and decision-log delivery, the retained inputs'
        purge); needs a running loop."""
        self.deliveries.start()
        self.retention.start()
        self.rollout.start()
        if self.evidence is not None:
            self.evidence.start()

    async def aclose(self) -> None:
        await self.rollout.aclose()
        if self.evidence is not None:
            await self.evidence.aclose()
        await self.retention.aclose()
        await self.deliveries.aclose()
        await self.tenants.aclose()
