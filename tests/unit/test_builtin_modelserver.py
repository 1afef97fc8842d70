"""The model server's gRPC contract with a fake runtime: typed errors survive the hop, the
queue bound refuses excess work, deadlines are honoured, replies convert to a Verdict."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import grpc
import pytest

from crossaudit.kernel.errors import (
    ConfigurationError,
    EvaluatorError,
    EvaluatorTimeoutError,
    InvalidInputError,
    RateLimitedError,
)
from crossaudit.kernel.results import Span, Verdict
from crossaudit.modelserver.builtins import ModelRuntime
from crossaudit.modelserver.pool import error_from_rpc, verdict_from_reply
from crossaudit.modelserver.server import ModelServicer
from crossaudit.v1 import modelserver_pb2 as pb
from crossaudit.v1 import modelserver_pb2_grpc as pb_grpc


class FakeRuntime(ModelRuntime):
    kind = "langdetect"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def _key(self, cfg: Any) -> tuple[str, ...]:
        return ("fake",)

    def _load(self, cfg: Any) -> Any:
        return object()

    def _analyze(self, model: Any, cfg: Any, text: str) -> Verdict:  # analyze() is overridden whole
        raise NotImplementedError

    def analyze(self, config: Any, prompt: str, response: str) -> Verdict:
        if response == "block":
            self.release.wait(60)  # bounded; released by the test (or its fixture) long before
        if response == "config":
            raise ConfigurationError("no model here: set CROSSAUDIT_X")
        if response == "crash":
            raise ZeroDivisionError("model bug")
        return Verdict(score=0.25, passed=False, violations=["v"], details={"echo": config},
                       spans=[Span(start=0, end=2, label="X", score=0.5)])


@pytest.fixture
async def served():
    runtime = FakeRuntime()
    servicer = ModelServicer(runtime, workers=1, max_pending=2)
    server = grpc.aio.server()
    pb_grpc.add_ModelServerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.warm()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.ModelServerStub(channel), runtime
    runtime.release.set()
    await channel.close()
    await server.stop(0)
    servicer.executor.shutdown(wait=False, cancel_futures=True)


def _req(response: str, model: str = "langdetect", config: str = '{"a": 1}') -> pb.AnalyzeRequest:
    return pb.AnalyzeRequest(model=model, config_json=config, prompt="p", response=response)


async def _call(stub: Any, req: pb.AnalyzeRequest, timeout: float = 5.0) -> Verdict:
    try:
        return verdict_from_reply(await stub.Analyze(req, timeout=timeout))
    except grpc.aio.AioRpcError as exc:
        raise error_from_rpc(exc, "langdetect") from None


async def test_reply_round_trip(served) -> None:
    stub, _ = served
    v = await _call(stub, _req("ok"))
    assert v == Verdict(score=0.25, passed=False, violations=["v"], details={"echo": {"a": 1}},
                        spans=[Span(start=0, end=2, label="X", score=0.5)])
    health = await stub.Health(pb.ModelHealthRequest())
    assert health.ready and health.model == "langdetect" and health.requests == 1


@pytest.mark.parametrize(
    ("req", "error", "text"),
    [(_req("ok", model="presidio"), InvalidInputError, "serves 'langdetect'"),
     (_req("ok", config="[1]"), InvalidInputError, "JSON object"),
     (_req("ok", config="{"), InvalidInputError, "not valid JSON"),
     (_req("config"), ConfigurationError, "CROSSAUDIT_X"),
     (_req("crash"), EvaluatorError, "ZeroDivisionError")],
)
async def test_errors_keep_their_type(served, req, error, text) -> None:
    stub, _ = served
    with pytest.raises(error, match=text) as info:
        await _call(stub, req)
    assert type(info.value) is error


async def test_deadline_and_queue_bound(served) -> None:
    stub, runtime = served
    with pytest.raises(EvaluatorTimeoutError):
        await _call(stub, _req("block"), timeout=0.2)  # the worker stays busy until released
    blocked = [asyncio.create_task(_call(stub, _req("block"), timeout=60)) for _ in range(2)]
    for _ in range(600):  # bounded: until the server took both (each is queued as it is counted)
        if (await stub.Health(pb.ModelHealthRequest())).requests == 3:
            break
        await asyncio.sleep(0.05)
    with pytest.raises(RateLimitedError, match="queued") as info:
        await _call(stub, _req("ok"))
    assert info.value.retryable
    runtime.release.set()
    assert all(v.score == 0.25 for v in await asyncio.gather(*blocked))
    assert json.loads((await stub.Analyze(_req("ok"))).details_json) == {"echo": {"a": 1}}
