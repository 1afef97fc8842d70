"""A builtin model server: ``python -m crossaudit.modelserver.server --model detoxify --socket PATH``.

One process per model kind, so torch/spaCy memory and crashes stay out of the orchestrator.
It loads each model once (see :class:`~crossaudit.modelserver.builtins.base.ModelRuntime`) and serves many
``Analyze`` calls concurrently: a bounded thread pool runs inference, a bounded queue refuses
excess work with RESOURCE_EXHAUSTED instead of piling it up, and each call honours the gRPC
deadline. Kinds whose runtime batches (detoxify, presidio) go through a
:class:`~crossaudit.modelserver.batching.MicroBatcher`: calls arriving within ``--max-batch-wait-ms``
are scored together, up to ``--max-batch-size``. It listens only on a unix socket or a loopback port.

On start it prints one JSON line to stdout, ``{"address": ..., "pid": ...}``, then serves until
SIGTERM/SIGINT or until its parent process is gone (so a crashed orchestrator leaves no orphan).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from crossaudit.kernel import errcodec
from crossaudit.kernel.builtins import parse_config
from crossaudit.kernel.errors import (
    CrossAuditError,
    EvaluatorError,
    EvaluatorTimeoutError,
    InvalidInputError,
    RateLimitedError,
)
from crossaudit.modelserver.batching import BatchLimits, MicroBatcher
from crossaudit.modelserver.builtins import RUNTIMES, ModelRuntime, runtime_for
from crossaudit.v1 import modelserver_pb2 as pb
from crossaudit.v1 import modelserver_pb2_grpc as pb_grpc

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # prompt + response + config of one call
# The model-server image sets these from its MODEL build argument: one image recipe for every model,
# whose exec-form ENTRYPOINT cannot expand the argument itself (images/modelserver/Dockerfile).
ENV_MODEL = "CROSSAUDIT_MODEL_SERVER"
ENV_SOCKET = "CROSSAUDIT_MODEL_SOCKET"
LOOPBACK = "127.0.0.1"


def _json_object(raw: str, field: str) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"{field} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{field} must be a JSON object")
    return value


class ModelServicer(pb_grpc.ModelServerServicer):
    """Serves one runtime. ``workers`` threads run inference; ``max_pending`` bounds the queue;
    ``batch`` sets how a batching runtime's calls are grouped."""

    def __init__(
        self, runtime: ModelRuntime, *, workers: int = 2, max_pending: int = 64, batch: BatchLimits | None = None
    ) -> None:
        self.runtime = runtime
        self.executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"ms-{runtime.kind}")
        self.batcher = (
            MicroBatcher(runtime, self.executor, batch or BatchLimits(), slots=max(1, workers))
            if runtime.batching else None
        )
        self.max_pending = max_pending
        self.pending = 0
        self.requests = 0
        self.ready = False
        self.load_ms = 0.0

    async def warm(self) -> None:
        """Import the model stack and load the env-configured model (if any) before answering ready."""
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self.runtime.preload_from_env)
        except CrossAuditError as exc:
            # A bad default model must not keep the server from serving explicitly configured ones.
            print(f"model server: preload failed: {exc}", file=sys.stderr, flush=True)
        self.load_ms = (time.perf_counter() - t0) * 1000
        self.ready = True

    async def Analyze(self, request: pb.AnalyzeRequest, context: grpc.aio.ServicerContext) -> pb.AnalyzeReply:
        self.requests += 1
        try:
            if request.model != self.runtime.kind:
                raise InvalidInputError(f"this server serves {self.runtime.kind!r}, not {request.model!r}")
            config = _json_object(request.config_json, "config_json")
            if self.pending >= self.max_pending:
                raise RateLimitedError(f"model server {self.runtime.kind} has {self.pending} calls queued")
            self.pending += 1
            try:
                loop = asyncio.get_running_loop()
                t0 = time.perf_counter()
                remaining = context.time_remaining()
                if self.batcher is not None:
                    cfg = parse_config(self.runtime.kind, config)
                    verdict = await self.batcher.submit(cfg, request.prompt, request.response, timeout=remaining)
                else:
                    fut = loop.run_in_executor(
                        self.executor, self.runtime.analyze, config, request.prompt, request.response
                    )
                    verdict = await asyncio.wait_for(fut, timeout=remaining) if remaining is not None else await fut
                model_ms = (time.perf_counter() - t0) * 1000
                provenance = self.runtime.provenance(config)  # the model that just scored it is loaded
            finally:
                self.pending -= 1
        except TimeoutError:
            await errcodec.abort(context, EvaluatorTimeoutError("model call timed out"))
        except CrossAuditError as exc:  # typed errors cross the edge through the one codec
            await errcodec.abort(context, exc)
        except Exception as exc:  # a model bug must come back typed, not as an opaque UNKNOWN
            await errcodec.abort(context, EvaluatorError(f"{type(exc).__name__}: {exc}"))
        return pb.AnalyzeReply(
            score=verdict.score,
            passed=verdict.passed,
            violations=verdict.violations,
            details_json=json.dumps(verdict.details, allow_nan=False, default=str),
            spans=[pb.TextSpan(start=s.start, end=s.end, label=s.label, score=s.score) for s in verdict.spans],
            model_ms=model_ms,
            provenance=provenance,
        )

    async def Health(self, request: pb.ModelHealthRequest, context: grpc.aio.ServicerContext) -> pb.ModelHealthReply:
        return pb.ModelHealthReply(
            ready=self.ready,
            model=self.runtime.kind,
            pid=os.getpid(),
            loaded=self.runtime.loaded(),
            load_ms=self.load_ms,
            requests=self.requests,
            batch_sizes=dict(self.batcher.stats.sizes) if self.batcher else {},
            expired=self.batcher.stats.expired if self.batcher else 0,
        )


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop when the parent is gone (re-parented): bounded by the server's own lifetime."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)


