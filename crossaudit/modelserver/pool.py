"""Starts, supervises and calls builtin model servers (one subprocess or container per model kind).

The orchestrator never imports torch or spaCy: :class:`ModelServerPool` starts
``python -m crossaudit.modelserver.server --model KIND`` lazily on the first call for a kind,
waits for its health check, sends ``Analyze`` over a unix socket (default) or a loopback
port, restarts a server that died (a bounded number of times per window), and stops all of
them on :meth:`ModelServerPool.aclose`. Starting is shared: concurrent first calls wait on one
start, and a caller whose deadline ends first gets EvaluatorTimeoutError while the start goes on.

With isolation ``docker`` (:data:`ENV_MODEL_SERVERS`, ``crossaudit serve --model-servers``) a kind
that has an image runs as a hardened container instead (:mod:`crossaudit.modelserver.containers`):
same protocol, same restarts; kinds without an image (langdetect) stay subprocesses.

:class:`InProcessModels` has the same ``analyze`` API and runs the runtimes in this process
(threads): for benchmarks and embedded tools that accept the memory cost.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

import grpc
from pydantic import Field

from crossaudit.kernel import errcodec
from crossaudit.kernel import errors as E
from crossaudit.kernel.limits import SETTINGS_SECTION, NonNegativeInt, PositiveFloat, PositiveInt
from crossaudit.kernel.results import Span, Verdict
from crossaudit.modelserver import containers
from crossaudit.modelserver import images as model_images
from crossaudit.modelserver.batching import BatchLimits
from crossaudit.modelserver.builtins import RUNTIMES, ModelRuntime, runtime_for
from crossaudit.modelserver.server import MAX_MESSAGE_BYTES
from crossaudit.v1 import modelserver_pb2 as pb
from crossaudit.v1 import modelserver_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class ModelServerLimits:
    """Every knob of the model servers, named once (documented in docs/builtins-and-llm.md)."""

    __pydantic_config__ = SETTINGS_SECTION

    start_timeout_s: Annotated[
        PositiveFloat, Field(description="import torch + load a model on a slow, shared machine")
    ] = 180.0
    health_poll_s: Annotated[
        PositiveFloat, Field(description="first health poll interval (doubles up to 0.5 s)")
    ] = 0.05
    workers: Annotated[PositiveInt, Field(description="inference threads per server (the machines have 2 cores)")] = 2
    max_pending: Annotated[PositiveInt, Field(description="queued calls per server before RESOURCE_EXHAUSTED")] = 64
    max_restarts: Annotated[NonNegativeInt, Field(description="restarts of one kind within `restart_window_s`...")] = 5
    restart_window_s: Annotated[
        PositiveFloat, Field(description="...before calls fail with EvaluatorUnavailableError")
    ] = 300.0
    stop_grace_s: Annotated[PositiveFloat, Field(description="SIGTERM -> SIGKILL")] = 5.0
    transport: Annotated[
        Literal["unix", "tcp"], Field(description="`unix` or `tcp` (loopback, ephemeral port)")
    ] = "unix"
    batch: Annotated[
        BatchLimits, Field(description="micro-batching of detoxify and presidio calls")
    ] = field(default_factory=BatchLimits)
    container_memory_bytes: Annotated[
        PositiveInt, Field(description="docker isolation: memory cap (no swap) of one server")
    ] = 2 * 1024**3
    container_pids: Annotated[
        PositiveInt, Field(description="docker isolation: processes + threads of one server")
    ] = 256
    container_tmpfs_bytes: Annotated[
        PositiveInt, Field(description="docker isolation: its /tmp (the only writable path but the socket dir)")
    ] = 64 * 1024**2
    max_model_mounts: Annotated[
        PositiveInt, Field(description="docker isolation: distinct model paths one kind's container mounts")
    ] = 8


ENV_MODEL_SERVERS = "CROSSAUDIT_MODEL_SERVERS"
ISOLATIONS = ("subprocess", "docker")


def isolation_setting(value: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``value``, else :data:`ENV_MODEL_SERVERS`, else ``subprocess``; ConfigurationError if unknown."""
    environ = os.environ if environ is None else environ
    chosen = (value or environ.get(ENV_MODEL_SERVERS, "") or "subprocess").strip().lower()
    if chosen not in ISOLATIONS:
        raise E.ConfigurationError(f"model servers must run as one of {ISOLATIONS}, not {chosen!r}")
    return chosen


