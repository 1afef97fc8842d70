"""The process sandbox: the embedded fallback for machines without Docker (weaker isolation).

Each bundle gets warm agents (package ``sandbox/agent`` via ``python -I .../launch.py``) in their own
session, a fresh temp dir and a minimal environment. The agent compiles the code with
RestrictedPython, imports the declared modules once and keeps a single-use child forked
ahead of demand; that child applies rlimits, drops root to an unprivileged uid and runs in
a network namespace of its own when the kernel allows. The wall-clock deadline is enforced
here, from outside: on timeout the agent's whole process tree is SIGKILLed and a replacement
is started off the request path. After every answer the agent resets itself (kills its
descendants, empties its temp dir) and reports it; only then is it handed to the next caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from crossaudit.kernel.canonical import file_sha256
from crossaudit.kernel.codecheck import check_code
from crossaudit.kernel.errors import (
    CrossAuditError,
    EvaluatorTimeoutError,
    EvaluatorUnavailableError,
    InvalidInputError,
    PoolExhaustedError,
    SandboxCrashedError,
)
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from crossaudit.kernel.lru import EvictingLRU
from crossaudit.kernel.progress import ProgressCallback
from sandbox.base import CodeBundle, RunDiagnostics, Sandbox
from sandbox.cpugroups import TenantCpuGroups
from sandbox.pool import WarmPool
from sandbox.procfs import kill_tree, pid_exists
from sandbox.protocol import AgentChannel, ProtocolError, error_from_frame

AGENT_PATH = Path(__file__).resolve().parent.parent / "agent" / "launch.py"  # runs the agent package as __main__
SANDBOX_UID = 65534  # the agent drops call children to this uid when it runs as root
DEFAULT_MAX_BUNDLES = 16  # warm bundles kept (LRU); each holds up to PoolLimits.max_size agents
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                     "NUMEXPR_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
SETTLE_SLACK_S = 5.0  # beyond SandboxLimits.cleanup_s for the agent's reset frame (it forks its next child first)

# pip distribution name -> import name, where they differ (the rest: lowercase, '-' -> '_').
_IMPORT_NAMES = {
    "scikit-learn": "sklearn",
    "beautifulsoup4": "bs4",
    "pyyaml": "yaml",
    "python-dateutil": "dateutil",
    "pillow": "PIL",
    "google-re2": "re2",
    "opencv-python": "cv2",
}
_DEP_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def import_names(dependencies: tuple[str, ...] | list[str]) -> list[str]:
    """Best-effort import names of declared pip dependencies (for preloading and the import guard)."""
    out: list[str] = []
    for dep in dependencies:
        m = _DEP_NAME.match(dep)
        if not m:
            continue
        dist = m.group(1).lower().replace("_", "-")
        name = _IMPORT_NAMES.get(dist, dist.replace("-", "_").replace(".", "_"))
        if name not in out:
            out.append(name)
    return out


WORKDIR_PREFIX = "crossaudit-proc-"


def interpreter_identity(python: str) -> str:
    """The process backend's ``image_id`` (docs/provenance.md): ``process:<interpreter file name>@sha256:<hex>``,
    the digest of the interpreter executable the agents run (symlinks resolved). It names the
    interpreter, not the libraries it loads: the process backend shares the host's installation."""
    real = Path(shutil.which(python) or python).resolve()
    return f"process:{real.name}@sha256:{file_sha256(real)}"


