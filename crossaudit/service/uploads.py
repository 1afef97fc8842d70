"""Evaluator uploads: validated without running anything, prepared by the sandbox (images built)
before they are stored, so a stored evaluator is one that can run."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from crossaudit.api.records import EvaluatorRecord
from crossaudit.kernel.codecheck import check_code
from crossaudit.kernel.depspec import validate_dependencies
from crossaudit.kernel.errors import DeadlineExceededError, EvaluatorCodeError, InvalidInputError, RateLimitedError
from crossaudit.kernel.limits import DependencyLimits, SandboxLimits
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.service import inputs
from crossaudit.service.config import ServiceLimits
from crossaudit.service.metrics import ServiceMetrics
from crossaudit.service.shared import Slots
from crossaudit.store.base import Store
from sandbox.base import CodeBundle, Sandbox

log = logging.getLogger("crossaudit.service")


class Uploads:
    def __init__(
        self,
        store: Store,
        *,
        sandbox: Sandbox | None,
        limits: ServiceLimits,
        sandbox_limits: SandboxLimits,
        dependency_limits: DependencyLimits,
        metrics: ServiceMetrics,
        data_dir: Path | None = None,
    ) -> None:
        self.store = store
        self.sandbox = sandbox
        self.limits = limits
        self.sandbox_limits = sandbox_limits
        self.dependency_limits = dependency_limits
        self.metrics = metrics
        # image builds are the machine's: one server's, whichever worker runs them (data_dir None: this process's)
        self._uploading = Slots(data_dir, "uploads")

    def check_upload(self, name: str, code: str, language: str, dependencies: list[str]) -> tuple[str, ...]:
        """Validate an upload without running anything; returns the dependencies to store."""
        if not inputs.NAME.fullmatch(name or ""):  # match() let "name\n" through
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
        check_code(code)
        return tuple(str(d) for d in validate_dependencies(dependencies, self.dependency_limits))

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
        cap = self.limits.max_concurrent_uploads_per_tenant
        with self._uploading.hold(tenant, cap) as held:
            if not held:
                raise RateLimitedError(
                    f"this tenant already has {cap} upload(s) being prepared "
                    f"(limits.max_concurrent_uploads_per_tenant {cap}); retry later"
                )
            try:
                if self.sandbox is not None:
                    async with asyncio.timeout(self.limits.upload_timeout_s):
                        await self.sandbox.prepare(bundle, progress)
            except TimeoutError:
                raise DeadlineExceededError(
                    f"preparing the evaluator took longer than {self.limits.upload_timeout_s:.0f}s"
                ) from None
        rec, created = await self.store.put_evaluator(
            tenant,
            name=name,
            code=code,
            language=bundle.language,
            dependencies=deps,
            digest=bundle.digest,
            description=description[: self.limits.max_feedback_comment_bytes],
            max_versions=self.limits.max_evaluators_per_tenant,
            max_code_bytes=self.limits.max_evaluator_code_bytes_per_tenant,
        )
        self.metrics.uploads.labels(str(created).lower()).inc()
        log.info("tenant %s uploaded evaluator %s v%d (%s)", tenant, name, rec.version, rec.id)
        return rec, created

    async def get_evaluator(
        self, tenant: str, *, evaluator_id: str = "", name: str = "", version: int = 0
    ) -> EvaluatorRecord:
        if evaluator_id:
            return await self.store.get_evaluator(tenant, evaluator_id)
        if name:
            return await self.store.get_evaluator_by_name(tenant, name, version or None)
        raise InvalidInputError("give an evaluator id or a name")

    async def list_evaluators(self, tenant: str, name: str = "") -> list[EvaluatorRecord]:
        return (await self.store.list_evaluators(tenant, name or None))[: self.limits.max_list_items]
