"""Requests that do not decode are INVALID_ARGUMENT, never UNKNOWN.

grpc.aio answers a request deserializer's exception with UNKNOWN and the Python class name.
:func:`guard_decoding` wraps every handler registered through it (``add_servicers``): the
deserializer returns an :class:`Undecodable` sentinel instead of raising, and the handler
wrapper answers it INVALID_ARGUMENT through the one error codec — before the servicer runs for
unary requests, as the stream's error for streaming requests (EvaluateStream). Authorization
comes first: the wrapper admits the call (``authorize``) before it looks at the request. It is
done here rather than in a grpc.aio server interceptor because an interceptor puts the whole
server on grpc's slow dispatch path (measured: -40% unary throughput; docs/performance.md).

A ``google.protobuf.Struct`` nested deeper than the protobuf runtime's recursion limit cannot be
decoded at all; the failure is then explained by a schema-guided scan of the bytes that names
:attr:`ServiceLimits.max_struct_depth`, the depth the service accepts.

A message over :attr:`ServiceLimits.max_request_bytes` is refused here too, as a
``RequestTooLargeError`` naming the setting (grpc's own cap sits ``TRANSPORT_MARGIN_BYTES``
above it, so this is the refusal a caller sees for a request a little too large).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from crossaudit.api.convert import depth_message
from crossaudit.api.limits import REQUEST_LIMIT_ENV, REQUEST_LIMIT_KEY
from crossaudit.kernel.errcodec import abort
from crossaudit.kernel.errors import CrossAuditError, InvalidInputError, RequestTooLargeError

STRUCT_TYPES = frozenset({"google.protobuf.Struct", "google.protobuf.ListValue"})  # one JSON level each
SCAN_MAX_FIELDS = 100_000  # the depth scan of a bad request gives up (generic message) beyond this


class Undecodable:
    """What a guarded deserializer returns for bytes that are not the request message."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidInputError) -> None:
        self.error = error


def decode_error(data: bytes, descriptor: Descriptor | None, max_depth: int) -> InvalidInputError:
    """Why ``data`` is not a ``descriptor`` message, as the caller should read it."""
    name = descriptor.full_name if descriptor is not None else "request"
    if descriptor is not None and struct_depth_exceeds(data, descriptor, max_depth):
        return InvalidInputError(f"the {name} is {depth_message(max_depth)}")
    return InvalidInputError(f"the request is not a valid {name} message (malformed protobuf bytes)")


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


def struct_depth_exceeds(data: bytes, descriptor: Descriptor, limit: int) -> bool:
    """Whether a Struct/ListValue in ``data`` nests more than ``limit`` levels. Walks the wire
    format guided by the schema (strings are skipped, only message fields descended) without
    building messages or recursing; False when the bytes are broken or the scan budget ends."""
    stack: list[tuple[int, int, Descriptor, int]] = [(0, len(data), descriptor, 0)]
    fields = 0
    try:
        while stack:
            pos, end, desc, depth = stack.pop()
            while pos < end:
                fields += 1
                if fields > SCAN_MAX_FIELDS:
                    return False
                tag, pos = _varint(data, pos, end)
                number, wire_type = tag >> 3, tag & 7
                if wire_type == 0:
                    _, pos = _varint(data, pos, end)
                elif wire_type == 1:
                    pos += 8
                elif wire_type == 5:
                    pos += 4
                elif wire_type == 2:
                    size, pos = _varint(data, pos, end)
                    fd = desc.fields_by_number.get(number)
                    if fd is not None and fd.type == FieldDescriptor.TYPE_MESSAGE and pos + size <= end:
                        sub = fd.message_type
                        level = depth + (sub.full_name in STRUCT_TYPES)
                        if level > limit:
                            return True
                        stack.append((pos, pos + size, sub, level))
                    pos += size
                else:  # groups (unused by these protos) or garbage
                    return False
    except ValueError:
        return False
    return False


def too_large(size: int, limit: int) -> RequestTooLargeError:
    """The server's refusal of a ``size``-byte request: what the limit is and where it is set."""
    return RequestTooLargeError(
        f"the request is {size} bytes, over the server's limit of {limit} bytes "
        f"({REQUEST_LIMIT_KEY}; {REQUEST_LIMIT_ENV} where the server runs)",
        size=size,
        limit=limit,
        setting=REQUEST_LIMIT_KEY,
    )


