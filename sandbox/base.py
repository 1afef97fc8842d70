"""The sandbox interface: where custom evaluator code runs, never in the caller's process.

Two backends implement it: ``docker`` (default where a daemon answers) and ``process``
(subprocess + RestrictedPython + rlimits: the embedded fallback, weaker isolation).
Both speak the same agent protocol (``sandbox/agent``) and validate results with
``sandbox.protocol.parse_result``.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from crossaudit.kernel.limits import SandboxLimits
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.kernel.results import Verdict
from sandbox.protocol import error_from_frame, parse_result


@dataclass(frozen=True)
class CodeBundle:
    """Evaluator code plus its declared dependencies; content-addressed by ``digest``.

    ``tenant`` is who the code runs for. It is not part of ``digest`` (identical code shares
    images and build caches) but it is part of ``pool_key``: a warm sandbox serves one tenant
    and one evaluator version, never more (docs/threat-model.md).
    """

    code: str
    dependencies: tuple[str, ...] = ()
    language: str = "python"
    entrypoint: str = "evaluate"
    tenant: str = ""

    @property
    def digest(self) -> str:
        doc = json.dumps(
            {"code": self.code, "deps": sorted(self.dependencies), "lang": self.language, "entry": self.entrypoint},
            sort_keys=True,
        )
        return hashlib.sha256(doc.encode()).hexdigest()

    @property
    def pool_key(self) -> str:
        """Identity of a warm pool: this code, for this tenant only."""
        return hashlib.sha256(f"{self.tenant}\0{self.digest}".encode()).hexdigest()


@dataclass
class RunDiagnostics:
    """What the sandbox saw besides the result: captured (capped) output and timing."""

    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    wall_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # What ran the call (docs/provenance.md), set by the backend on the host, never from the agent's
    # answer: ``backend``, ``image_id`` and, for an image with declared dependencies,
    # ``dependencies_sha256`` and ``sbom_sha256``.
    provenance: dict[str, str] = field(default_factory=dict)


class Sandbox(abc.ABC):
    """Runs a :class:`CodeBundle`'s ``evaluate`` in isolation and returns a validated Verdict."""

    name: ClassVar[str]
    isolation: ClassVar[str]  # one line for users: what this backend does and does not isolate

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        # Tenants' CPU weights (the API-keys file's ``share:``; unlisted = 1), for the backends
        # that split CPU by tenant (sandbox.cpugroups). The server sets it.
        self.tenant_shares: Mapping[str, float] = {}

    async def prepare(self, bundle: CodeBundle, progress: ProgressCallback | None = None) -> None:  # noqa: B027
        """Make the bundle runnable (validate deps, build images, warm pools). Idempotent."""

    async def run(
        self,
        bundle: CodeBundle,
        prompt: str,
        response: str,
        context: Mapping[str, Any],
        *,
        timeout: float,
    ) -> tuple[Verdict, RunDiagnostics]:
        """Run one call under ``self.limits`` and ``timeout`` (wall clock, enforced from outside).

        Raises a SandboxError subclass or EvaluatorTimeoutError; never returns partial data. The
        backend gets the agent's answer frame (:meth:`_call`); turning it into a validated Verdict,
        or into the typed error carrying the call's diagnostics, is the same for every backend.
        """
        frame, diag = await self._call(bundle, prompt, response, context, timeout)
        if not frame.get("ok"):
            error = error_from_frame(frame)
            with contextlib.suppress(AttributeError):
                error.diagnostics = diag  # type: ignore[attr-defined]
            raise error
        return parse_result(frame.get("result"), self.limits), diag

    @abc.abstractmethod
    async def _call(
        self, bundle: CodeBundle, prompt: str, response: str, context: Mapping[str, Any], timeout: float
    ) -> tuple[dict[str, Any], RunDiagnostics]:
        """One call's answer frame (``ok`` and ``result`` or ``error``) and diagnostics; raises when
        there is no answer (deadline, crash, no free sandbox, unserialisable input)."""

    def info(self) -> dict[str, Any]:
        return {"backend": self.name, "isolation": self.isolation}

    async def aclose(self) -> None:  # noqa: B027
        """Stop warm sandboxes and remove everything this backend started."""