class ModelBackend(Protocol):
    """What builtin evaluators call: a model server pool or the in-process runner. Both also have
    ``analyze_call``: the same call answering (verdict, provenance of the model that scored it);
    an evaluator uses it where a backend has it (docs/provenance.md)."""

    async def analyze(
        self, model: str, config: Mapping[str, Any], prompt: str, response: str,
        context: Mapping[str, Any] | None = None, *, timeout: float,
    ) -> Verdict: ...


class _ScoresWithProvenance(abc.ABC):
    """``analyze`` as both backends answer it: ``analyze_call`` without the provenance."""

    async def analyze(
        self, model: str, config: Mapping[str, Any], prompt: str, response: str,
        context: Mapping[str, Any] | None = None, *, timeout: float,
    ) -> Verdict:
        """Score one input with ``model`` within ``timeout``."""
        verdict, _ = await self.analyze_call(model, config, prompt, response, context, timeout=timeout)
        return verdict

    @abc.abstractmethod
    async def analyze_call(
        self, model: str, config: Mapping[str, Any], prompt: str, response: str,
        context: Mapping[str, Any] | None = None, *, timeout: float,
    ) -> tuple[Verdict, dict[str, str]]:
        """The verdict and the provenance of the model that scored it (docs/provenance.md)."""


# Statuses a model server did not encode (its transport, a crash) are evaluator failures.
MODEL_EDGE = errcodec.Fallback(
    peer="model server",
    classes={
        grpc.StatusCode.INVALID_ARGUMENT: E.InvalidInputError,
        grpc.StatusCode.FAILED_PRECONDITION: E.ConfigurationError,
        grpc.StatusCode.RESOURCE_EXHAUSTED: E.RateLimitedError,
        grpc.StatusCode.DEADLINE_EXCEEDED: E.EvaluatorTimeoutError,
        grpc.StatusCode.UNAVAILABLE: E.EvaluatorUnavailableError,
        grpc.StatusCode.CANCELLED: E.EvaluatorUnavailableError,
    },
    other=E.EvaluatorError,
)


def error_from_rpc(exc: grpc.aio.AioRpcError, model: str) -> E.CrossAuditError:
    """The typed error a model server raised, through the one codec."""
    return errcodec.from_rpc_error(exc, fallback=dataclasses.replace(MODEL_EDGE, peer=f"model server {model}"))


def verdict_from_reply(reply: pb.AnalyzeReply) -> Verdict:
    """Re-validate a model server's reply (the same result checks as custom code's)."""
    try:
        details = json.loads(reply.details_json) if reply.details_json else {}
        return Verdict(
            score=reply.score,
            passed=reply.passed if reply.HasField("passed") else None,
            violations=list(reply.violations),
            details=details if isinstance(details, dict) else {},
            spans=[Span(start=s.start, end=s.end, label=s.label, score=s.score) for s in reply.spans],
        )
    except (ValueError, RecursionError) as exc:
        raise E.ResultInvalidError(f"model server sent an invalid reply: {exc}") from None


@dataclass
class ServerHandle:
    """One running model server: a process, or a container behind the same surface."""

    model: str
    process: asyncio.subprocess.Process | containers.ContainerProcess
    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.ModelServerStub
    started_at: float
    load_ms: float = 0.0
    stderr_tail: list[str] = field(default_factory=list)
    mounts: dict[str, str] = field(default_factory=dict)  # containers: host model path -> in-container path

    @property
    def container(self) -> str | None:
        return self.process.id if isinstance(self.process, containers.ContainerProcess) else None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


