"""The runtime: builds Evaluators for policy specs and owns the runners behind them.

It is the one place that knows which runner serves which kind: custom code → the
configured Sandbox (docker or process), builtins → model servers, llm → provider SDKs.
The policy layer and the engine only see the Evaluator interface.

Two trust settings, both safe by default for the service:

- ``secrets``: where ``${NAME}`` and the LLM providers' standard variables come from, read by
  the evaluators at call time (default: ``env``, i.e. the local environment, for PolicyTester);
  the service passes the tenant's grants (:class:`~orchestrator.secrets.TenantSecrets`).
- ``local_files``: only the local PolicyTester reads ``code_file`` and ``evaluators/<name>.py``
  next to the policy file. The service never reads a file that a policy names (its clients
  inline those files before deploying).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from crossaudit.kernel.dsl import CustomConfig, EvaluatorSpec, EvaluatorType, Policy
from crossaudit.kernel.errors import ConfigurationError, EvaluatorCodeError, NotFoundError
from crossaudit.kernel.limits import DependencyLimits, EngineLimits, PoolLimits, SandboxLimits
from orchestrator.evaluators.base import Evaluator
from orchestrator.evaluators.custom import CustomEvaluator
from orchestrator.policy.inline import LOCAL_EVALUATOR_DIR
from orchestrator.secrets import HostAllowlist, SecretSource, as_secret_source
from sandbox.base import CodeBundle, Sandbox

if TYPE_CHECKING:
    from orchestrator.evaluators.llm import UsageSink


@dataclass(frozen=True)
class StoredEvaluator:
    """An uploaded evaluator as the runtime needs it."""

    id: str
    name: str
    code: str
    dependencies: tuple[str, ...] = ()


class EvaluatorResolver(Protocol):
    """Where uploaded evaluators live (the service's store implements it)."""

    def by_id(self, evaluator_id: str) -> StoredEvaluator | None: ...

    def by_name(self, name: str) -> StoredEvaluator | None: ...


class Runtime:
    """An EvaluatorFactory over real runners.

    The runners (sandbox, model servers) are shared, e.g. by every tenant of the service, so
    the Runtime never closes them: whoever created them does.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        resolver: EvaluatorResolver | None = None,
        model_backend: Any = None,
        env: Mapping[str, str] | None = None,
        tenant: str = "",
        secrets: SecretSource | None = None,
        llm_hosts: HostAllowlist | None = None,
        local_files: bool = False,
        llm_usage: UsageSink | None = None,
        llm_response_bytes: int | None = None,
    ) -> None:
        """``env``: the process environment for operator settings (model paths) and, without
        ``secrets``, the secret source too. ``llm_hosts``: None = any LLM endpoint.
        ``llm_usage``: told the tokens of each LLM call (the service's metrics).
        ``llm_response_bytes``: each LLM answer's byte cap (None: the EngineLimits default)."""
        self.sandbox = sandbox
        self.tenant = tenant
        self.resolver = resolver
        self.model_backend = model_backend
        self.env = env if env is not None else os.environ
        self.secrets = secrets if secrets is not None else as_secret_source(env)
        self.llm_hosts = llm_hosts
        self.local_files = local_files
        self.llm_usage = llm_usage
        self.llm_response_bytes = llm_response_bytes or EngineLimits.max_llm_response_bytes

    def build(self, spec: EvaluatorSpec, policy: Policy) -> Evaluator:
        kind = spec.kind
        if kind is EvaluatorType.CUSTOM:
            return self._custom(spec, policy)
        if kind is EvaluatorType.BUILTIN:
            from orchestrator.evaluators.builtin import build_builtin

            return build_builtin(
                spec.name, spec.config, backend=self.model_backend, environ=self.env, secrets=self.secrets
            )
        from orchestrator.evaluators.llm import LLMEvaluator

        # ${NAME} is expanded by each evaluator at call time, so a missing secret fails only the
        # rules that need it (naming it), and a rotated one applies to the next call.
        return LLMEvaluator(
            spec.name,
            spec.typed_config,
            secrets=self.secrets,
            hosts=self.llm_hosts,
            usage=self.llm_usage,
            max_response_bytes=self.llm_response_bytes,
            policy=(policy.name, policy.version),
        )

    def bundle_for(self, spec: EvaluatorSpec, policy: Policy) -> CodeBundle:
        """The code and dependencies of a custom evaluator, from the first source that has it:
        the uploaded evaluator ``id``, ``config.code``, then (``local_files`` only) ``code_file``
        and ``evaluators/<name>.py`` next to the policy file, then an upload of the same name.
        The local file beats an upload because the author sees it; the CLI and Client inline
        with the same precedence, so a policy means the same locally and on the service."""
        cfg = spec.typed_config
        assert isinstance(cfg, CustomConfig)
        deps = tuple(cfg.dependencies)
        if spec.id:
            stored = self.resolver.by_id(spec.id) if self.resolver else None
            if stored is None:
                raise NotFoundError(f"evaluator {spec.name!r}: no uploaded evaluator with id {spec.id!r}")
            return CodeBundle(
                code=stored.code,
                dependencies=tuple(dict.fromkeys((*stored.dependencies, *deps))),
                tenant=self.tenant,
            )
        if cfg.code is not None:
            return CodeBundle(code=cfg.code, dependencies=deps, tenant=self.tenant)
        base = Path(policy.source_path).parent if policy.source_path and self.local_files else None
        if cfg.code_file is not None:
            if not self.local_files:
                raise ConfigurationError(
                    f"evaluator {spec.name!r}: code_file is read only by the local PolicyTester; "
                    "deploy with the crossaudit CLI or Client, which inline it"
                )
            if base is None:
                raise ConfigurationError(f"evaluator {spec.name!r}: code_file needs a policy loaded from a file")
            return CodeBundle(
                code=_read_code(base / cfg.code_file, spec.name), dependencies=deps, tenant=self.tenant
            )
        if base is not None and (base / LOCAL_EVALUATOR_DIR / f"{spec.name}.py").is_file():
            return CodeBundle(
                code=_read_code(base / LOCAL_EVALUATOR_DIR / f"{spec.name}.py", spec.name),
                dependencies=deps,
                tenant=self.tenant,
            )
        stored = self.resolver.by_name(spec.name) if self.resolver else None
        if stored is not None:
            return CodeBundle(
                code=stored.code,
                dependencies=tuple(dict.fromkeys((*stored.dependencies, *deps))),
                tenant=self.tenant,
            )
        raise NotFoundError(
            f"evaluator {spec.name!r} has no code: give config.code, config.code_file or an id, "
            f"or upload an evaluator named {spec.name!r}"
        )

    def _custom(self, spec: EvaluatorSpec, policy: Policy) -> Evaluator:
        cfg = spec.typed_config
        assert isinstance(cfg, CustomConfig)
        bundle = self.bundle_for(spec, policy)
        return CustomEvaluator(spec.name, bundle, self.sandbox, cfg.parameters, secrets=self.secrets)


def _read_code(path: Path, name: str) -> str:
    try:
        code = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigurationError(f"evaluator {name!r}: cannot read {path.name}: {e.strerror}") from None
    from orchestrator.policy.validate import check_evaluator_code

    problem = check_evaluator_code(code)
    if problem:
        raise EvaluatorCodeError(f"evaluator {name!r} ({path.name}): {problem}")
    return code


def make_sandbox(
    kind: str = "auto",
    limits: SandboxLimits | None = None,
    *,
    pool_limits: PoolLimits | None = None,
    dep_limits: DependencyLimits | None = None,
    **options: Any,
) -> Sandbox:
    """``docker``, ``process`` or ``auto`` (docker where a daemon answers, else process).
    ``options`` are the docker backend's own (cache_dir, base_image, ...)."""
    if kind not in {"auto", "docker", "process"}:
        raise ConfigurationError(f"unknown sandbox {kind!r}: use docker, process or auto")
    if kind in {"auto", "docker"}:
        from sandbox.docker.backend import DockerSandbox

        if DockerSandbox.available():
            return DockerSandbox(limits=limits, pool_limits=pool_limits, dep_limits=dep_limits, **options)
        if kind == "docker":
            raise ConfigurationError("--sandbox docker: no Docker daemon answers (is it running? DOCKER_HOST?)")
    from sandbox.process.backend import ProcessSandbox

    return ProcessSandbox(limits=limits, pool_limits=pool_limits)
