"""The OpenAI chat-completions wire format, as far as the guard needs it: the texts a request and
an answer hold, OpenAI-style errors and refusals, and a buffered stream taken apart and put back.

Only text is evaluated: a message part that is not text (an image, audio, a file) in a message
the guard must evaluate is refused rather than forwarded unseen. Text a message or an answer
carries outside its content (tool-call arguments, ``function_call``, ``refusal``, a reasoning
model's ``reasoning_content``, names) is evaluated too (:func:`outside_text`): the model reads
it, or the caller does. A buffered stream (several choices, logprobs, ``stream: buffered``;
one choice is released window by window by stream.py) is held whole (bounded) before anything is
sent, so what reaches the caller is always the evaluated answer: unchanged chunks are replayed
byte for byte, a changed choice gets its new text in the
place of its first content delta. Choices are matched by their ``index`` only once the indices
are known to be exactly the integers 0..n-1, each once (per chunk in a stream): an answer that
repeats one, or writes one that is not an integer, is refused rather than read one way by the
guard and another by the caller.
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

DONE = "[DONE]"
SSE_DONE = b"data: [DONE]\n\n"
REFUSAL_FINISH_REASON = "content_filter"  # what OpenAI answers when a filter withheld content
# Keys whose strings are identifiers, not text anyone reads: left out of outside_text.
NOT_TEXT_KEYS = frozenset({"id", "type", "index", "tool_call_id"})
MAX_INDICES_SHOWN = 10  # of an answer's choice indices, quoted in the error that refuses them
# An answer's fields outside the texts the guard evaluates (Fields): passed on only in these forms,
# else the proxy's own value, so no upstream text reaches the caller unevaluated.
ID_FORM = re.compile(r"(?:chatcmpl|call)[-_][A-Za-z0-9]{1,64}")  # an answer's or a tool call's id
FINGERPRINT_FORM = re.compile(r"fp_[0-9a-f]{1,32}")  # system_fingerprint; else null
MODEL_SUFFIX_FORM = re.compile(r"-\d{4}-\d{2}-\d{2}|-\d{4}|:latest")  # after the model asked for; else that model
FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})  # else "stop"
TOOL_CALL_TYPE = "function"  # a tool call's only type


class ProxyError(Exception):
    """An answer in OpenAI's error format: ``{"error": {"message", "type", "code", ...}}``."""

    # Not in crossaudit.kernel.errors: the guard proxy's HTTP answer to its own callers (OpenAI's
    # wire format, not ours); it never crosses the gRPC edge.

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": None, **self.extra}}


def invalid(message: str, code: str = "invalid_request") -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", code)


# --- requests -------------------------------------------------------------------------------


