"""Anthropic's Messages API wire format (``POST /v1/messages``), as far as the guard needs it: the
texts a request holds (the messages' text, ``tool_result`` blocks), an answer read whole (JSON, or a
stream of its server-sent events put back together), the answer rebuilt from what the guard let
through (never the upstream's bytes: every field outside the judged texts is checked or the
proxy's own), its stream written back as Anthropic's events, and errors in Anthropic's shape
(``{"type": "error", "error": {"type", "message"}}``). docs/agents.md#anthropics-messages-api.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError
from starlette.responses import JSONResponse

from crossaudit.proxy.chat import MODEL_SUFFIX_FORM, ProxyError, invalid, request_messages

DEFAULT_VERSION = "2023-06-01"  # sent upstream when the caller names no anthropic-version
VERSION_FORM = re.compile(r"\d{4}-\d{2}-\d{2}")
MESSAGE_ID_FORM = re.compile(r"msg_[A-Za-z0-9_]{1,64}")
TOOL_USE_ID_FORM = re.compile(r"toolu_[A-Za-z0-9_]{1,64}")
STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"})
REFUSAL_STOP_REASON = "refusal"
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
ROLES = frozenset({"user", "assistant"})
# Anthropic's error types by HTTP status (what its SDKs and clients switch on)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


# --- errors ------------------------------------------------------------------------------------


def error_body(e: ProxyError) -> dict[str, Any]:
    """A ProxyError in Anthropic's shape; the proxy's own ``code`` (and a block's ``crossaudit``)
    beside Anthropic's ``type`` and ``message``."""
    kind = ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message, "code": e.code, **e.extra}}


def error_response(e: ProxyError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status, headers={**(headers or {}), **e.headers})


