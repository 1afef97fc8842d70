"""The guard proxy's side of the model server: :class:`Upstream` sends a request (with the
operator's credentials, never the caller's key), reads an answer whole (bounded, by a deadline)
and parses it; :func:`streamed` releases a streamed answer window by window as its output rules
pass (the windows themselves: stream.py). Its failures are errors.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from crossaudit.kernel.errors import CrossAuditError
from crossaudit.proxy import chat, messages, tools
from crossaudit.proxy.call import ProxyCall
from crossaudit.proxy.chat import Chunks, ProxyError
from crossaudit.proxy.config import ProxyConfig, read_secret
from crossaudit.proxy.errors import (
    bad_upstream,
    mask,
    masked,
    no_upstream_credentials,
    stop_error,
    too_large,
    upstream_errors,
)
from crossaudit.proxy.guard import Verdict
from crossaudit.proxy.stream import Blocked, StreamGuard, Windows
from crossaudit.proxy.toolstream import call_text

log = logging.getLogger("crossaudit.proxy")

EVALUATE_REQUEST_OVERHEAD_BYTES = 16 * 1024  # of an Evaluate request beyond its texts (names, ids, framing)


class Upstream:
    """The model server's API at ``upstream_url``; its connections live between open() and aclose()."""

    def __init__(
        self, config: ProxyConfig, transport: httpx.AsyncBaseTransport | None = None, *, anthropic: bool = False
    ) -> None:
        self.config = config
        self.limits = config.limits
        self._transport = transport
        self.http: httpx.AsyncClient | None = None
        # Anthropic's Messages API (anthropic_upstream): its key in x-api-key, the caller's
        # anthropic-version passed on (messages.check_version); else OpenAI's, a bearer key
        self.anthropic = anthropic
        self.url = (config.anthropic_url or "") if anthropic else config.upstream_url
        self.key = config.anthropic_key if anthropic else config.upstream_key
        self.static_headers = config.anthropic_headers if anthropic else config.upstream_headers

    def open(self) -> None:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.limits.upstream_timeout_s, connect=self.limits.upstream_connect_timeout_s),
            limits=httpx.Limits(max_connections=self.limits.max_upstream_connections),
            trust_env=False,  # what goes upstream is what the configuration says, nothing from ~/.netrc
            follow_redirects=False,  # a redirect never carries the operator's key elsewhere
            transport=self._transport,
        )

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    def deadline(self) -> float:
        """The loop time an upstream call started now must be answered by (its whole body)."""
        return asyncio.get_running_loop().time() + self.limits.upstream_timeout_s

    def _headers(self, request: Request, has_body: bool) -> dict[str, str]:
        out = dict(self.static_headers)
        if has_body:
            out["content-type"] = "application/json"
        out["accept"] = "application/json, text/event-stream"
        if self.anthropic:
            out["anthropic-version"] = messages.check_version(request.headers.get("anthropic-version"))
        if self.config.forward_caller_authorization and not self.anthropic:
            out["authorization"] = request.headers.get("authorization", "")
            return out
        try:
            key = read_secret(self.key, "the upstream key")
        except CrossAuditError as e:
            log.error("%s", e.message)
            raise no_upstream_credentials() from None
        if key and self.anthropic:
            out["x-api-key"] = key
        elif key:
            out["authorization"] = f"Bearer {key}"
        return out

    async def fetch(
        self, request: Request, method: str, path: str, payload: Mapping[str, Any] | None
    ) -> tuple[int, bytes, httpx.Headers]:
        """The upstream's status, whole body (bounded) and headers."""
        deadline = self.deadline()
        resp = await self.send(request, method, path, payload, deadline)
        body = await self.read_all(resp, deadline)
        return resp.status_code, body, resp.headers

    async def send(
        self, request: Request, method: str, path: str, payload: Mapping[str, Any] | None, deadline: float
    ) -> httpx.Response:
        """The upstream's answer, its headers read and its body not (the caller closes it)."""
        assert self.http is not None
        headers = self._headers(request, payload is not None)
        content = json.dumps(payload).encode() if payload is not None else None
        req = self.http.build_request(method, self.url + path, content=content, headers=headers)
        with upstream_errors(self.limits.upstream_timeout_s):
            async with asyncio.timeout_at(deadline):
                return await self.http.send(req, stream=True)

    async def read_all(self, resp: httpx.Response, deadline: float) -> bytes:
        """The upstream's whole body (at most max_upstream_response_bytes), by ``deadline``; then closed."""
        limit = self.limits.max_upstream_response_bytes
        try:
            with upstream_errors(self.limits.upstream_timeout_s):
                async with asyncio.timeout_at(deadline):
                    declared = resp.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limit:
                        raise too_large(limit)
                    buf = bytearray()
                    async for piece in resp.aiter_bytes():
                        buf += piece
                        if len(buf) > limit:
                            raise too_large(limit)
                    return bytes(buf)
        finally:
            await resp.aclose()

    def read_answer(
        self, body: bytes, upstream_headers: httpx.Headers, stream: bool
    ) -> tuple[dict[str, Any] | None, Chunks | None]:
        """A JSON completion, or (for a streamed request answered as a stream) its chunks."""
        if stream and _content_type(upstream_headers) == "text/event-stream":
            try:
                return None, chat.parse_stream(body)
            except ValueError as e:
                raise bad_upstream(mask(self.config, str(e))) from None
        try:
            completion = json.loads(body)
        except ValueError:
            raise bad_upstream("the upstream's answer is not JSON") from None
        if not isinstance(completion, dict):
            raise bad_upstream("the upstream's answer is not a JSON object")
        return completion, None


