"""``PolicyTester``: evaluate a policy file in-process, with real sandboxed evaluators.

    from crossaudit import PolicyTester
    tester = PolicyTester("policies/demo_offline.yaml")
    result = tester.evaluate(prompt="...", response="...")
    assert result.passed and result.action == "allow"

Custom code runs in a sandbox (``process`` by default: no Docker needed; ``docker`` or
``auto`` on request), builtins in model servers, LLM evaluators through provider SDKs.
Unlike the service, the tester reads the local environment for ``${NAME}`` (``env=`` to
override) and resolves ``code_file`` and ``evaluators/<name>.py`` next to the policy file.
The sync API runs an event loop on a private thread, so it also works inside async code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from packaging.specifiers import SpecifierSet
from pydantic import TypeAdapter, ValidationError

from crossaudit.kernel.depspec import parse_dependency
from crossaudit.kernel.dsl import EvaluatorType, Policy, TestCase
from crossaudit.kernel.errors import (
    CrossAuditError,
    InvalidInputError,
    NotFoundError,
    PolicyIssue,
    PolicyValidationError,
)
from crossaudit.kernel.limits import EngineLimits, PoolLimits, SandboxLimits
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.kernel.results import Decision
from crossaudit.kernel.yamlsafe import format_path
from crossaudit.sdk.cases import CaseResult, judge_case
from orchestrator.engine.engine import Engine
from orchestrator.evaluators import cassette
from orchestrator.policy import load_policy, load_policy_file
from orchestrator.policy.models import model_check, model_problems
from orchestrator.runtime import Runtime, make_sandbox
from sandbox.base import Sandbox

__all__ = ["SANDBOX_ENV", "CaseResult", "PolicyTester", "load_cases_file"]

T = TypeVar("T")
# evaluate_many: requests in flight at once (each still bounded by the engine's limits and the
# policy's deadline): the warm sandboxes one evaluator may have (PoolLimits.max_size).
DEFAULT_CONCURRENCY = PoolLimits().max_size
MAX_CONCURRENCY = 256
# (prompt, response, context) or (prompt, response, context, stage): "" runs every rule
Request = tuple[str, str, "Mapping[str, Any] | None"] | tuple[str, str, "Mapping[str, Any] | None", str]
UNEVALUABLE_MESSAGE_CHARS = 500  # an untyped exception's text kept in its request's error


def unevaluable(e: Exception) -> CrossAuditError:
    """A request that raised ``e``, not a typed error, as its own typed error (INTERNAL)."""
    text = f"could not be evaluated: {type(e).__name__}: {e}"
    if len(text) > UNEVALUABLE_MESSAGE_CHARS:
        text = text[: UNEVALUABLE_MESSAGE_CHARS - 1] + "…"
    return CrossAuditError(text)


SANDBOX_ENV = "CROSSAUDIT_SANDBOX"  # default sandbox of PolicyTester (process) and of the CLI (auto)


class PolicyTester:
    """Evaluate one policy locally. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        policy: str | os.PathLike[str] | Policy,
        *,
        sandbox: str | Sandbox | None = None,
        sandbox_limits: SandboxLimits | None = None,
        engine_limits: EngineLimits | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        prepare: bool = True,
        model_servers: str | None = None,
        progress: ProgressCallback | None = None,
        llm_usage: Callable[[str, str, int, int], None] | None = None,
    ) -> None:
        """``llm_usage(provider, model, prompt_tokens, completion_tokens)`` is told the tokens of
        every LLM call (as the server's metrics are).
        ``model_servers``: subprocess | docker (builtin model servers as hardened containers);
        default $CROSSAUDIT_MODEL_SERVERS, else subprocess. ``progress(message, fraction)`` hears
        the preparation of the custom evaluators here (with the docker sandbox their dependency
        images are built first: minutes the first time), as ``"<evaluator>: <step>"``."""
        # Builtins whose models are not available here (resolved from ``env``, as their calls
        # will be) refuse the policy now, located, rather than failing their rules at each call.
        checks = (model_check(env),)
        if isinstance(policy, Policy):
            self.policy = policy
            problems = model_problems(policy, env)
            if problems:
                raise PolicyValidationError([PolicyIssue(message=m, path=format_path(p)) for p, m in problems])
        elif isinstance(policy, str) and "\n" in policy:
            self.policy = load_policy(policy, env=env, checks=checks)
        else:
            self.policy = load_policy_file(policy, env=env, checks=checks)
        recording = cassette.active()  # recorded LLM answers: a replay refuses another version's up front
        if recording is not None:
            recording.check(self.policy)
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="crossaudit-tester", daemon=True)
        self._thread.start()
        box = (
            sandbox
            if isinstance(sandbox, Sandbox)
            else make_sandbox(sandbox or os.environ.get(SANDBOX_ENV, "process"), sandbox_limits)
        )
        self._owned_sandbox = None if isinstance(sandbox, Sandbox) else box
        from crossaudit.modelserver.pool import ModelServerPool

        self._models = ModelServerPool(isolation=model_servers)  # started lazily: costs nothing unless a builtin runs
        # Local convenience: ${NAME} and the LLM providers' variables come from ``env`` (default:
        # this process's environment), and code_file / evaluators/<name>.py are read from disk.
        self.runtime = Runtime(box, env=env, model_backend=self._models, local_files=True, llm_usage=llm_usage)
        self.engine = Engine(self.runtime, limits=engine_limits)
        self._closed = False
        # Why local results may differ from the server's, per evaluator (see _local_differences).
        self.local_differences: dict[str, str] = self._local_differences()
        self.preparation_errors: dict[str, str] = self.prepare(progress) if prepare else {}

    def prepare(self, progress: ProgressCallback | None = None) -> dict[str, str]:
        """Build images and warm sandboxes for the custom evaluators the rules use, now.

        The Docker backend never builds at call time, so this runs at construction. Returns
        the evaluators that could not be prepared (they fail their rules, closed, when run).
        ``progress`` is called from the tester's own thread.
        """
        return self._run(self._prepare(progress))

    @property
    def _used(self) -> set[str]:
        """Evaluators the enabled rules call (primary or fallback)."""
        rules = [r for r in self.policy.rules if r.enabled]
        return {n for r in rules for n in r.evaluator_names} | {
            r.fallback.evaluator for r in rules if r.fallback and r.fallback.evaluator
        }

    async def _prepare(self, progress: ProgressCallback | None = None) -> dict[str, str]:
        errors: dict[str, str] = {}
        custom = [s for s in self.policy.evaluators if s.name in self._used and s.kind is EvaluatorType.CUSTOM]
        for n, spec in enumerate(custom):
            say = None if progress is None else _scoped(progress, spec.name, n, len(custom))
            try:
                await self.runtime.sandbox.prepare(self.runtime.bundle_for(spec, self.policy), say)
            except CrossAuditError as e:
                errors[spec.name] = e.message
        # Builtins: start their model servers and load the models now, as a deploy does, not inside
        # the first rule's timeout (Presidio's analyzer alone has taken longer than the 15 s default
        # on a busy machine). LLM judges: import their provider's SDK now, for the same reason
        # (anthropic 2.x alone takes seconds). One that cannot fails its rules when run, with its
        # own error.
        for spec in self.policy.evaluators:
            if spec.name in self._used and spec.kind in (EvaluatorType.BUILTIN, EvaluatorType.LLM):
                with contextlib.suppress(Exception):
                    await self.runtime.build(spec, self.policy).prepare()  # type: ignore[attr-defined]
        return errors

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            raise RuntimeError("PolicyTester is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def evaluate(
        self, prompt: str = "", response: str = "", context: Mapping[str, Any] | None = None, *, stage: str = ""
    ) -> Decision:
        """Evaluate one request; returns the Decision (.passed, .action, .rules, .modified_response).
        ``stage`` (input, output, tool_call, tool_result) runs only that stage's rules; "" every rule."""
        return self._run(self.aevaluate(prompt, response, context, stage=stage))

    async def aevaluate(
        self, prompt: str = "", response: str = "", context: Mapping[str, Any] | None = None, *, stage: str = ""
    ) -> Decision:
        coro = self.engine.evaluate(self.policy, prompt, response, context, timeout=self.timeout, stage=stage)
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def evaluate_many(
        self,
        requests: Sequence[Request],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        on_done: Callable[[int, Decision | CrossAuditError], None] | None = None,
    ) -> list[Decision | CrossAuditError]:
        """Evaluate many requests (``(prompt, response, context)``, or with a fourth item, the
        stage to run, as :meth:`evaluate`'s ``stage``), at most ``concurrency`` at once (as a
        server's concurrent callers would: builtins batch across them). Each answer is its
        Decision or its typed error, in the order of ``requests``; ``on_done(index, answer)``
        hears each as it finishes (from the tester's thread). A request the engine cannot take at
        all (a context too deep to copy, an engine fault) is answered with a CrossAuditError
        naming the exception: the others still run."""
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise InvalidInputError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
        return self._run(self._evaluate_many(requests, concurrency, on_done))

    async def _evaluate_many(
        self,
        requests: Sequence[Request],
        concurrency: int,
        on_done: Callable[[int, Decision | CrossAuditError], None] | None,
    ) -> list[Decision | CrossAuditError]:
        out: list[Decision | CrossAuditError | None] = [None] * len(requests)
        pending = iter(range(len(requests)))

        async def worker() -> None:
            for i in pending:  # shared iterator: each index is taken by exactly one worker
                prompt, response, context, *staged = requests[i]
                try:
                    answer: Decision | CrossAuditError = await self.engine.evaluate(
                        self.policy, prompt, response, context, timeout=self.timeout, stage=staged[0] if staged else ""
                    )
                except CrossAuditError as e:
                    answer = e
                except Exception as e:  # one request the engine cannot take is that request's error
                    answer = unevaluable(e)
                out[i] = answer
                if on_done is not None:
                    on_done(i, answer)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
        return [a for a in out if a is not None]

    def run_cases(self, cases: list[TestCase] | None = None) -> list[CaseResult]:
        """Run the policy's ``test_cases`` (or ``cases``), one CaseResult each (judged by
        :func:`crossaudit.sdk.cases.judge_case`: an errored rule is an ERROR, not a pass)."""
        out = []
        for case in self.policy.test_cases if cases is None else cases:
            t0 = time.monotonic()
            try:
                d = self.evaluate(
                    case.input.prompt, case.input.response, case.input.context, stage=case.input.stage or ""
                )
            except Exception as e:  # a case that cannot run is an errored case, reported as such
                out.append(judge_case(case, None, str(e), duration_s=time.monotonic() - t0))
                continue
            out.append(judge_case(case, d, duration_s=time.monotonic() - t0, notes=self.local_differences))
        return out

    def repeat_cases(self, cases: list[TestCase] | None = None, repeat: int = 1) -> list[list[CaseResult]]:
        """:meth:`run_cases` ``repeat`` times, one list per run. The result cache is emptied
        between runs, so a non-deterministic (LLM) judge is asked anew each time."""
        runs: list[list[CaseResult]] = []
        for n in range(max(1, repeat)):
            if n:
                self.engine.cache.clear()
            runs.append(self.run_cases(cases))
        return runs

    @property
    def sandbox_name(self) -> str:
        """Where custom code runs here: ``docker`` or ``process``."""
        return self.runtime.sandbox.name

    def _local_differences(self) -> dict[str, str]:
        """Evaluator name → why its rules may answer differently here than on the server.

        The server runs custom code in Docker (where a daemon answers), which installs declared
        dependencies; the process sandbox cannot, so a dependency missing from this interpreter
        fails there. An evaluator whose code only a server has (an uploaded one) cannot run here."""
        notes: dict[str, str] = {}
        for spec in self.policy.evaluators:
            if spec.name not in self._used or spec.kind is not EvaluatorType.CUSTOM:
                continue
            try:
                bundle = self.runtime.bundle_for(spec, self.policy)
            except NotFoundError:
                ref = f"uploaded evaluator {spec.id!r}" if spec.id else "an uploaded evaluator"
                notes[spec.name] = f"evaluator {spec.name!r} runs {ref}, which only a server has (use --server)"
                continue
            except CrossAuditError:
                continue  # an unreadable code_file: its own error says so
            if self.sandbox_name == "docker":
                continue
            for raw in bundle.dependencies:
                why = _missing_here(raw)
                if why:
                    notes[spec.name] = (
                        f"evaluator {spec.name!r}: dependency {raw!r} needs the docker sandbox ({why}; "
                        "the process sandbox cannot install packages)"
                    )
                    break
        return notes

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._aclose())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _aclose(self) -> None:
        await self.engine.aclose()
        await self._models.aclose()
        if self._owned_sandbox is not None:
            await self._owned_sandbox.aclose()

    def __enter__(self) -> PolicyTester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scoped(progress: ProgressCallback, name: str, index: int, count: int) -> ProgressCallback:
    """One evaluator's progress as part of the whole preparation's."""
    return lambda message, fraction: progress(f"{name}: {message}", (index + fraction) / count)


def load_cases_file(path: str | os.PathLike[str]) -> list[TestCase]:
    """Test cases from JSON: a list of cases, or ``{"test_cases": [...]}`` (the policy's shape)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    if isinstance(data, dict):
        data = data.get("test_cases", data.get("cases"))
    if not isinstance(data, list):
        raise InvalidInputError(f'{path}: expected a list of test cases or {{"test_cases": [...]}}')
    try:
        return TypeAdapter(list[TestCase]).validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise InvalidInputError(f"{path}: test_cases{loc}: {first['msg']} ({e.error_count()} error(s))") from None


def _missing_here(requirement: str) -> str | None:
    """Why this interpreter (which the process sandbox runs) lacks ``requirement``; None if it has it."""
    try:
        dep = parse_dependency(requirement)
    except CrossAuditError as e:
        return e.message
    try:
        version = metadata.version(dep.name)
    except metadata.PackageNotFoundError:
        return f"{dep.name} is not installed here"
    if dep.specifier and not SpecifierSet(dep.specifier).contains(version, prereleases=True):
        return f"{dep.name} {version} is installed here"
    return None