async def serve(
    model: str,
    *,
    socket_path: str | None = None,
    port: int | None = None,
    workers: int = 2,
    max_pending: int = 64,
    parent_pid: int | None = None,
    batch: BatchLimits | None = None,
    socket_mode: int | None = None,
) -> None:
    runtime = runtime_for(model)
    servicer = ModelServicer(runtime, workers=workers, max_pending=max_pending, batch=batch)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        maximum_concurrent_rpcs=max_pending + 16,
    )
    pb_grpc.add_ModelServerServicer_to_server(servicer, server)
    if socket_path:
        address = f"unix:{socket_path}"
        server.add_insecure_port(address)
    else:
        bound = server.add_insecure_port(f"{LOOPBACK}:{port or 0}")
        address = f"{LOOPBACK}:{bound}"
    await server.start()
    if socket_path and socket_mode is not None:
        # A containerised server runs as the image's uid: the host side must still be able to connect.
        os.chmod(socket_path, socket_mode)
    print(json.dumps({"address": address, "pid": os.getpid(), "model": model}), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(servicer.warm())]
    if parent_pid:
        tasks.append(asyncio.create_task(_watch_parent(parent_pid, stop)))
    await stop.wait()
    await server.stop(grace=1.0)
    for t in tasks:
        t.cancel()
    servicer.executor.shutdown(wait=False, cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m crossaudit.modelserver.server", description=__doc__.splitlines()[0])
    model = os.environ.get(ENV_MODEL) or None
    ap.add_argument("--model", default=model, required=model is None, choices=sorted(RUNTIMES),
                    help=f"the builtin to serve (default: ${ENV_MODEL})")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--socket", help=f"unix socket path to listen on (default: ${ENV_SOCKET}, else a port)")
    where.add_argument("--port", type=int, default=None, help="loopback port (0 = ephemeral, the default)")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("CROSSAUDIT_MODEL_WORKERS", "2")))
    ap.add_argument("--max-pending", type=int, default=64)
    ap.add_argument("--socket-mode", type=lambda v: int(v, 8), default=None,
                    help="octal permissions of the socket (containers: the directory around it guards access)")
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process is no longer the parent")
    ap.add_argument("--max-batch-size", type=int, default=BatchLimits.max_size,
                    help="calls scored together by a batching kind (1 = no batching)")
    ap.add_argument("--max-batch-wait-ms", type=float, default=BatchLimits.max_wait_ms,
                    help="longest a call waits for others to join its batch")
    args = ap.parse_args(argv)
    if args.socket is None and args.port is None:
        args.socket = os.environ.get(ENV_SOCKET) or None
    try:
        batch = BatchLimits(max_size=args.max_batch_size, max_wait_ms=args.max_batch_wait_ms)
    except ValueError as exc:
        ap.error(str(exc))
    asyncio.run(
        serve(
            args.model,
            socket_path=args.socket,
            port=args.port or 0,
            workers=args.workers,
            max_pending=args.max_pending,
            parent_pid=args.parent_pid or None,
            batch=batch,
            socket_mode=args.socket_mode,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