def discard(task: asyncio.Task[httpx.Response]) -> None:
    """An upstream call started beside the input stage, not wanted: stopped, or its answer closed unread."""

    def close(t: asyncio.Task[httpx.Response]) -> None:
        if not t.cancelled() and t.exception() is None:
            asyncio.get_running_loop().create_task(t.result().aclose())

    task.cancel()
    task.add_done_callback(close)


def _content_type(headers: httpx.Headers) -> str:
    return headers.get("content-type", "").partition(";")[0].strip().lower()


# -- a stream, window by window -----------------------------------------------------------------


def windowed(call: ProxyCall, resp: httpx.Response) -> bool:
    """A stream evaluated window by window: one choice without logprobs (their tokens spell
    the original text), answered as a stream; others are buffered whole."""
    one = call.n == 1 and not call.payload.get("logprobs")
    return (
        call.run.stream == "windows"
        and one
        and resp.status_code == 200
        and _content_type(resp.headers) == "text/event-stream"
    )


async def streamed(call: ProxyCall, resp: httpx.Response) -> Response:
    """A streamed answer released window by window (stream.py). Nothing is sent before the
    first window passed: a block there is the same HTTP error or refusal as a buffered one."""
    prompt = chat.last_user_text(call.payload["messages"])

    async def judge(text: str, window: int, final: bool) -> Verdict:
        context = call.context("output", choice=0, field="content", stream={"window": window, "final": final})
        return await call.check("output", prompt, text, context, provisional=not final)

    async def outside(text: str) -> Verdict:
        return await call.check("output", prompt, text, call.context("output", choice=0, field="outside"))

    async def one_call(tc: chat.ToolCall) -> tuple[Verdict, Verdict]:  # a held call, once whole
        context = call.context("output", choice=0, field="tool_calls", position=tc.position)
        judged, text = await asyncio.gather(
            tools.judge_call(call, prompt, tc), call.check("output", prompt, call_text(tc), context)
        )
        return judged, text

    limits = call.config.limits
    largest_context = call.context("output", choice=0, field="content", stream={"window": 0, "final": True})
    guard = StreamGuard(
        resp,
        Windows(call.run.window_chars, call.run.context_chars),
        judge,
        outside,
        deadline=call.deadline,
        max_bytes=limits.max_upstream_response_bytes,
        include_usage=call.include_usage,
        max_text_bytes=limits.max_request_bytes
        - len(prompt.encode("utf-8", "surrogatepass"))
        - len(json.dumps(largest_context).encode())
        - EVALUATE_REQUEST_OVERHEAD_BYTES,
        fields=chat.Fields(call.payload.get("model")),
        tools=one_call,
        refusal=call.config.refusal_message if call.caller.on_block == "refusal" else None,
    )
    events = guard.run()
    try:
        first = await anext(events)
    except ProxyError as e:
        await events.aclose()
        return call.error(masked(call.config, e))
    if isinstance(first, Blocked):
        await events.aclose()
        call.decisions("output", guard.decided("output") or [first.verdict])
        call.decisions("tool_call", guard.decided("tool_call"))
        if call.caller.on_block == "refusal":
            return call.refusal(1)
        return call.error(stop_error(first, call.policy))
    if guard.final:  # the whole answer was decided before the first byte: the ids go in headers
        call.decisions("output", guard.decided("output"))
        call.decisions("tool_call", guard.decided("tool_call"))
    return StreamingResponse(
        _rest(call, first, events, guard),
        media_type="text/event-stream",
        headers={**call.headers, "cache-control": "no-cache"},
    )


async def _rest(
    call: ProxyCall, first: bytes, events: AsyncGenerator[bytes | Blocked, None], guard: StreamGuard
) -> AsyncIterator[bytes]:
    """The stream after its first window; a window that fails ends it (an error event, or the refusal)."""
    yield first
    try:
        async for item in events:
            if isinstance(item, Blocked):
                error = None if call.caller.on_block == "refusal" else stop_error(item, call.policy)
                for event in guard.cut(call.config.refusal_message, error):
                    yield event
                return
            yield item
    except ProxyError as e:  # the upstream or the guard failed mid-stream: nothing unevaluated goes
        for event in guard.cut(None, masked(call.config, e)):
            yield event
    finally:
        await events.aclose()