def sse(kind: str, obj: Mapping[str, Any]) -> bytes:
    data = json.dumps({"type": kind, **obj}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


# --- requests ----------------------------------------------------------------------------------


def parse_request(body: bytes, *, max_messages: int) -> dict[str, Any]:
    """The Messages request as JSON, with the fields the guard reads checked."""
    payload, messages = request_messages(body, max_messages)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise invalid(f"messages[{i}] must be an object with role 'user' or 'assistant'", "invalid_messages")
        content = m.get("content")
        if isinstance(content, list):
            for j, block in enumerate(content):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise invalid(f"messages[{i}].content[{j}] must be an object with a type", "invalid_messages")
        elif not isinstance(content, str):
            raise invalid(f"messages[{i}].content must be a string or a list of blocks", "invalid_messages")
    system = payload.get("system")
    if system is not None and not isinstance(system, str | list):
        raise invalid("'system' must be a string or a list of text blocks")
    if payload.get("stream") is not None and not isinstance(payload.get("stream"), bool):
        raise invalid("'stream' must be a boolean")
    return payload


def _unsupported(where: str, kind: Any) -> ProxyError:
    return invalid(
        f"{where} is of type {kind!r}: the guard evaluates text only, and does not forward what it cannot evaluate",
        "unsupported_content",
    )


def blocks_text(content: Any, where: str, *, kinds: frozenset[str] = frozenset({"text"})) -> str | None:
    """The text of a content (a string, or its text blocks joined by newlines; blocks of ``kinds``
    other than text are skipped, any other is refused); None when it has no text."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, block in enumerate(content if isinstance(content, list) else []):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise invalid(f"{where}[{j}].text must be a string")
            texts.append(block["text"])
        elif kind not in kinds:
            raise _unsupported(f"{where}[{j}]", kind)
    return "\n".join(texts) if texts else None


def put_text(holder: dict[str, Any], key: str, text: str) -> None:
    """A redaction written into ``holder[key]``: a string replaced; in a list of blocks, the first
    text block carries the whole redacted text and the other text blocks go (others stay)."""
    content = holder[key]
    if isinstance(content, str):
        holder[key] = text
        return
    out: list[Any] = []
    placed = False
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            if not placed:
                out.append({"type": "text", "text": text})
                placed = True
            continue
        out.append(block)
    holder[key] = out


# The blocks a user message may carry beside its text (judged at their own stages, or history)
USER_OTHER = frozenset({"tool_result"})
ASSISTANT_OTHER = frozenset({"tool_use", "thinking", "redacted_thinking"})


def message_text(message: Mapping[str, Any], where: str) -> str | None:
    other = USER_OTHER if message.get("role") == "user" else ASSISTANT_OTHER
    return blocks_text(message.get("content"), f"{where}.content", kinds=other)


def last_user(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The last user message that carries text (one of only tool results is not a prompt)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and message_text(m, f"messages[{i}]") is not None:
            return i
    return None


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    i = last_user(messages)
    return "" if i is None else message_text(messages[i], f"messages[{i}]") or ""


def outside_text(message: Mapping[str, Any]) -> str | None:
    """The text an assistant turn carries outside its text blocks: tool calls' names and inputs,
    thinking (what the model reads back, judged with ``input_messages: all``)."""
    parts: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, list) else []:
        if block.get("type") == "tool_use":
            parts.append(f"{block.get('name', '')}\n{json.dumps(block.get('input'), ensure_ascii=False)}")
        elif block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
            parts.append(block["thinking"])
    return "\n".join(parts) or None


@dataclass
class ToolResult:
    """A ``tool_result`` block of a request: where it is, the call it answers, its text."""

    message: int
    block: int
    call_id: str
    name: str
    text: str


def tool_results(messages: Sequence[Mapping[str, Any]]) -> list[ToolResult]:
    """Every tool_result block of the request, its tool named by the tool_use it answers."""
    names: dict[str, str] = {}
    out: list[ToolResult] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            if block.get("type") == "tool_use" and m.get("role") == "assistant" and isinstance(block.get("id"), str):
                names[block["id"]] = block.get("name") if isinstance(block.get("name"), str) else ""
            elif block.get("type") == "tool_result" and m.get("role") == "user":
                call_id = block.get("tool_use_id") if isinstance(block.get("tool_use_id"), str) else ""
                text = blocks_text(block.get("content"), f"messages[{i}].content[{j}].content")
                out.append(ToolResult(i, j, call_id, names.get(call_id, ""), text or ""))
    return out


# --- answers -----------------------------------------------------------------------------------


@dataclass
class Block:
    """One content block of the answer: ``text`` (its text), ``tool_use`` (its id, name and input
    as JSON text, as the model wrote it), ``thinking`` (its text and signature) or
    ``redacted_thinking`` (opaque ``data``)."""

    type: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    signature: str = ""
    data: str = ""
    started: bool = True
    stopped: bool = False


@dataclass
class Answer:
    """A Messages answer as the guard judges it."""

    id: Any = None
    model: Any = None
    blocks: list[Block] = field(default_factory=list)
    stop_reason: Any = None
    stop_sequence: Any = None
    usage: dict[str, Any] = field(default_factory=dict)


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} is not a string")
    return value


def _block(obj: Any, where: str, *, streamed: bool) -> Block:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not an object")
    kind = obj.get("type")
    if kind == "text":
        return Block("text", text=_str(obj, "text", where))
    if kind == "tool_use":
        call_id, name = _str(obj, "id", where), _str(obj, "name", where)
        value = obj.get("input")
        if streamed:  # the input comes in input_json_delta fragments; the start's is {}
            if value not in (None, {}):
                raise ValueError(f"{where}: a streamed tool_use block starts with input {{}}")
            return Block("tool_use", call_id=call_id, name=name)
        if not isinstance(value, dict):
            raise ValueError(f"{where}.input is not a JSON object")
        return Block("tool_use", text=json.dumps(value, ensure_ascii=False), call_id=call_id, name=name)
    if kind == "thinking":
        return Block("thinking", text=_str(obj, "thinking", where), signature=_str(obj, "signature", where))
    if kind == "redacted_thinking":
        return Block("redacted_thinking", data=_str(obj, "data", where))
    shown = kind if isinstance(kind, str) and len(kind) <= 64 else "unknown"
    raise ValueError(f"{where} is a content block of type {shown!r}, which the guard cannot evaluate")


def parse_answer(obj: Any) -> Answer:
    """A JSON Messages answer (ValueError when it is not one)."""
    if not isinstance(obj, dict) or obj.get("type") != "message":
        raise ValueError("the answer is not a message object")
    content = obj.get("content")
    if not isinstance(content, list):
        raise ValueError("the answer has no content list")
    blocks = [_block(b, f"content[{i}]", streamed=False) for i, b in enumerate(content)]
    usage = obj.get("usage")
    usage = dict(usage) if isinstance(usage, dict) else {}
    return Answer(obj.get("id"), obj.get("model"), blocks, obj.get("stop_reason"), obj.get("stop_sequence"), usage)


DELTAS = {"text": "text_delta", "tool_use": "input_json_delta", "thinking": "thinking_delta"}
DELTA_FIELDS = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking"}


def parse_stream(body: bytes) -> Answer:
    """A streamed Messages answer put back together from its events (message_start, then each
    content block's start, deltas and stop, message_delta, message_stop; ping and event types
    unknown here are skipped). ValueError when the stream breaks that form, or reports an error."""
    source = EventSource(httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body))
    answer: Answer | None = None
    stopped = False
    try:
        for event in source.iter_sse():
            if not event.data:
                continue
            try:
                obj = json.loads(event.data)
            except ValueError:
                raise ValueError("a streamed event is not JSON") from None
            if not isinstance(obj, dict):
                raise ValueError("a streamed event is not a JSON object")
            kind = obj.get("type")
            if kind == "error":
                err = obj.get("error")
                message = err.get("message") if isinstance(err, dict) else err
                raise UpstreamStreamError(str(message)[:500])
            if kind == "ping":
                continue
            if stopped:
                raise ValueError(f"a {str(kind)[:64]!r} event after message_stop")
            if kind == "message_start":
                if answer is not None:
                    raise ValueError("message_start twice")
                message = obj.get("message")
                if not isinstance(message, dict):
                    raise ValueError("message_start carries no message")
                usage = message.get("usage")
                usage = dict(usage) if isinstance(usage, dict) else {}
                answer = Answer(message.get("id"), message.get("model"), [], None, None, usage)
                continue
            if answer is None:
                if kind in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
                    raise ValueError(f"a {kind} event before message_start")
                continue
            if kind == "content_block_start":
                _start(answer, obj)
            elif kind == "content_block_delta":
                _delta(answer, obj)
            elif kind == "content_block_stop":
                block = _open(answer, obj, "content_block_stop")
                block.stopped = True
            elif kind == "message_delta":
                delta = obj.get("delta")
                delta = delta if isinstance(delta, dict) else {}
                answer.stop_reason = delta.get("stop_reason", answer.stop_reason)
                answer.stop_sequence = delta.get("stop_sequence", answer.stop_sequence)
                if isinstance(obj.get("usage"), dict):
                    answer.usage.update(obj["usage"])
            elif kind == "message_stop":
                stopped = True
    except SSEError as e:
        raise ValueError(f"not an event stream: {e}") from None
    if answer is None or not stopped:
        raise ValueError("the stream ended before message_stop")
    if any(not b.stopped for b in answer.blocks):
        raise ValueError("a content block was never stopped")
    return answer


class UpstreamStreamError(ValueError):
    """An ``error`` event in the upstream's stream."""


def _index(obj: Mapping[str, Any], kind: str) -> int:
    idx = obj.get("index")
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise ValueError(f"a {kind} event's index is not an integer")
    return idx


def _start(answer: Answer, obj: Mapping[str, Any]) -> None:
    idx = _index(obj, "content_block_start")
    if idx != len(answer.blocks) or (answer.blocks and not answer.blocks[-1].stopped):
        raise ValueError(f"content block {idx} starts out of order")
    answer.blocks.append(_block(obj.get("content_block"), f"content block {idx}", streamed=True))


def _open(answer: Answer, obj: Mapping[str, Any], kind: str) -> Block:
    idx = _index(obj, kind)
    if idx != len(answer.blocks) - 1 or answer.blocks[idx].stopped:
        raise ValueError(f"a {kind} event for content block {idx}, which is not the open one")
    return answer.blocks[idx]


def _delta(answer: Answer, obj: Mapping[str, Any]) -> None:
    block = _open(answer, obj, "content_block_delta")
    delta = obj.get("delta")
    if not isinstance(delta, dict):
        raise ValueError("a content_block_delta carries no delta")
    kind = delta.get("type")
    if kind == "signature_delta" and block.type == "thinking":
        block.signature += _str(delta, "signature", "a signature_delta")
        return
    if not isinstance(kind, str) or DELTAS.get(block.type) != kind:
        shown = kind if isinstance(kind, str) and len(kind) <= 64 else "unknown"
        raise ValueError(f"a {shown!r} delta for a {block.type} block")
    block.text += _str(delta, DELTA_FIELDS[kind], f"a {kind}")


# --- the answer as sent ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """A block as the caller gets it: a text (maybe redacted or the refusal), a tool_use with its
    input (maybe redacted), thinking, or redacted thinking."""

    type: str
    text: str = ""
    call_id: str = ""
    name: str = ""
    input: Mapping[str, Any] | None = None
    signature: str = ""
    data: str = ""


def _formed(form: re.Pattern[str], value: Any) -> str | None:
    return value if isinstance(value, str) and form.fullmatch(value) is not None else None


class Shape:
    """The answer's fields outside its judged texts, as sent: the upstream's when they have the
    strict form of their field, else the proxy's own (as chat.Fields does for chat answers)."""

    def __init__(self, payload: Mapping[str, Any]) -> None:
        model = payload.get("model")
        self.model = model if isinstance(model, str) else ""
        stops = payload.get("stop_sequences")
        self.stops = {s for s in stops if isinstance(s, str)} if isinstance(stops, list) else set()
        self.id = f"msg_crossaudit{uuid.uuid4().hex}"
        self._ids: dict[str, str] = {}

    def message(self, answer: Answer | None, blocks: Sequence[Sent], stop_reason: str | None) -> dict[str, Any]:
        answer = answer or Answer()
        model = answer.model
        kept = (
            isinstance(model, str)
            and bool(self.model)
            and model.startswith(self.model)
            and (model == self.model or MODEL_SUFFIX_FORM.fullmatch(model, len(self.model)) is not None)
        )
        usage = {k: v for k, v in answer.usage.items() if k in USAGE_KEYS and type(v) is int and v >= 0}
        stop = answer.stop_reason if answer.stop_reason in STOP_REASONS else "end_turn"
        sequence = answer.stop_sequence if answer.stop_sequence in self.stops else None
        return {
            "id": _formed(MESSAGE_ID_FORM, answer.id) or self.id,
            "type": "message",
            "role": "assistant",
            "model": model if kept else self.model,
            "content": [self.block(b) for b in blocks],
            "stop_reason": stop_reason or stop,
            "stop_sequence": None if stop_reason else sequence,
            "usage": {"input_tokens": 0, "output_tokens": 0, **usage},
        }

    def block(self, b: Sent) -> dict[str, Any]:
        if b.type == "text":
            return {"type": "text", "text": b.text}
        if b.type == "tool_use":
            call_id = _formed(TOOL_USE_ID_FORM, b.call_id) or self._ids.setdefault(
                b.call_id, f"toolu_crossaudit{uuid.uuid4().hex[:24]}"
            )
            return {"type": "tool_use", "id": call_id, "name": b.name, "input": dict(b.input or {})}
        if b.type == "thinking":
            return {"type": "thinking", "thinking": b.text, "signature": b.signature}
        return {"type": "redacted_thinking", "data": b.data}


def stream_events(message: Mapping[str, Any]) -> list[bytes]:
    """A whole answer as Anthropic's events: message_start, each block's start, one delta (its
    whole text, or its whole input as one input_json_delta) and stop, message_delta, message_stop."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    out = [sse("message_start", {"message": start})]
    for i, block in enumerate(message["content"]):
        kind = block["type"]
        first: dict[str, Any]
        if kind == "text":
            first, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        elif kind == "tool_use":
            first = {**block, "input": {}}
            text = json.dumps(block["input"], ensure_ascii=False)
            deltas = [{"type": "input_json_delta", "partial_json": text}]
        elif kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
            if block["signature"]:
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            first, deltas = block, []
        out.append(sse("content_block_start", {"index": i, "content_block": first}))
        out.extend(sse("content_block_delta", {"index": i, "delta": d}) for d in deltas)
        out.append(sse("content_block_stop", {"index": i}))
    ending = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    out.append(sse("message_delta", {"delta": ending, "usage": {"output_tokens": usage["output_tokens"]}}))
    out.append(sse("message_stop", {}))
    return out


def check_version(value: str | None) -> str:
    """The caller's ``anthropic-version`` (passed upstream), in its date form; the default when none."""
    if value is None:
        return DEFAULT_VERSION
    if VERSION_FORM.fullmatch(value) is None:
        raise invalid("the anthropic-version header must be a date (YYYY-MM-DD)", "invalid_anthropic_version")
    return value
