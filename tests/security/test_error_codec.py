"""Errors keep their type across every gRPC edge (the one codec, ``crossaudit/kernel/errcodec.py``).

Every CrossAuditError subclass (found programmatically by ``tests/errorcases.py``: a new
subclass is covered without editing this file) goes through a REAL grpc.aio server on loopback —
a small generic service whose handler raises the class named in the request through the codec —
and must come back as the same class with the same retryable flag (and its ``issues`` / ``limit``): as a unary
status, as a streaming abort, and as an EvaluateStream ``ItemError``. The model-server edge
(``crossaudit.modelserver.server`` → ``crossaudit.modelserver.pool``) is driven the same way.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from crossaudit.api.convert import item_error_from_pb as _item_error
from crossaudit.api.errors import from_rpc_error
from crossaudit.kernel import errcodec
from crossaudit.kernel import errors as E
from crossaudit.kernel.errors import CrossAuditError, PolicyIssue, PolicyValidationError, SandboxLimitError
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver.builtins import ModelRuntime
from crossaudit.modelserver.pool import error_from_rpc
from crossaudit.modelserver.server import ModelServicer
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import modelserver_pb2 as pb
from crossaudit.v1 import modelserver_pb2_grpc as pb_grpc
from tests.errorcases import EXAMPLES, all_error_classes, example

pytestmark = pytest.mark.security

SERVICE = "crossaudit.test.Raiser"


def build(name: str, retryable: bool | None = None) -> CrossAuditError:
    cls = E.error_class(name)
    assert cls is not None, name
    return example(cls, retryable)


CASES = [(cls.__name__, None) for cls in all_error_classes()] + [
    ("ProviderError", True),  # a 429: retryable on this instance only
    ("ProviderError", False),
    ("EvaluatorUnavailableError", False),
]


def test_every_product_error_class_is_registered_under_its_own_name() -> None:
    classes = all_error_classes()
    assert len(classes) > 20
    for cls in classes:
        assert E.error_class(cls.__name__) is cls, f"{cls.__module__}.{cls.__name__}: names must be unique"
        custom_init = any("__init__" in vars(k) for k in cls.__mro__[: cls.__mro__.index(CrossAuditError)])
        if custom_init:
            assert cls in EXAMPLES, f"{cls.__name__} has its own constructor: add an example to EXAMPLES"
    # the store's errors are part of the one hierarchy (and still importable from the store)
    from crossaudit.store.base import ReviewAlreadyResolvedError, StoreUnavailableError

    assert ReviewAlreadyResolvedError is E.ReviewAlreadyResolvedError
    assert StoreUnavailableError is E.StoreUnavailableError


def assert_same(back: CrossAuditError, sent: CrossAuditError) -> None:
    assert type(back) is type(sent), (type(back), type(sent))
    assert back.retryable is sent.retryable
    assert back.code is sent.code
    if isinstance(sent, PolicyValidationError):
        assert back.issues == sent.issues  # type: ignore[attr-defined]
    elif isinstance(sent, SandboxLimitError):
        assert back.limit == sent.limit and back.message == sent.message  # type: ignore[attr-defined]
    else:
        assert back.message == sent.message


# --- a real grpc.aio server whose handlers raise through the codec -----------------------


def _request(raw: bytes) -> tuple[str, bool | None]:
    doc = json.loads(raw)
    return doc["name"], doc.get("retryable")


async def _raise(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
    name, retryable = _request(raw)
    await errcodec.abort(context, build(name, retryable))


async def _raise_in_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield b"first item"
    name, retryable = _request(raw)
    await errcodec.abort(context, build(name, retryable))


async def _item(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
    name, retryable = _request(raw)
    error = ev_pb.ItemError(**errcodec.item_fields(build(name, retryable)))
    return ev_pb.EvaluateStreamResponse(request_id="r1", error=error).SerializeToString()


async def _unknown(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
    code = getattr(grpc.StatusCode, raw.decode())
    doc = json.dumps({"type": "ErrorFromTheFuture", "retryable": True, "data": {}}).encode()
    context.set_trailing_metadata(((errcodec.ERROR_DOC_KEY, doc),))
    await context.abort(code, "a newer server's error")


async def _bare(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(getattr(grpc.StatusCode, raw.decode()), "no CrossAudit metadata")


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
def raiser() -> Iterator[str]:
    """The test service on an ephemeral loopback port, in its own event loop thread."""
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    handlers = {
        "Raise": grpc.unary_unary_rpc_method_handler(_raise, _identity, _identity),
        "RaiseInStream": grpc.unary_stream_rpc_method_handler(_raise_in_stream, _identity, _identity),
        "Item": grpc.unary_unary_rpc_method_handler(_item, _identity, _identity),
        "Unknown": grpc.unary_unary_rpc_method_handler(_unknown, _identity, _identity),
        "Bare": grpc.unary_unary_rpc_method_handler(_bare, _identity, _identity),
    }

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.fixture(scope="module")
def channel(raiser: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(raiser) as ch:
        yield ch


def _payload(name: str, retryable: bool | None) -> bytes:
    return json.dumps({"name": name, "retryable": retryable}).encode()


@pytest.mark.parametrize(("name", "retryable"), CASES)
def test_unary_status_round_trip(channel: grpc.Channel, name: str, retryable: bool | None) -> None:
    call = channel.unary_unary(f"/{SERVICE}/Raise", request_serializer=_identity, response_deserializer=_identity)
    with pytest.raises(grpc.RpcError) as info:
        call(_payload(name, retryable), timeout=10)
    assert_same(from_rpc_error(info.value), build(name, retryable))


@pytest.mark.parametrize(("name", "retryable"), CASES)
def test_stream_abort_round_trip(channel: grpc.Channel, name: str, retryable: bool | None) -> None:
    call = channel.unary_stream(
        f"/{SERVICE}/RaiseInStream", request_serializer=_identity, response_deserializer=_identity
    )
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for item in call(_payload(name, retryable), timeout=10):
            got.append(item)
    assert got == [b"first item"]
    assert_same(from_rpc_error(info.value), build(name, retryable))


@pytest.mark.parametrize(("name", "retryable"), CASES)
def test_stream_item_error_round_trip(channel: grpc.Channel, name: str, retryable: bool | None) -> None:
    call = channel.unary_unary(f"/{SERVICE}/Item", request_serializer=_identity, response_deserializer=_identity)
    item = ev_pb.EvaluateStreamResponse.FromString(call(_payload(name, retryable), timeout=10))
    back = _item_error(item.error, item.request_id)  # what Client.evaluate_many yields
    assert_same(back, build(name, retryable))
    assert back.request_id == "r1"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("NOT_FOUND", E.NotFoundError),
        ("FAILED_PRECONDITION", E.ConfigurationError),
        ("INVALID_ARGUMENT", E.InvalidInputError),
        ("UNAVAILABLE", E.EvaluatorUnavailableError),
        ("INTERNAL", CrossAuditError),
    ],
)
def test_unknown_type_names_fall_back_to_the_class_of_the_status(
    channel: grpc.Channel, code: str, cls: type[CrossAuditError]
) -> None:
    for method in ("Unknown", "Bare"):
        call = channel.unary_unary(
            f"/{SERVICE}/{method}", request_serializer=_identity, response_deserializer=_identity
        )
        with pytest.raises(grpc.RpcError) as info:
            call(code.encode(), timeout=10)
        back = from_rpc_error(info.value)
        if method == "Bare" and code == "UNAVAILABLE":  # no CrossAudit document: the server never answered
            assert type(back) is E.ServerUnavailableError and back.retryable
            continue
        assert type(back) is cls, (method, code, type(back))
        if method == "Unknown":
            assert back.retryable is True  # the sender's flag still counts


def test_thousands_of_policy_issues_fit_the_metadata_budget(channel: grpc.Channel) -> None:
    """Trailing metadata is capped by gRPC (8 KiB by default): a huge invalid policy must still
    arrive as a PolicyValidationError, its first issues intact and the rest counted."""
    many = [PolicyIssue(f"issue number {i} " + "x" * 80, path=f"rules[{i}].threshold", line=i + 1) for i in range(3000)]
    exc = PolicyValidationError(many)
    st = errcodec.encode(exc)
    assert sum(len(v) for _, v in st.trailing_metadata) + len(st.details.encode()) < 7 * 1024
    back = errcodec.decode(st.code, st.details, st.trailing_metadata)
    assert isinstance(back, PolicyValidationError)
    assert back.issues[0] == many[0] and "more issue(s)" in back.issues[-1].message
    assert "3000 issue(s)" in st.details


def test_one_issue_longer_than_the_budget_is_clipped_not_dropped() -> None:
    """A model-resolution report (places tried, fixes) can be one long issue: it arrives cut."""
    long = PolicyIssue("presidio: entity PERSON needs a spaCy pipeline. " + "tried: here\n" * 400, path="evaluators[0]")
    st = errcodec.encode(PolicyValidationError([long, PolicyIssue("second")]))
    back = errcodec.decode(st.code, st.details, st.trailing_metadata)
    assert isinstance(back, PolicyValidationError)
    first = back.issues[0]
    assert first.path == "evaluators[0]" and first.message.startswith("presidio: entity PERSON needs")
    assert first.message.endswith(" [...]") and "1 more issue(s)" in back.issues[-1].message


def test_lone_surrogates_in_messages_are_sendable(channel: grpc.Channel) -> None:
    st = errcodec.encode(E.SandboxCodeError("evaluator raised ValueError: \ud800 bad"))
    st.details.encode("utf-8")  # would raise on a lone surrogate
    assert "\ufffd bad" in st.details


def test_untyped_errors_leak_nothing() -> None:
    st = errcodec.encode(KeyError("/secret/path"))
    assert st.code is grpc.StatusCode.INTERNAL and "/secret" not in st.details
    assert dict(st.trailing_metadata)[errcodec.ERROR_TYPE_KEY] == "CrossAuditError"


# --- the model-server edge ----------------------------------------------------------------


class RaisingRuntime(ModelRuntime):
    """Raises the error class named in the request's config (``{"raise": name}``)."""

    kind = "langdetect"

    def _key(self, cfg: Any) -> tuple[str, ...]:
        return ("raising",)

    def _load(self, cfg: Any) -> Any:
        return object()

    def _analyze(self, model: Any, cfg: Any, text: str) -> Verdict:
        raise NotImplementedError

    def analyze(self, config: Any, prompt: str, response: str) -> Verdict:
        if config.get("details") is not None:  # an unsendable result, caught by Verdict itself
            return Verdict(score=1.0, details=config["details"] | {"big": 10**400})
        raise build(config["raise"], config.get("retryable"))


