"""Custom evaluators: user code run by a Sandbox backend, never in this process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from crossaudit.kernel import tracing
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.results import Verdict
from orchestrator.evaluators.base import Called, EvaluationInput, Evaluator, mask_verdict
from orchestrator.policy import envvars
from orchestrator.secrets import SecretSource, SecretUse, as_secret_source
from sandbox.base import CodeBundle, Sandbox

PARAMETERS_KEY = "evaluator_config"  # context key under which a policy's extra config keys reach the code


class CustomEvaluator(Evaluator):
    """``parameters`` (the policy's extra config keys) keep their ``${NAME}`` references: they are
    expanded from ``secrets`` at each call, so the code receives a secret only where the policy
    placed it and a rotated secret applies to the next call. Whatever the call returns or raises
    has those values masked before it leaves here."""

    kind: ClassVar[str] = "custom"

    def __init__(
        self,
        name: str,
        bundle: CodeBundle,
        sandbox: Sandbox,
        parameters: Mapping[str, Any] | None = None,
        *,
        secrets: SecretSource | Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(name)
        self.bundle = bundle
        self.sandbox = sandbox
        self.parameters = dict(parameters or {})
        self.secrets = as_secret_source(secrets)
        self._provenance: dict[str, str] | None = None

    def identity(self) -> str:
        return f"custom:{self.name}:{self.bundle.digest}"

    def provenance(self) -> dict[str, str]:
        """``code_sha256``: sha256 of the code text (UTF-8); ``bundle_sha256``: the bundle's content
        address (code, declared dependencies, language, entrypoint); ``backend``. What ran each
        call (image id, dependency lock and SBOM digests) comes with the call (:meth:`call`)."""
        if self._provenance is None:  # the bundle is immutable: hashed once, not at every call
            self._provenance = {
                "kind": self.kind,
                "code_sha256": sha256_text(self.bundle.code),
                "bundle_sha256": self.bundle.digest,
                "backend": self.sandbox.name,
            }
        return dict(self._provenance)

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        return (await self.call(inp, timeout=timeout)).verdict

    async def call(self, inp: EvaluationInput, *, timeout: float) -> Called:
        """The verdict and what the sandbox reports, on the host, about what ran it
        (:attr:`sandbox.base.RunDiagnostics.provenance`): never anything the code returned."""
        use = SecretUse()
        context: dict[str, Any] = dict(inp.context)
        if self.parameters:
            context[PARAMETERS_KEY] = envvars.expand(
                self.parameters, self.secrets, use, where=f"evaluator {self.name!r} config"
            )
        sp = None
        if tracing.enabled():
            sp = tracing.start_span(
                tracing.SANDBOX,
                {
                    "crossaudit.sandbox.backend": self.sandbox.name,
                    "crossaudit.evaluator.bundle_sha256": self.bundle.digest,
                },
            )
            token = tracing.use(sp)
        try:
            verdict, diagnostics = await self.sandbox.run(
                self.bundle, inp.prompt, inp.response, context, timeout=timeout
            )
            if sp is not None:
                sp.set_attribute("crossaudit.sandbox.wall_ms", float(diagnostics.wall_ms))
        except Exception as exc:  # its message and attached diagnostics (captured output) are masked
            if sp is not None:
                tracing.failed(sp, exc)
            raise use.mask_error(exc) from None
        finally:
            if sp is not None:
                tracing.release(token)
                sp.end()
        return Called(mask_verdict(verdict, use), dict(diagnostics.provenance))