def request_messages(body: bytes, max_messages: int) -> tuple[dict[str, Any], list[Any]]:
    """A request body (chat completions or Messages) as a JSON object of Unicode text, and its
    ``messages``: a non-empty list of at most ``max_messages`` (each message is the caller's to check)."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise invalid("the request body is not valid JSON", "invalid_json") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply", "invalid_json") from None
    if not isinstance(payload, dict):
        raise invalid("the request body must be a JSON object")
    try:  # a "\ud800" escape decodes to a lone surrogate: text no evaluator can be sent
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        raise invalid(
            "the request body holds text that is not valid Unicode (a lone surrogate)", "invalid_json"
        ) from None
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "invalid_messages")
    if len(messages) > max_messages:
        raise invalid(f"{len(messages)} messages: at most {max_messages}", "too_many_messages")
    return payload, messages


def parse_request(body: bytes, *, max_messages: int, max_choices: int) -> dict[str, Any]:
    """The request as JSON, with the fields the guard relies on checked."""
    payload, messages = request_messages(body, max_messages)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise invalid(f"messages[{i}] must be an object with a role", "invalid_messages")
    n = payload.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_choices:
        raise invalid(f"'n' must be a whole number from 1 to {max_choices}", "invalid_n")
    stream = payload.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean")
    return payload


def message_text(message: Mapping[str, Any], where: str) -> str | None:
    """The text of a message: its content, or its text parts joined by newlines; None when it
    has no content (an assistant turn of tool calls)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid(
                    f"{where}.content[{j}] is of type {kind!r}: the guard evaluates text only, and does not "
                    "forward what it cannot evaluate",
                    "unsupported_content",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise invalid(f"{where}.content must be a string or a list of parts")


def outside_parts(obj: Any, parts: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """The strings of a message or delta outside its ``role`` and ``content``, by path (a list
    element by its own ``index`` when it has one, as streamed tool calls do), so that pieces of
    one field streamed over several chunks can be put back together; identifiers left out."""
    parts = {} if parts is None else parts
    if not isinstance(obj, dict):
        return parts
    stack: list[tuple[Any, str]] = [(v, k) for k, v in reversed(obj.items()) if k not in ("role", "content")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if value:
                parts.setdefault(path, []).append(value)
        elif isinstance(value, dict):
            stack.extend((v, f"{path}.{k}") for k, v in reversed(value.items()) if k not in NOT_TEXT_KEYS)
        elif isinstance(value, list):
            for pos in range(len(value) - 1, -1, -1):
                item = value[pos]
                idx = item.get("index") if isinstance(item, dict) else None
                key = idx if isinstance(idx, int) and not isinstance(idx, bool) else pos
                stack.append((item, f"{path}[{key}]"))
    return parts


def outside_text(parts: Mapping[str, list[str]]) -> str | None:
    """The text of :func:`outside_parts`: each field whole, one per line; None when there is none."""
    text = "\n".join("".join(pieces) for pieces in parts.values())
    return text or None


def input_targets(messages: Sequence[Mapping[str, Any]], scope: str) -> list[int]:
    """Indices of the messages the input stage evaluates: the last user message, or every
    message (``input_messages: all``)."""
    if scope == "all":
        return list(range(len(messages)))  # an assistant turn of tool calls has no content, yet text
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return [i]
    return []


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            text = message_text(m, "message")
            return text or ""
    return ""


# --- answers --------------------------------------------------------------------------------


def completion_choices(completion: Mapping[str, Any], *, asked: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """Each choice of a JSON answer with its index, by position, once the indices are checked
    to be exactly the integers 0..n-1, each once (at most ``asked`` of them): read by index
    without that check, a repeated or non-integer index let one choice pass unevaluated."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        raise ValueError("the answer has no 'choices' list")
    out: list[tuple[int, dict[str, Any]]] = []
    where: dict[int, int] = {}
    for pos, choice in enumerate(choices):
        idx = _index(choice, f"choices[{pos}]")
        if idx in where:
            raise ValueError(f"choice index {idx} appears twice (choices[{where[idx]}] and choices[{pos}])")
        where[idx] = pos
        out.append((idx, choice))
    _check_indices(where.keys(), asked)
    return out


def completion_outside(completion: Mapping[str, Any], *, asked: int | None = None) -> dict[int, str]:
    """Choice index -> the text its message carries outside its content (choices without any left out)."""
    out: dict[int, str] = {}
    for idx, choice in completion_choices(completion, asked=asked):
        text = outside_text(outside_parts(choice.get("message")))
        if text is not None:
            out[idx] = text
    return out


def completion_texts(completion: Mapping[str, Any], *, asked: int | None = None) -> dict[int, str]:
    """Choice index -> the text of its message (choices without text content are left out)."""
    out: dict[int, str] = {}
    for idx, choice in completion_choices(completion, asked=asked):
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ValueError("a choice has no message")
        content = message.get("content")
        if isinstance(content, str):
            out[idx] = content
        elif content is not None:
            raise ValueError("a choice's content is not text")
    return out


_JSON_KINDS = {
    bool: "a boolean",
    float: "a number with a fraction part",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _index(choice: Any, where: str) -> int:
    """A choice's ``index``, which must be a JSON integer: clients read 0.0 or "0" as choice 0
    (or not), Python reads true as 1; the guard must group text exactly as the caller will."""
    if not isinstance(choice, dict):
        raise ValueError(f"{where} is not an object")
    if "index" not in choice:
        raise ValueError(f"{where} has no index")
    idx = choice["index"]
    if isinstance(idx, bool) or not isinstance(idx, int):
        kind = "null" if idx is None else _JSON_KINDS.get(type(idx), "not a number")
        raise ValueError(f"{where}'s index is {kind}, not an integer")  # never the upstream's value itself
    return idx


def _check_indices(seen: Iterable[int], asked: int | None) -> None:
    """The set of indices an answer used must be 0..n-1, with n at most the choices asked for."""
    indices = sorted(seen)
    if asked is not None and len(indices) > asked:
        raise ValueError(f"{len(indices)} choices, but the request asked for {asked}")
    if indices != list(range(len(indices))):
        more = ", ..." if len(indices) > MAX_INDICES_SHOWN else ""
        shown = ", ".join(str(i) for i in indices[:MAX_INDICES_SHOWN]) + more
        raise ValueError(f"the choices' indices are {shown}, not 0..{len(indices) - 1} each once")


@dataclass(frozen=True)
class Change:
    """What becomes of one choice's text: new text, and whether it is a refusal."""

    text: str
    refused: bool = False


def rewrite_completion(completion: dict[str, Any], changes: Mapping[int, Change]) -> dict[str, Any]:
    out = copy.deepcopy(completion)
    for idx, choice in completion_choices(out):
        change = changes.get(idx)
        if change is None:
            continue
        if choice.get("logprobs") is not None:  # the original answer's tokens, beside its text
            choice["logprobs"] = None
        if change.refused:  # nothing of the refused answer stays: tool calls, reasoning, refusal
            role = (choice.get("message") or {}).get("role") or "assistant"
            choice["message"] = {"role": role, "content": change.text, "refusal": None}
            choice["finish_reason"] = REFUSAL_FINISH_REASON
        else:
            choice["message"]["content"] = change.text
    return out


def refusal_completion(model: Any, text: str, n: int) -> dict[str, Any]:
    """A whole answer made here (the upstream was never called): ``n`` refusals."""
    return {
        "id": f"chatcmpl-crossaudit-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model if isinstance(model, str) else "",
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": REFUSAL_FINISH_REASON,
                "logprobs": None,
            }
            for i in range(n)
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


class Fields:
    """An answer's fields outside its texts, as the proxy sends them: the upstream's value when it
    has the strict form of its field, else the proxy's own (docs/proxy.md#what-the-upstream-writes).
    One per answer, so every chunk of a stream carries the same replacements."""

    def __init__(self, model: Any) -> None:
        self.model = model if isinstance(model, str) else ""  # the caller's, as asked for
        self.id = f"chatcmpl-crossaudit-{uuid.uuid4().hex}"
        self._calls: dict[str, str] = {}  # an invalid tool call id -> the proxy's, one per distinct value

    def top(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """An answer's (or chunk's) top-level fields, checked; its choices as they are."""
        out = dict(obj)
        if "id" in out:
            out["id"] = _formed(ID_FORM, out["id"]) or self.id
        if "model" in out:
            model = out["model"]
            kept = (
                isinstance(model, str)
                and bool(self.model)
                and model.startswith(self.model)
                and (model == self.model or MODEL_SUFFIX_FORM.fullmatch(model, len(self.model)) is not None)
            )
            out["model"] = model if kept else self.model
        if "system_fingerprint" in out:
            out["system_fingerprint"] = _formed(FINGERPRINT_FORM, out["system_fingerprint"])
        if "created" in out and (isinstance(out["created"], bool) or not isinstance(out["created"], int)):
            out["created"] = int(time.time())
        return out

    def finish(self, reason: Any) -> Any:
        return reason if reason is None or (isinstance(reason, str) and reason in FINISH_REASONS) else "stop"

    def choice(self, choice: Any) -> Any:
        """A choice with its finish reason and its tool calls' ids and types checked."""
        if not isinstance(choice, dict):
            return choice
        out = dict(choice)
        if "finish_reason" in out:
            out["finish_reason"] = self.finish(out["finish_reason"])
        for key in ("message", "delta"):
            if isinstance(out.get(key), dict):
                out[key] = self.message(out[key])
        return out

    def message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(message)
        calls = out.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = [self._call(c) for c in calls]
        return out

    def _call(self, call: Any) -> Any:
        if not isinstance(call, dict):
            return call
        out = dict(call)
        if "id" in out and out["id"] is not None and _formed(ID_FORM, out["id"]) is None:
            seen = json.dumps(out["id"], sort_keys=True)
            out["id"] = self._calls.setdefault(seen, f"call_{uuid.uuid4().hex[:24]}")
        if "type" in out and out["type"] is not None:
            out["type"] = TOOL_CALL_TYPE
        return out

    def answer(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A whole completion or chunk, every field outside the texts checked."""
        out = self.top(obj)
        if isinstance(out.get("choices"), list):
            out["choices"] = [self.choice(c) for c in out["choices"]]
        return out


def _formed(form: re.Pattern[str], value: Any) -> str | None:
    return value if isinstance(value, str) and form.fullmatch(value) is not None else None


# --- streams --------------------------------------------------------------------------------


@dataclass
class Chunks:
    """A streamed answer, buffered: each event's data as received and as parsed."""

    raw: list[str] = field(default_factory=list)
    parsed: list[dict[str, Any]] = field(default_factory=list)

    def choices(self, *, asked: int | None = None) -> list[tuple[int, dict[str, Any]]]:
        """Each chunk's choices with their indices, in order, once the whole stream is checked: in
        every chunk each choice has an integer index, none twice, and the stream's indices are
        0..n-1 (at most ``asked``). Choices may interleave; one index is one choice throughout."""
        seen: set[int] = set()
        checked: list[tuple[int, dict[str, Any]]] = []
        for k, chunk in enumerate(self.parsed):
            choices = chunk.get("choices")
            if choices is None:
                continue
            if not isinstance(choices, list):
                raise ValueError(f"event {k}'s choices are not a list")
            here: set[int] = set()
            for pos, choice in enumerate(choices):
                idx = _index(choice, f"event {k}'s choices[{pos}]")
                if idx in here:
                    raise ValueError(f"event {k} carries choice index {idx} twice")
                here.add(idx)
                checked.append((idx, choice))
            seen |= here
        _check_indices(seen, asked)
        return checked

    def outside(self, *, asked: int | None = None) -> dict[int, str]:
        """Choice index -> the text its deltas carry outside the content (each field put together)."""
        parts: dict[int, dict[str, list[str]]] = {}
        for idx, choice in self.choices(asked=asked):
            outside_parts(choice.get("delta"), parts.setdefault(idx, {}))
        texts = {i: outside_text(p) for i, p in parts.items()}
        return {i: t for i, t in texts.items() if t is not None}

    def texts(self, *, asked: int | None = None) -> dict[int, str]:
        """Choice index -> its content, put together from the deltas."""
        out: dict[int, list[str]] = {}
        for idx, choice in self.choices(asked=asked):
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                out.setdefault(idx, []).append(content)
            elif content is not None:
                raise ValueError("a delta's content is not text")
        return {i: "".join(parts) for i, parts in out.items()}

    def replay(self, changes: Mapping[int, Change], fields: Fields | None = None) -> list[bytes]:
        """The SSE events to send: unchanged chunks as received; a changed choice's first content
        delta carries its whole new text, later ones none, and no chunk of it its original tokens
        (``logprobs``); a refused choice keeps nothing but its role and the refusal, in its first
        delta, and finishes with ``content_filter``."""
        self.choices()  # indices checked before any choice is looked up by one
        out: list[bytes] = []
        placed: set[int] = set()
        for raw, chunk in zip(self.raw, self.parsed, strict=True):
            choices = chunk.get("choices") or []
            if not any(c["index"] in changes for c in choices):
                checked = chunk if fields is None else fields.answer(chunk)
                out.append(f"data: {raw}\n\n".encode() if checked == chunk else encode_event(checked))
                continue
            chunk = copy.deepcopy(chunk)
            for choice in chunk["choices"]:
                idx = choice["index"]
                change = changes.get(idx)
                if change is None:
                    continue
                if choice.get("logprobs") is not None:  # the original answer's tokens, beside its text
                    choice["logprobs"] = None
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    if change.refused:
                        for key in [k for k in delta if k not in ("role", "content")]:
                            del delta[key]
                    if ("content" in delta and delta["content"] is not None) or (change.refused and idx not in placed):
                        if idx in placed:
                            del delta["content"]
                        else:
                            delta["content"] = change.text
                            placed.add(idx)
                if change.refused and choice.get("finish_reason") is not None:
                    choice["finish_reason"] = REFUSAL_FINISH_REASON
            out.append(encode_event(chunk if fields is None else fields.answer(chunk)))
        out.append(SSE_DONE)
        return out


def parse_stream(body: bytes) -> Chunks:
    """The chunks of a buffered SSE answer, up to ``[DONE]``. An in-stream ``error`` object, or
    data that is not a JSON object, is an upstream failure (ValueError)."""
    source = EventSource(httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body))
    chunks = Chunks()
    try:
        for event in source.iter_sse():
            if event.data == DONE:
                break
            if not event.data:
                continue
            try:
                obj = json.loads(event.data)
            except ValueError:
                raise ValueError("a streamed event is not JSON") from None
            if not isinstance(obj, dict):
                raise ValueError("a streamed event is not a JSON object")
            if "error" in obj:
                err = obj["error"]
                message = err.get("message") if isinstance(err, dict) else err
                raise ValueError(f"the upstream reported an error mid-stream: {str(message)[:500]}")
            chunks.raw.append(event.data)
            chunks.parsed.append(obj)
    except SSEError as e:
        raise ValueError(f"not an event stream: {e}") from None
    return chunks


def completion_chunks(completion: Mapping[str, Any], *, include_usage: bool) -> list[bytes]:
    """A whole answer as a stream (an upstream that answered JSON to a streamed request, or a
    refusal made here): per choice its role and content, then its finish reason."""
    base = {
        "id": completion.get("id") or f"chatcmpl-crossaudit-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": completion.get("created") or int(time.time()),
        "model": completion.get("model") or "",
    }
    out: list[bytes] = []
    for idx, choice in completion_choices(completion):
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": message.get("role") or "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(message["tool_calls"])]
        out.append(encode_event({**base, "choices": [{"index": idx, "delta": delta, "finish_reason": None}]}))
        finish = choice.get("finish_reason") or "stop"
        out.append(encode_event({**base, "choices": [{"index": idx, "delta": {}, "finish_reason": finish}]}))
    if include_usage and completion.get("usage") is not None:
        out.append(encode_event({**base, "choices": [], "usage": completion["usage"]}))
    out.append(SSE_DONE)
    return out


def encode_event(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


# -- tool calls (docs/agents.md) -----------------------------------------------------------------


@dataclass
class ToolCall:
    """One tool call of an answer's choice: where it is (choice index, position in its
    ``tool_calls``), its id, name and arguments as the model wrote them."""

    choice: int
    position: int
    call_id: str
    name: str
    arguments: str
    key: int | None = None  # a streamed call's own ``index`` (its deltas are grouped by it)


def _call_fields(call: Any) -> tuple[str, str, str]:
    """A tool call's (id, name, arguments); a field of another type is read as empty (the name
    is then empty, which the guard refuses: a call it cannot name is never passed on)."""
    if not isinstance(call, dict):
        return "", "", ""
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else {}
    text = [v if isinstance(v, str) else "" for v in (call.get("id"), fn.get("name"), fn.get("arguments"))]
    return text[0], text[1], text[2]


def completion_tool_calls(completion: Mapping[str, Any], *, asked: int | None = None) -> list[ToolCall]:
    """Every tool call of a JSON answer, choice by choice (a message's ``tool_calls`` list)."""
    out: list[ToolCall] = []
    for idx, choice in completion_choices(completion, asked=asked):
        message = choice.get("message")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise ValueError(f"choice {idx}'s tool_calls is not a list")
        for pos, call in enumerate(calls):
            out.append(ToolCall(idx, pos, *_call_fields(call)))
    return out


def stream_tool_calls(choices: Iterable[tuple[int, Mapping[str, Any]]]) -> list[ToolCall]:
    """Every tool call of a stream, each put back together from its deltas (by choice and the
    call's own ``index``, a JSON integer): the id and name as first given, the arguments'
    fragments joined; ``position`` counts a choice's calls in the order they began."""
    calls: dict[tuple[int, int], list[str]] = {}
    for idx, choice in choices:
        delta = choice.get("delta")
        pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
        if pieces is None:
            continue
        if not isinstance(pieces, list):
            raise ValueError("a delta's tool_calls is not a list")
        for piece in pieces:
            key = piece.get("index") if isinstance(piece, dict) else None
            if isinstance(key, bool) or not isinstance(key, int):
                raise ValueError("a streamed tool call's index is not an integer")
            call_id, name, arguments = _call_fields(piece)
            got = calls.setdefault((idx, key), ["", "", ""])
            got[0] = got[0] or call_id
            got[1] = got[1] or name
            got[2] += arguments
    out: list[ToolCall] = []
    positions: dict[int, int] = {}
    for (idx, key), (call_id, name, arguments) in calls.items():
        position = positions[idx] = positions.get(idx, -1) + 1
        out.append(ToolCall(idx, position, call_id, name, arguments, key))
    return out