def reap_stale_workdirs() -> int:
    """Remove agent temp dirs left by orchestrators that died (their pid is in the name)."""
    removed = 0
    root = Path(tempfile.gettempdir())
    for path in list(root.glob(f"{WORKDIR_PREFIX}*-*"))[:10_000]:
        pid_text = path.name[len(WORKDIR_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or pid_exists(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


# --------------------------------------------------------------------------- one warm agent


class _Agent:
    """One agent subprocess: exclusively held by one call at a time (the pool guarantees it)."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        workdir: str,
        channel: AgentChannel,
        *,
        settle_timeout_s: float,
        registry: set[_Agent],
    ) -> None:
        self.proc = proc
        self.workdir = workdir
        self.channel = channel
        self.loaded: dict[str, Any] = {}
        self.dead = False
        self.idle_since = time.monotonic()
        self.reset_pending = False  # a call was answered: the agent's reset frame follows
        self.settle_timeout_s = settle_timeout_s
        self._registry = registry  # the backend's live agents (aclose kills what is left there)
        registry.add(self)

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc.returncode is None

    async def request(self, data: bytes, op: str, call_id: str | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (ConnectionError, OSError) as exc:
            raise ProtocolError(f"agent channel broken: {exc}") from None
        return await self.channel.read_answer(self.proc.stdout, op, call_id)

    async def settle(self) -> dict[str, Any] | None:
        """The agent's reset report after a call (see the pool), or None when it failed."""
        self.reset_pending = False
        try:
            assert self.proc.stdout is not None
            frame = await asyncio.wait_for(self.channel.read_answer(self.proc.stdout, "reset"), self.settle_timeout_s)
        except (TimeoutError, CrossAuditError, OSError):
            return None
        return frame if frame.get("ok") is True else None

    async def destroy(self) -> None:
        self._registry.discard(self)
        await self.kill()

    async def kill(self) -> None:
        """Kill the agent's whole tree, reap it and remove its temp dir."""
        self.dead = True
        if self.proc.returncode is None:
            await asyncio.to_thread(kill_tree, self.proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5.0)
        transport = getattr(self.proc, "_transport", None)  # close pipes now, not at garbage collection
        if transport is not None:
            transport.close()
        await asyncio.to_thread(shutil.rmtree, self.workdir, True)


class AgentPool(WarmPool[_Agent]):
    """Warm agents of one bundle for one tenant; the backend knows how to start one."""

    def __init__(self, backend: ProcessSandbox, bundle: CodeBundle) -> None:
        super().__init__(backend.pool_limits, bundle)
        self.backend = backend

    async def new_worker(self) -> _Agent:
        return await self.backend._start_agent(self.bundle)

    def no_worker_error(self, *, full: bool, deadline_expired: bool, timeout: float | None) -> CrossAuditError:
        """This backend's wording, and its rule: a caller whose own deadline ran out gets a timeout
        even when the pool was full; only one that queued past ``queue_wait_s`` is RESOURCE_EXHAUSTED."""
        if full and not deadline_expired:
            return PoolExhaustedError(f"all {self.total} sandboxes of this evaluator stayed busy")
        within = f"the {timeout:.3g}s deadline" if timeout is not None else "the deadline"
        if not full and self.starting:
            return EvaluatorTimeoutError(f"sandbox did not start within {within} (it keeps warming up)")
        return EvaluatorTimeoutError(f"no sandbox was ready within {within}")


# --------------------------------------------------------------------------- the backend


class ProcessSandbox(Sandbox):
    """Runs custom evaluators in local subprocesses: RestrictedPython + rlimits (+ uid drop, netns)."""

    name: ClassVar[str] = "process"
    isolation: ClassVar[str] = (
        "process backend: weaker isolation than docker. Code runs in a local subprocess under "
        "RestrictedPython with rlimits (address space, CPU, processes, open files, file size), "
        "an unprivileged uid and no network namespace where the kernel allows; it shares the host "
        "kernel, filesystem view and Python installation."
    )

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        pool_limits: PoolLimits | None = None,
        max_bundles: int = DEFAULT_MAX_BUNDLES,
        restricted: bool = True,
        python: str | None = None,
    ) -> None:
        """``restricted=False`` exists only to test the rlimit layer alone; production keeps True."""
        super().__init__(limits)
        self.pool_limits = pool_limits or PoolLimits()
        self.max_bundles = max(1, max_bundles)
        self.restricted = restricted
        self.python = python or sys.executable
        self._pools: EvictingLRU[str, AgentPool] = EvictingLRU(self.max_bundles, self._close_evicted)
        self._agents: set[_Agent] = set()
        self._tasks: set[asyncio.Task[Any]] = set()  # closing evicted pools
        self._isolation: dict[str, Any] = {}
        self._closed = False
        self._swept = False  # stale temp dirs of dead orchestrators are removed once, on first start
        self._cpu_groups: TenantCpuGroups | None = None  # made with the first agent
        self._interpreter: str | None = None  # interpreter_identity(self.python), computed once

    # -- public API
    def info(self) -> dict[str, Any]:
        d = super().info()
        d.update(
            {
                "restricted": self.restricted,
                "netns": self._isolation.get("netns"),  # None until an agent has started
                "uid_drop": self._isolation.get("uid_drop"),
                "warm_bundles": len(self._pools),
                "agents": len(self._agents),
                **(self._cpu_groups.info() if self._cpu_groups else {}),
            }
        )
        return d

    async def prepare(self, bundle: CodeBundle, progress: ProgressCallback | None = None) -> None:
        """Validate the code and make sure ``PoolLimits.min_size`` warm agents are ready."""
        check_code(bundle.code, entrypoint=bundle.entrypoint, limits=self.limits)
        pool = self._pool(bundle)
        if progress:
            progress("starting warm sandbox agents", 0.0)
        pool.ensure_min()
        await pool.wait_ready(
            max(self.limits.timeout_s, 1.0) + self.pool_limits.start_timeout_s, count=max(1, self.pool_limits.min_size)
        )
        if progress:
            progress("ready", 1.0)

    async def _call(
        self, bundle: CodeBundle, prompt: str, response: str, context: Mapping[str, Any], timeout: float
    ) -> tuple[dict[str, Any], RunDiagnostics]:
        """One call; ``timeout`` is capped by ``limits.timeout_s`` (the sandbox's own ceiling)."""
        if self._closed:
            raise EvaluatorUnavailableError("process sandbox is closed")
        if self._interpreter is None:
            self._interpreter = await asyncio.to_thread(interpreter_identity, self.python)
        timeout = min(timeout, self.limits.timeout_s)
        deadline = time.monotonic() + timeout
        call_id, frame = AgentChannel.call_frame(prompt, response, dict(context))
        try:
            data = AgentChannel.encode(frame)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"evaluation context is not JSON-serialisable: {exc}") from None
        pool = self._pool(bundle)
        agent = await pool.acquire(deadline, timeout)
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            answer = await asyncio.wait_for(agent.request(data, "result", call_id), remaining)
        except TimeoutError:
            agent.dead = True  # killed (whole tree) and replaced off the request path by the pool
            pool.release(agent)
            message = f"custom evaluator exceeded its {timeout:.3g}s deadline and was killed"
            raise EvaluatorTimeoutError(message) from None
        except BaseException:
            agent.dead = True
            pool.release(agent)
            raise
        agent.reset_pending = True
        pool.release(agent)  # busy until its reset is reported
        wall_ms = answer.get("wall_ms")
        diag = RunDiagnostics(
            stdout=str(answer.get("stdout", "")),
            stderr=str(answer.get("stderr", "")),
            truncated=bool(answer.get("truncated", False)),
            wall_ms=float(wall_ms) if isinstance(wall_ms, (int, float)) and not isinstance(wall_ms, bool) else 0.0,
            extra={"backend": self.name, "isolation": dict(agent.loaded.get("isolation") or {})},
            # no dependencies_sha256: the process backend imports what the host has installed, nothing locked
            provenance={"backend": self.name, "image_id": self._interpreter},
        )
        return answer, diag

    async def aclose(self) -> None:
        self._closed = True
        pools = self._pools.drain()  # closed here, busy agents too: not the eviction's gentler close
        await asyncio.gather(*(p.close(reason="process sandbox is closed") for p in pools), return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        agents, self._agents = list(self._agents), set()
        await asyncio.gather(*(a.kill() for a in agents), return_exceptions=True)
        if self._cpu_groups is not None:
            await asyncio.to_thread(self._cpu_groups.close)

    # -- pools
    def _pool(self, bundle: CodeBundle) -> AgentPool:
        """The bundle's pool (LRU). Pools idle past ``PoolLimits.idle_timeout_s`` are closed on the way."""
        if self._closed:
            raise EvaluatorUnavailableError("process sandbox is closed")
        now = time.monotonic()
        key = bundle.pool_key
        # Idle expiry is swept here rather than left to a TTL cache: a pool serving or awaiting a
        # call is never idle, whatever its age, and a TTL cannot ask. peek() leaves recency alone.
        for other_key, other in self._pools.peek():
            # serving no call and none waiting (an agent still reporting its reset counts as free)
            unused = len(other.busy) <= other.settling and not other.waiting
            if other_key != key and unused and now - other.last_used > self.pool_limits.idle_timeout_s:
                self._close_pool(self._pools.pop(other_key))
        pool = self._pools.get(key)  # marks it used
        if pool is None:
            # the one entry-point check, also for a run() without prepare() (the agent keeps no copy)
            check_code(bundle.code, entrypoint=bundle.entrypoint, limits=self.limits)
            pool = self._pools[key] = AgentPool(self, bundle)  # beyond max_bundles: LRU evicted, closed
        pool.last_used = now
        return pool

    def _close_evicted(self, _key: str, pool: AgentPool) -> None:
        self._close_pool(pool)

    def _close_pool(self, pool: AgentPool) -> None:
        """Stop an evicted pool: idle agents die now, busy ones when their call is answered."""
        closing = pool.close(kill_busy=False, reason="sandbox pool was evicted; retry")
        task = asyncio.get_running_loop().create_task(closing)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # mark exceptions retrieved

    # -- agents
    def _workdir(self) -> str:
        if not self._swept:
            self._swept = True
            reap_stale_workdirs()
        path = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        if os.geteuid() == 0:
            os.chown(path, SANDBOX_UID, SANDBOX_UID)
        return path

    def _place(self, pid: int, tenant: str) -> None:
        """The agent joins its tenant's CPU group before it loads (what it forks inherits it)."""
        if not self.limits.tenant_cpu_groups:
            return
        if self._cpu_groups is None:
            self._cpu_groups = TenantCpuGroups(self.tenant_shares)
        self._cpu_groups.place(pid, tenant)

    @staticmethod
    def _env(workdir: str) -> dict[str, str]:
        """Nothing from the host environment: no tokens, no proxies, no PYTHON* settings.

        Numeric libraries get one thread: the warm agent forks every call and refuses a load
        whose imports leave threads running (OpenBLAS, imported by nltk, starts one per core).
        """
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": workdir,
            "TMPDIR": workdir,
            "PYTHONDONTWRITEBYTECODE": "1",
            **SINGLE_THREAD_ENV,
        }

    async def _start_agent(self, bundle: CodeBundle) -> _Agent:
        """Spawn and load one agent (bounded by ``pool_limits.start_timeout_s``, as a container's start is:
        loading imports the declared dependencies, which a loaded machine makes slow; a call waiting
        for it is bounded by its own deadline); nothing is left running on failure."""
        agent: _Agent | None = None
        try:
            workdir = await asyncio.to_thread(self._workdir)
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.python, "-I", str(AGENT_PATH),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL, cwd=workdir, env=self._env(workdir),
                    start_new_session=True, limit=self.limits.frame_bytes + 1,
                )  # fmt: skip
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, workdir, True)
                raise
            _lower_priority(proc.pid, self.limits.nice)
            await asyncio.to_thread(self._place, proc.pid, bundle.tenant)
            agent = _Agent(
                proc, workdir, AgentChannel.for_limits(self.limits),
                settle_timeout_s=self.limits.cleanup_s + SETTLE_SLACK_S, registry=self._agents,
            )  # fmt: skip
            frame = AgentChannel.load_frame(
                bundle.code,
                entrypoint=bundle.entrypoint,
                preload=import_names(bundle.dependencies),
                restricted=self.restricted,
                limits=self.limits,
                # its cwd, HOME and TMPDIR: emptied after each call. No idle exit: agents share the host's
                # CPU group, where a SCHED_IDLE exit could starve under load and time the reset out.
                reset={"paths": [workdir], "ipc": False},
            )
            try:
                loaded = await asyncio.wait_for(
                    agent.request(AgentChannel.encode(frame), "loaded"), self.pool_limits.start_timeout_s
                )
            except TimeoutError:
                raise EvaluatorTimeoutError("sandbox agent did not load in time") from None
            if not loaded.get("ok"):
                raise error_from_frame(loaded)  # the code's fault: the pool keeps it (sticky)
            agent.loaded = loaded
            self._isolation = dict(loaded.get("isolation") or {})
            return agent
        except BaseException as exc:
            if agent is not None:
                agent.dead = True
                with contextlib.suppress(BaseException):
                    await asyncio.shield(agent.destroy())
            if isinstance(exc, OSError):
                raise SandboxCrashedError(f"could not start the sandbox agent: {exc}") from None
            raise


def _lower_priority(pid: int, nice: int) -> None:
    """Run the agent (and so every call's process it forks) at ``nice``: tenant code shares the
    cores among itself below the orchestrator. Before the agent loads any code, so whatever it
    forks inherits it; a process that is already gone is no error (its start fails on its own)."""
    if nice <= 0:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpriority(os.PRIO_PROCESS, pid, min(nice, 19))
