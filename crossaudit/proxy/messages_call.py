"""A guarded Messages call (Anthropic's ``POST /v1/messages``; docs/agents.md#anthropics-messages-api):
the same stages as a chat call. Each ``tool_result`` block is judged at ``tool_result`` before any
byte goes upstream (a block stops the call; a redaction replaces the block's text), the request's
text at ``input`` (the last user message's text blocks, or every message's and the system prompt
with ``input_messages: all``), then the upstream's answer, read whole (a stream too: its events are
put back together, bounded by ``max_upstream_response_bytes``): each text block at ``output``, the
text outside them (tool calls' names and inputs, thinking) at ``output`` too, and each ``tool_use``
block at ``tool_call`` (a block drops that block, a redaction rewrites its input's values). The
answer is rebuilt from what passed, as JSON or as Anthropic's events; every failure is an error in
Anthropic's shape.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from crossaudit.proxy import messages, tools
from crossaudit.proxy.call import ProxyCall, evaluate_all
from crossaudit.proxy.chat import ProxyError, ToolCall
from crossaudit.proxy.errors import DEFAULT_BLOCK_STATUS, bad_upstream, block_error, mask, unredactable
from crossaudit.proxy.guard import Verdict
from crossaudit.proxy.messages import Answer, Sent, Shape

MESSAGES_PATH = "/messages"


class Stop(Exception):
    """A stage answers in the model's place: a refusal (``on_block: refusal``) or an error."""

    def __init__(self, error: ProxyError | None) -> None:
        super().__init__(error.message if error else "refused")
        self.error = error


async def guarded(call: ProxyCall) -> Response:
    try:
        return await _guarded(call)
    except Stop as s:
        if s.error is None:
            return _answer(
                call, Shape(call.payload).message(None, [Sent("text", call.config.refusal_message)], "refusal")
            )
        return messages.error_response(s.error, call.headers)


def _stop(call: ProxyCall, error: ProxyError) -> Stop:
    return Stop(None if call.caller.on_block == "refusal" else error)


async def _guarded(call: ProxyCall) -> Response:
    call.deadline = call.upstream.deadline()
    await _tool_results(call)
    await _input(call)
    resp = await call.upstream.send(call.request, "POST", MESSAGES_PATH, call.payload, call.deadline)
    body = await call.upstream.read_all(resp, call.deadline)
    if resp.status_code != 200:
        return _upstream_failure(call, resp.status_code, body)
    answer = _read(call, body, resp.headers.get("content-type", ""))
    return _answer(call, await _output(call, answer))


# -- the request -------------------------------------------------------------------------------


async def _tool_results(call: ProxyCall) -> None:
    msgs: list[dict[str, Any]] = call.payload["messages"]
    results = messages.tool_results(msgs)
    if not results:
        return

    def context(r: messages.ToolResult) -> dict[str, Any]:
        ctx = call.context(tools.TOOL_RESULT, message={"index": r.message, "role": "user", "block": r.block})
        ctx["tool"] = tools._tool(r.name, r.call_id)
        return ctx

    verdicts = await evaluate_all(call, (call.check(tools.TOOL_RESULT, r.text, r.text, context(r)) for r in results))
    call.decisions(tools.TOOL_RESULT, verdicts)
    blocked = next((v for v in verdicts if v.blocked), None)
    if blocked is not None:  # nothing has gone upstream
        raise _stop(call, block_error(blocked, tools.TOOL_RESULT, call.policy))
    for r, v in zip(results, verdicts, strict=True):
        if v.text is not None and v.text != r.text:  # the redacted result is what the model reads
            block = msgs[r.message]["content"][r.block]
            if isinstance(block.get("content"), list):
                messages.put_text(block, "content", v.text)
            else:
                block["content"] = v.text


async def _input(call: ProxyCall) -> None:
    msgs: list[dict[str, Any]] = call.payload["messages"]
    jobs: list[tuple[Any, str, str]] = []  # (message index or "system", field, text)
    if call.config.input_messages == "all":
        system = call.payload.get("system")
        if system is not None:
            text = messages.blocks_text(system, "system")
            if text is not None:
                jobs.append(("system", "content", text))
        targets = list(range(len(msgs)))
    else:
        last = messages.last_user(msgs)
        targets = [] if last is None else [last]
    for i in targets:
        text = messages.message_text(msgs[i], f"messages[{i}]")
        if text is not None:
            jobs.append((i, "content", text))
        outside = messages.outside_text(msgs[i]) if call.config.input_messages == "all" else None
        if outside is not None:
            jobs.append((i, "outside", outside))

    def context(where: Any, field: str) -> dict[str, Any]:
        role = "system" if where == "system" else msgs[where]["role"]
        return call.context(
            "input", message={"index": -1 if where == "system" else where, "role": role, "field": field}
        )

    verdicts = await evaluate_all(call, (call.check("input", t, t, context(w, f)) for w, f, t in jobs))
    call.decisions("input", verdicts)
    for (where, field, text), v in zip(jobs, verdicts, strict=True):
        if v.blocked:
            raise _stop(call, block_error(v, "input", call.policy))
        if field == "outside" and v.text is not None and v.text != text:
            raise _stop(call, unredactable(f"messages[{where}]", call.policy, 400))
    for (where, _field, text), v in zip(jobs, verdicts, strict=True):
        if v.text is not None and v.text != text:  # the redacted prompt is what goes upstream
            if where == "system":
                messages.put_text(call.payload, "system", v.text)
            else:
                messages.put_text(msgs[where], "content", v.text)


# -- the answer --------------------------------------------------------------------------------