def _guarded_deserializer(
    deserialize: Callable[[bytes], Any] | None, max_depth: int, max_bytes: int | None = None
) -> Callable[[bytes], Any]:
    descriptor = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)

    def parse(data: bytes) -> Any:
        if max_bytes is not None and len(data) > max_bytes:
            return Undecodable(too_large(len(data), max_bytes))
        try:
            return deserialize(data) if deserialize is not None else data
        except Exception:  # DecodeError, RecursionError, ...: the caller's bytes, not our bug
            return Undecodable(decode_error(data, descriptor, max_depth))

    return parse


Authorize = Callable[[grpc.aio.ServicerContext], None]  # raises UnauthenticatedError / PermissionDeniedError


# Long: one wrapper per gRPC call shape (unary/stream in and out), each a few lines, sharing the
# authorization and rejection closures above them; apart, the four would repeat those.
def guard_handler(
    handler: grpc.RpcMethodHandler,
    max_depth: int,
    on_reject: Callable[[], None] = lambda: None,
    authorize: Authorize | None = None,
    max_bytes: int | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` whose calls are authorized first (``authorize``: its error is the answer,
    before any servicer code runs), with a deserializer that never raises and behaviours that
    answer a bad request INVALID_ARGUMENT (``on_reject`` is called for each, e.g. to count it);
    a request message over ``max_bytes`` is such a bad request."""
    kwargs = {
        "request_deserializer": _guarded_deserializer(handler.request_deserializer, max_depth, max_bytes),
        "response_serializer": handler.response_serializer,
    }

    async def admit(context: grpc.aio.ServicerContext) -> None:
        if authorize is not None:
            try:
                authorize(context)
            except CrossAuditError as exc:
                await abort(context, exc)

    async def reject(context: grpc.aio.ServicerContext, error: InvalidInputError) -> None:
        on_reject()
        await abort(context, error)

    if handler.unary_unary is not None:
        uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await admit(context)
            if isinstance(request, Undecodable):
                await reject(context, request.error)
            return await uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream is not None:
        us = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await admit(context)
            if isinstance(request, Undecodable):
                await reject(context, request.error)
            async for item in us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)

    def checked(requests: AsyncIterator[Any], seen: list[InvalidInputError]) -> AsyncIterator[Any]:
        # A bad message ends the request stream with its error: the servicer answers it like any
        # other of its errors; the wrappers below answer it if the servicer let it escape.
        async def gen() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    seen.append(request.error)
                    raise request.error
                yield request

        return gen()

    if handler.stream_unary is not None:
        su = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            await admit(context)
            seen: list[InvalidInputError] = []  # per call: this call's bad message, if any
            try:
                return await su(checked(requests, seen), context)
            except InvalidInputError as exc:
                if not any(exc is e for e in seen):
                    raise
                await reject(context, exc)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    ss = handler.stream_stream

    async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await admit(context)
        seen: list[InvalidInputError] = []
        try:
            async for item in ss(checked(requests, seen), context):
                yield item
        except InvalidInputError as exc:
            if not any(exc is e for e in seen):
                raise
            await reject(context, exc)

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)


class _GuardedGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, wrap: Callable[[str, grpc.RpcMethodHandler], Any]) -> None:
        self._inner = inner
        self._wrap = wrap

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._wrap(handler_call_details.method or "", handler)


class DecodingGuard:
    """Stands in for the server while generated ``add_*Servicer_to_server`` functions register
    their handlers, and registers them guarded (both the generic and the registered-method path):
    ``authorize(method, context)`` admits each call first, then decoding is checked."""

    def __init__(
        self,
        server: grpc.aio.Server,
        max_depth: int,
        on_reject: Callable[[str], None] = lambda method: None,
        authorize: Callable[[str, grpc.aio.ServicerContext], None] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._server = server
        self._max_depth = max_depth
        self._max_bytes = max_bytes
        self._on_reject = on_reject
        self._authorize = authorize
        self._wrapped: dict[tuple[str, int], tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``method``: the full name, ``/package.Service/Method``."""
        hit = self._wrapped.get((method, id(handler)))
        if hit is None or hit[0] is not handler:
            short = method.rsplit("/", 1)[-1]
            check = self._authorize
            authorize = None if check is None else (lambda context: check(method, context))
            guarded = guard_handler(
                handler, self._max_depth, lambda: self._on_reject(short), authorize, self._max_bytes
            )
            hit = (handler, guarded)
            self._wrapped[(method, id(handler))] = hit
        return hit[1]

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGeneric(h, self._wrap) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(
            service, {m: self._wrap(f"/{service}/{m}", h) for m, h in handlers.items()}
        )