@pytest.fixture
async def model_server() -> AsyncIterator[pb_grpc.ModelServerStub]:
    servicer = ModelServicer(RaisingRuntime(), workers=1, max_pending=4)
    server = grpc.aio.server()
    pb_grpc.add_ModelServerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.ModelServerStub(channel)
    finally:
        await channel.close()
        await server.stop(0)
        servicer.executor.shutdown(wait=False, cancel_futures=True)


async def _analyze(stub: pb_grpc.ModelServerStub, config: dict[str, Any]) -> CrossAuditError:
    req = pb.AnalyzeRequest(model="langdetect", config_json=json.dumps(config), prompt="p", response="r")
    try:
        await stub.Analyze(req, timeout=10)
    except grpc.aio.AioRpcError as exc:
        return error_from_rpc(exc, "langdetect")
    raise AssertionError("the model server answered")


async def test_model_server_edge_round_trips_every_class(model_server: pb_grpc.ModelServerStub) -> None:
    for name, retryable in CASES:
        back = await _analyze(model_server, {"raise": name, "retryable": retryable})
        assert_same(back, build(name, retryable))


async def test_model_server_unsendable_result_is_result_invalid(model_server: pb_grpc.ModelServerStub) -> None:
    back = await _analyze(model_server, {"details": {"x": 1}})
    assert type(back) is E.ResultInvalidError and "2^53" in back.message


async def test_model_server_edge_falls_back_to_evaluator_errors() -> None:
    """Statuses a model server did not encode (its transport) are evaluator failures."""

    class Bare(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return "socket closed"

        def trailing_metadata(self) -> tuple:
            return ()

    expected = {
        grpc.StatusCode.DEADLINE_EXCEEDED: E.EvaluatorTimeoutError,
        grpc.StatusCode.UNAVAILABLE: E.EvaluatorUnavailableError,
        grpc.StatusCode.CANCELLED: E.EvaluatorUnavailableError,
        grpc.StatusCode.UNKNOWN: E.EvaluatorError,
        grpc.StatusCode.INTERNAL: E.EvaluatorError,
    }
    for code, cls in expected.items():
        back = error_from_rpc(Bare(code), "langdetect")  # type: ignore[arg-type]
        assert type(back) is cls, code
    assert "model server langdetect" in error_from_rpc(Bare(grpc.StatusCode.UNAVAILABLE), "langdetect").message  # type: ignore[arg-type]


def test_codec_module_keeps_grpc_out_of_the_error_hierarchy() -> None:
    source = inspect.getsource(E)
    assert "import grpc" not in source