def _read(call: ProxyCall, body: bytes, content_type: str) -> Answer:
    try:
        if content_type.partition(";")[0].strip().lower() == "text/event-stream":
            return messages.parse_stream(body)
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            raise ValueError("the upstream's answer is not JSON") from None
        return messages.parse_answer(obj)
    except messages.UpstreamStreamError as e:
        message = mask(call.config, f"the upstream reported an error mid-stream: {e}")
        raise ProxyError(502, message, "server_error", "upstream_error") from None
    except ValueError as e:
        raise bad_upstream(mask(call.config, f"the upstream's answer is not a Messages answer: {e}")) from None


def _call_text(block: messages.Block) -> str:
    return f"{block.name}\n{block.text}"


async def _output(call: ProxyCall, answer: Answer) -> dict[str, Any]:
    """The answer judged: each text block (output), the text outside them (output), each tool_use
    (tool_call), all at once; the message to send, or Stop."""
    prompt = messages.last_user_text(call.payload["messages"])
    texts = [(i, b) for i, b in enumerate(answer.blocks) if b.type == "text"]
    uses = [(i, b) for i, b in enumerate(answer.blocks) if b.type == "tool_use"]
    outside_parts = [
        _call_text(b) if b.type == "tool_use" else b.text for b in answer.blocks if b.type in ("tool_use", "thinking")
    ]
    outside = "\n".join(outside_parts) if outside_parts else None
    output_jobs: list[Awaitable[Verdict]] = [
        call.check("output", prompt, b.text, call.context("output", choice=0, block=i, field="content"))
        for i, b in texts
    ]
    if outside is not None:
        output_jobs.append(call.check("output", prompt, outside, call.context("output", choice=0, field="outside")))
    calls = [ToolCall(0, pos, b.call_id, b.name, b.text or "{}") for pos, (_i, b) in enumerate(uses)]
    output_task = evaluate_all(call, output_jobs)
    tool_task = evaluate_all(call, (tools.judge_call(call, prompt, tc) for tc in calls))
    verdicts, judged = await asyncio.gather(output_task, tool_task)
    call.decisions("output", verdicts)
    call.decisions(tools.TOOL_CALL, judged)
    new_text: dict[int, str] = {}
    for (i, b), v in zip(texts, verdicts, strict=False):
        if v.blocked:
            raise _stop(call, block_error(v, "output", call.policy))
        if v.text is not None and v.text != b.text:
            new_text[i] = v.text
    if outside is not None:
        v = verdicts[-1]
        if v.blocked:
            raise _stop(call, block_error(v, "output", call.policy))
        if v.text is not None and v.text != outside:
            raise _stop(call, unredactable("content", call.policy, DEFAULT_BLOCK_STATUS))
    inputs: dict[int, dict[str, Any] | None] = {}  # block index -> its input as sent; None: dropped
    for (i, _b), tc, v in zip(uses, calls, judged, strict=True):
        if v.blocked:
            if call.caller.on_block != "refusal":
                raise Stop(block_error(v, tools.TOOL_CALL, call.policy))
            inputs[i] = None
            continue
        inputs[i] = _input_object(v.text if v.text is not None else tc.arguments)
    sent: list[Sent] = []
    refused = False
    for i, b in enumerate(answer.blocks):
        if b.type == "text":
            sent.append(Sent("text", new_text.get(i, b.text)))
        elif b.type == "tool_use":
            value = inputs[i]
            if value is None:
                if not refused:  # the dropped call's place: the refusal, once
                    sent.append(Sent("text", call.config.refusal_message))
                    refused = True
                continue
            sent.append(Sent("tool_use", call_id=b.call_id, name=b.name, input=value))
        elif b.type == "thinking":
            sent.append(Sent("thinking", b.text, signature=b.signature))
        else:
            sent.append(Sent("redacted_thinking", data=b.data))
    shape = Shape(call.payload)
    if uses and all(v is None for v in inputs.values()):  # every call dropped: the answer is the refusal
        raise Stop(None)
    return shape.message(answer, sent, None)


def _input_object(text: str) -> dict[str, Any]:
    """A tool_use's input as the caller gets it (the arguments as judged, or redacted: still JSON)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise ProxyError(
            502,
            "the model's answer cannot be evaluated: a tool_use block's input is not a JSON object",
            "server_error",
            "guard_rejected",
        )
    return value


def _answer(call: ProxyCall, message: dict[str, Any]) -> Response:
    if not call.stream:
        return JSONResponse(message, headers=call.headers)
    events = messages.stream_events(message)

    async def replay() -> Any:
        for event in events:
            yield event

    return StreamingResponse(
        replay(), media_type="text/event-stream", headers={**call.headers, "cache-control": "no-cache"}
    )


def _upstream_failure(call: ProxyCall, status: int, body: bytes) -> Response:
    """A non-200 upstream answer: the caller's mistakes (4xx) as the upstream said them, less the
    operator's key; refused operator credentials and server errors are 502."""
    if status in (401, 403):
        error = ProxyError(502, "the upstream refused the proxy's credentials", "server_error", "upstream_auth")
        return messages.error_response(error, call.headers)
    if 400 <= status < 500:
        text = mask(call.config, body.decode("utf-8", "replace"))
        try:  # masked again once decoded: JSON escapes hide the key from the raw text
            answer = json.loads(mask(call.config, json.dumps(json.loads(text), ensure_ascii=False)))
        except (ValueError, RecursionError):
            answer = None
        err = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(answer, dict) and answer.get("type") == "error" and isinstance(err, dict):
            return JSONResponse(answer, status_code=status, headers=call.headers)
        error = ProxyError(status, text[:2000] or f"HTTP {status}", "upstream_error", "upstream_error")
        return messages.error_response(error, call.headers)
    error = ProxyError(502, f"the upstream answered HTTP {status}", "server_error", "upstream_error")
    return messages.error_response(error, call.headers)