class ModelServerPool(_ScoresWithProvenance):
    """Lazily started model servers, one per kind. Safe for concurrent use in one event loop."""

    def __init__(
        self,
        limits: ModelServerLimits | None = None,
        *,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        isolation: str | None = None,
        images: Mapping[str, str] | None = None,
    ) -> None:
        """``isolation``: subprocess | docker (else $CROSSAUDIT_MODEL_SERVERS, else subprocess);
        ``images`` maps kinds to prebuilt image tags
        (docker isolation; other kinds' images are built from the local base on first use)."""
        self.limits = limits or ModelServerLimits()
        if self.limits.transport not in ("unix", "tcp"):
            raise E.ConfigurationError(f"model server transport must be unix or tcp, not {self.limits.transport!r}")
        self.isolation = isolation_setting(isolation, env)
        if self.isolation == "docker" and self.limits.transport != "unix":
            raise E.ConfigurationError("model servers in containers listen on unix sockets only (transport unix)")
        self._images: dict[str, str] = dict(images or {})
        self._docker: Any = None
        self._mounts: dict[str, dict[str, str]] = {}  # kind -> model mounts its next container gets
        self._planned: set[str] = set()  # kinds whose next start is a remount, not a crash restart
        self._retiring: set[asyncio.Task[None]] = set()
        self._python = python or sys.executable
        self._env = dict(env) if env is not None else None
        self._servers: dict[str, ServerHandle] = {}
        self._starting: dict[str, asyncio.Task[ServerHandle]] = {}
        self._restarts: dict[str, list[float]] = {}
        self._dir: str | None = None
        self._closed = False

    # --- public API -------------------------------------------------------------------

    async def analyze_call(
        self, model: str, config: Mapping[str, Any], prompt: str, response: str,
        context: Mapping[str, Any] | None = None, *, timeout: float,
    ) -> tuple[Verdict, dict[str, str]]:
        """:meth:`analyze` and the provenance the server reported for the model that scored it,
        plus ``server``, the image id of the server's container when it runs in one."""
        deadline = time.monotonic() + max(0.0, timeout)
        wire = dict(config)
        if self.in_container(model):
            handle, wire = await self._container_for(model, wire, deadline)
        else:
            handle = await self.server(model, timeout=timeout)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise E.EvaluatorTimeoutError(f"model server {model} started but the deadline ran out")
        request = pb.AnalyzeRequest(
            model=model,
            config_json=json.dumps(wire, default=_jsonable),
            prompt=prompt,
            response=response,
            context_json=json.dumps(dict(context or {}), default=str),
        )
        try:
            reply = await handle.stub.Analyze(request, timeout=remaining, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise E.EvaluatorTimeoutError(f"{model} did not answer within {timeout:.3g}s") from None
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                await self._reap(model, handle)
            raise error_from_rpc(exc, model) from None
        provenance = dict(reply.provenance)
        image_id = getattr(handle.process, "image_id", "")
        if image_id:
            provenance["server"] = image_id
        return verdict_from_reply(reply), provenance

    async def server(self, model: str, *, timeout: float | None = None) -> ServerHandle:
        """The live server of ``model``, started (or restarted) on demand."""
        if self._closed:
            raise E.EvaluatorUnavailableError("model server pool is closed")
        if model not in RUNTIMES:
            raise E.InvalidInputError(f"unknown builtin model {model!r} (expected one of {sorted(RUNTIMES)})")
        handle = self._servers.get(model)
        if handle is not None and handle.alive:
            return handle
        if handle is not None:
            await self._reap(model, handle)
        task = self._starting.get(model)
        if task is None:
            if model in self._planned:
                self._planned.discard(model)
            else:
                self._check_restart_budget(model)
            task = asyncio.create_task(self._start(model), name=f"start-model-server-{model}")
            self._starting[model] = task
            task.add_done_callback(functools.partial(self._forget_start, model))
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout=timeout)
        except TimeoutError:
            raise E.EvaluatorTimeoutError(
                f"model server {model} is still starting (deadline {timeout:.3g}s); later calls will use it"
            ) from None

    def _forget_start(self, model: str, task: asyncio.Task[ServerHandle]) -> None:
        if self._starting.get(model) is task:
            del self._starting[model]
        if not task.cancelled():
            task.exception()  # retrieved here so a start nobody awaited any more is not logged as lost

    async def health(self, model: str, *, timeout: float = 5.0) -> dict[str, Any]:
        handle = await self.server(model, timeout=timeout)
        reply = await handle.stub.Health(pb.ModelHealthRequest(), timeout=timeout)
        return {
            "ready": reply.ready, "model": reply.model, "pid": reply.pid, "loaded": list(reply.loaded),
            "load_ms": reply.load_ms, "requests": reply.requests, "address": handle.address,
            "batch_sizes": dict(sorted(reply.batch_sizes.items())), "expired": reply.expired,
            "isolation": "docker" if handle.container else "subprocess", "container": handle.container,
            "mounts": dict(handle.mounts),
        }

    def in_container(self, model: str) -> bool:
        """Whether ``model``'s server runs as a container here (docker isolation and the kind has an image)."""
        return self.isolation == "docker" and model in model_images.KINDS

    def running(self) -> dict[str, int]:
        """Kinds with a live server, and their pids."""
        return {m: h.process.pid for m, h in self._servers.items() if h.alive}

    async def stop(self, model: str) -> None:
        handle = self._servers.pop(model, None)
        if handle is not None:
            await self._terminate(handle)

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._starting.values()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for model in list(self._servers):
            await self.stop(model)
        for retiring in list(self._retiring):
            with contextlib.suppress(BaseException):
                await retiring
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def __aenter__(self) -> ModelServerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- internals --------------------------------------------------------------------

    def _check_restart_budget(self, model: str) -> None:
        now = time.monotonic()
        recent = [t for t in self._restarts.get(model, []) if now - t < self.limits.restart_window_s]
        self._restarts[model] = recent
        if len(recent) >= self.limits.max_restarts:
            raise E.EvaluatorUnavailableError(
                f"model server {model} was started {len(recent)} times in {self.limits.restart_window_s:.0f}s; "
                "not restarting it again yet"
            )
        recent.append(now)

    async def _container_for(
        self, model: str, config: dict[str, Any], deadline: float
    ) -> tuple[ServerHandle, dict[str, Any]]:
        """The container serving ``model`` with every model path of ``config`` mounted, and the config
        rewritten to the in-container paths. A path the running container lacks replaces it with one
        that mounts all paths seen so far (graceful: the old one finishes its calls within its stop grace)."""
        needed = containers.model_mounts(model, config)
        want = self._mounts.setdefault(model, {})
        new = {host: target for host, target in needed.items() if host not in want}
        if len(want) + len(new) > self.limits.max_model_mounts:
            raise E.ConfigurationError(
                f"model server {model}: more than {self.limits.max_model_mounts} distinct model paths "
                "(max_model_mounts); each one is mounted into its container"
            )
        want.update(new)
        for _ in range(3):
            handle = await self.server(model, timeout=max(0.0, deadline - time.monotonic()))
            if needed.keys() <= handle.mounts.keys():
                return handle, containers.rewrite_paths(model, config, handle.mounts)
            if self._servers.get(model) is handle:
                del self._servers[model]
                self._planned.add(model)
                task = asyncio.create_task(self._terminate(handle), name=f"retire-model-server-{model}")
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
        raise E.EvaluatorUnavailableError(f"model server {model} kept restarting to mount new model paths")

    async def _spawn_container(self, model: str, args: list[str]) -> containers.ContainerProcess:
        """Build or find the kind's image and start it hardened, its socket directory mounted."""
        if self._docker is None:
            self._docker = await asyncio.to_thread(containers.client)
            await asyncio.to_thread(containers.reap_leftovers, self._docker)
        image = self._images.get(model)
        if image is None:
            image = await asyncio.to_thread(model_images.build, model)  # minutes the first time, then cached
            self._images[model] = image
        assert self._dir is not None
        sockdir = os.path.join(self._dir, model)
        os.makedirs(sockdir, exist_ok=True)
        # The server runs as the image's unprivileged uid; the pool's 0700 directory keeps other host users out.
        os.chmod(sockdir, 0o777)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(sockdir, f"{model}.sock"))
        lim = self.limits
        return await containers.ContainerProcess.start(
            self._docker, kind=model, image=image, args=args, socket_dir=sockdir,
            mounts=dict(self._mounts.get(model, {})), memory_bytes=lim.container_memory_bytes,
            pids=lim.container_pids, tmpfs_bytes=lim.container_tmpfs_bytes,
        )

    async def _start(self, model: str) -> ServerHandle:
        lim = self.limits
        options = ["--workers", str(lim.workers), "--max-pending", str(lim.max_pending),
                   "--max-batch-size", str(lim.batch.max_size), "--max-batch-wait-ms", repr(lim.batch.max_wait_ms)]
        if lim.transport == "unix" and self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="ca-ms-")  # 0700: only this user reaches the sockets
        t0 = time.monotonic()
        proc: asyncio.subprocess.Process | containers.ContainerProcess
        if self.in_container(model):
            # The image names the kind and the socket (its MODEL build argument); the host cannot signal a pid in
            # the container's namespace, so the pool (and its atexit hook) removes it instead.
            mounts = dict(self._mounts.get(model, {}))
            proc = await self._spawn_container(model, [*options, "--socket-mode", "666"])
            t0 = time.monotonic()
        else:
            mounts = {}
            proc = await self._spawn_process(model, options)
        return await self._connect(model, proc, t0, mounts)

    async def _spawn_process(self, model: str, options: list[str]) -> asyncio.subprocess.Process:
        lim = self.limits
        args = [self._python, "-m", "crossaudit.modelserver.server", "--model", model, *options,
                "--parent-pid", str(os.getpid())]
        if lim.transport == "unix":
            assert self._dir is not None
            sock = os.path.join(self._dir, f"{model}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)
            args += ["--socket", sock]
        else:
            args += ["--port", "0"]
        env = dict(os.environ if self._env is None else self._env)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_repo_root(), env.get("PYTHONPATH", "")) if p)
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
        )
        _live_pids.add(proc.pid)
        return proc

    async def _connect(
        self, model: str, proc: asyncio.subprocess.Process | containers.ContainerProcess, t0: float,
        mounts: dict[str, str],
    ) -> ServerHandle:
        """Read the server's address line, open a channel and wait until it reports ready."""
        lim = self.limits
        stderr_tail: list[str] = []
        drain = asyncio.create_task(_drain(proc.stderr, stderr_tail))
        channel: grpc.aio.Channel | None = None
        drain_out: asyncio.Task[None] | None = None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=lim.start_timeout_s)  # type: ignore[union-attr]
            if not line:
                await asyncio.wait_for(proc.wait(), timeout=lim.stop_grace_s)
                raise E.EvaluatorUnavailableError(
                    f"model server {model} exited with {proc.returncode} before listening: {_tail(stderr_tail)}"
                )
            try:
                address = str(json.loads(line)["address"])
            except (ValueError, KeyError, TypeError):
                raise E.EvaluatorUnavailableError(
                    f"model server {model} printed an unexpected line: {line[:200]!r}"
                ) from None
            if isinstance(proc, containers.ContainerProcess):  # the same socket, seen from the host
                assert self._dir is not None
                address = address.replace(f"unix:{containers.SOCKET_DIR}/", f"unix:{self._dir}/{model}/", 1)
            # Keep reading stdout too: a model library printing to it must never fill the pipe.
            drain_out = asyncio.create_task(_drain(proc.stdout, stderr_tail))
            channel = grpc.aio.insecure_channel(
                address,
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
            )
            stub = pb_grpc.ModelServerStub(channel)
            handle = ServerHandle(model, proc, address, channel, stub, time.monotonic(), stderr_tail=stderr_tail,
                                  mounts=mounts)
            await self._wait_ready(handle, t0 + lim.start_timeout_s)
            handle.load_ms = (time.monotonic() - t0) * 1000
        except BaseException:
            if channel is not None:
                await channel.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(proc.wait(), timeout=lim.stop_grace_s)
            _live_pids.discard(proc.pid)
            drain.cancel()
            if drain_out is not None:
                drain_out.cancel()
            raise
        handle._drains = (drain, drain_out)  # type: ignore[attr-defined]
        self._servers[model] = handle
        return handle

    async def _wait_ready(self, handle: ServerHandle, deadline: float) -> None:
        delay = self.limits.health_poll_s
        while time.monotonic() < deadline:
            if not handle.alive:
                raise E.EvaluatorUnavailableError(
                    f"model server {handle.model} died while starting (exit {handle.process.returncode}): "
                    f"{_tail(handle.stderr_tail)}"
                )
            try:
                reply = await handle.stub.Health(pb.ModelHealthRequest(), timeout=max(0.5, delay))
                if reply.ready:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 2)
        raise E.EvaluatorUnavailableError(
            f"model server {handle.model} not ready after {self.limits.start_timeout_s:.0f}s: "
            f"{_tail(handle.stderr_tail)}"
        )

    async def _reap(self, model: str, handle: ServerHandle) -> None:
        """Forget a dead (or unreachable) server so the next call restarts it."""
        if self._servers.get(model) is handle:
            del self._servers[model]
        await self._terminate(handle)

    async def _terminate(self, handle: ServerHandle) -> None:
        with contextlib.suppress(Exception):
            await handle.channel.close()
        if handle.alive:
            with contextlib.suppress(ProcessLookupError):
                handle.process.terminate()
            try:
                await asyncio.wait_for(handle.process.wait(), timeout=self.limits.stop_grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    handle.process.kill()
                await handle.process.wait()
        _live_pids.discard(handle.process.pid)
        for drain in getattr(handle, "_drains", ()):
            drain.cancel()


class InProcessModels(_ScoresWithProvenance):
    """The same ``analyze`` as the pool, but models load in this process (threads, no isolation)."""

    def __init__(self, workers: int = 2) -> None:
        self._runtimes: dict[str, ModelRuntime] = {}
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="models-inproc")

    def runtime(self, model: str) -> ModelRuntime:
        if model not in self._runtimes:
            self._runtimes[model] = runtime_for(model)
        return self._runtimes[model]

    async def analyze_call(
        self, model: str, config: Mapping[str, Any], prompt: str, response: str,
        context: Mapping[str, Any] | None = None, *, timeout: float,
    ) -> tuple[Verdict, dict[str, str]]:
        runtime = self.runtime(model)
        loop = asyncio.get_running_loop()

        def scored() -> tuple[Verdict, dict[str, str]]:
            return runtime.analyze(dict(config), prompt, response), runtime.provenance(dict(config))

        fut = loop.run_in_executor(self._executor, scored)
        try:
            return await asyncio.wait_for(fut, timeout=timeout)
        except TimeoutError:
            raise E.EvaluatorTimeoutError(f"{model} did not answer within {timeout:.3g}s") from None

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def _tail(lines: list[str]) -> str:
    return " | ".join(lines[-5:]) or "(no stderr)"


async def _drain(stream: asyncio.StreamReader | None, tail: list[str], keep: int = 50) -> None:
    """Keep the last lines of a server's stderr for error messages; never let the pipe fill."""
    if stream is None:
        return
    while True:
        line = await stream.readline()
        if not line:
            return
        tail.append(line.decode(errors="replace").rstrip()[:500])
        if len(tail) > keep:
            del tail[: len(tail) - keep]


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ModelServerPool] = weakref.WeakKeyDictionary()
_live_pids: set[int] = set()  # every server started by any pool of this process, until stopped


def default_pool() -> ModelServerPool:
    """The pool builtin evaluators use when none is passed: one per event loop (gRPC channels
    and subprocess transports are loop-bound). Owners should pass their own pool and close it;
    servers of pools nobody closed are terminated when this process exits."""
    loop = asyncio.get_running_loop()
    pool = _defaults.get(loop)
    if pool is None or pool._closed:
        pool = ModelServerPool()
        _defaults[loop] = pool
    return pool


@atexit.register
def _terminate_leftovers() -> None:
    for pid in list(_live_pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    _live_pids.clear()
