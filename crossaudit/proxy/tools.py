"""An agent's two channels through the guard proxy (docs/agents.md): each ``tool`` message of a
request is evaluated at the ``tool_result`` stage before anything goes upstream (a block stops the
call, a redaction replaces the message's text), and each tool call of the model's answer at the
``tool_call`` stage, all of an answer's calls at once, each its own audited decision (a block drops
that call: the caller gets the policy's error, or the refusal in its place; a redaction replaces
the call's arguments with the redacted ones, still valid JSON). A streamed answer's calls are
judged the same way, each once it is whole: released window by window by stream.py and
toolstream.py, or, in a buffered stream, rewritten in its chunks (:func:`apply_to_stream`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.responses import Response

from crossaudit.proxy import chat
from crossaudit.proxy.call import ProxyCall, evaluate_all
from crossaudit.proxy.chat import Change, ToolCall
from crossaudit.proxy.errors import block_error
from crossaudit.proxy.guard import Verdict

TOOL_RESULT = "tool_result"
TOOL_CALL = "tool_call"


def _tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """Each ``tool`` message's index -> the name of the tool whose call it answers: the call with
    its ``tool_call_id`` in the nearest assistant turn before it (a model may reuse a call id in a
    later turn; a result is never judged under a later call's name)."""
    made: dict[str, str] = {}
    names: dict[int, str] = {}
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                call_id, name, _ = chat._call_fields(call)
                if call_id and name:
                    made[call_id] = name
        elif role == "tool":
            call_id = message.get("tool_call_id")
            names[i] = made.get(call_id, "") if isinstance(call_id, str) else ""
    return names


def has_tool_results(payload: Mapping[str, Any]) -> bool:
    return any(m.get("role") == "tool" for m in payload["messages"])


def _tool(name: str, call_id: str) -> dict[str, str]:
    """The context's ``tool``: the name and id whole, as the caller or model wrote them (the server
    refuses, typed, one longer than engine_limits.max_tool_name_chars; a cut one would be audited
    under a name nobody called)."""
    tool = {"name": name} if name else {}
    if call_id:
        tool["call_id"] = call_id
    return tool


async def tool_result_stage(call: ProxyCall) -> Response | None:
    """Each ``tool`` message's text judged at ``tool_result`` (``tool.name`` from the assistant
    turn whose call it answers, when there is one). The refusal or error when one is blocked
    (nothing has gone upstream); otherwise redactions are written into the messages."""
    messages: list[dict[str, Any]] = call.payload["messages"]
    names = _tool_names(messages)
    jobs: list[tuple[int, str]] = []
    for i, message in enumerate(messages):
        if message.get("role") != "tool":
            continue
        text = chat.message_text(message, f"messages[{i}]")
        jobs.append((i, text or ""))

    def context(i: int) -> dict[str, Any]:
        call_id = messages[i].get("tool_call_id")
        call_id = call_id if isinstance(call_id, str) else ""
        ctx = call.context(TOOL_RESULT, message={"index": i, "role": "tool", "field": "content"})
        ctx["tool"] = _tool(names.get(i, ""), call_id)
        return ctx

    verdicts = await evaluate_all(call, (call.check(TOOL_RESULT, text, text, context(i)) for i, text in jobs))
    call.decisions(TOOL_RESULT, verdicts)
    blocked = next((v for v in verdicts if v.blocked), None)
    if blocked is not None:
        if call.caller.on_block == "refusal":
            return call.refusal(call.n)
        return call.error(block_error(blocked, TOOL_RESULT, call.policy))
    for (i, text), verdict in zip(jobs, verdicts, strict=True):
        if verdict.text is not None and verdict.text != text:
            messages[i]["content"] = verdict.text  # the redacted tool result is what the model reads
    return None


async def judge_calls(call: ProxyCall, calls: Sequence[ToolCall]) -> list[Verdict]:
    """Each tool call judged at ``tool_call``, concurrently (``max_evaluations_per_call``), each
    an audited decision; the prompt is the last user message as sent upstream."""
    prompt = chat.last_user_text(call.payload["messages"])
    verdicts = await evaluate_all(call, (judge_call(call, prompt, tc) for tc in calls))
    call.decisions(TOOL_CALL, verdicts)
    return verdicts


async def judge_call(call: ProxyCall, prompt: str, tc: ToolCall) -> Verdict:
    """One tool call at ``tool_call``: its arguments as the model wrote them, its tool in the context."""
    ctx = call.context(TOOL_CALL, choice=tc.choice, field="tool_calls", position=tc.position)
    ctx["tool"] = _tool(tc.name, tc.call_id)
    return await call.check(TOOL_CALL, prompt, tc.arguments, ctx)


def apply_to_completion(
    call: ProxyCall, completion: dict[str, Any], calls: Sequence[ToolCall], verdicts: Sequence[Verdict]
) -> Response | dict[int, Change]:
    """The judged tool calls written into ``completion``: a blocked one dropped (``on_block:
    error``: the policy's error instead of the answer), a redacted one's arguments replaced. The
    choices whose every call was dropped become the refusal (returned as changes)."""
    dropped: dict[int, set[int]] = {}
    for tc, verdict in zip(calls, verdicts, strict=True):
        if verdict.blocked:
            if call.caller.on_block != "refusal":
                return call.error(block_error(verdict, TOOL_CALL, call.policy))
            dropped.setdefault(tc.choice, set()).add(tc.position)
    choices = dict(chat.completion_choices(completion))
    for tc, verdict in zip(calls, verdicts, strict=True):
        if not verdict.blocked and verdict.text is not None and verdict.text != tc.arguments:
            choices[tc.choice]["message"]["tool_calls"][tc.position]["function"]["arguments"] = verdict.text
    changes: dict[int, Change] = {}
    for idx, positions in dropped.items():
        message = choices[idx]["message"]
        kept = [c for pos, c in enumerate(message["tool_calls"]) if pos not in positions]
        if kept:
            message["tool_calls"] = kept
            message["content"] = call.config.refusal_message  # what the caller gets for the dropped calls
        else:
            changes[idx] = Change(call.config.refusal_message, refused=True)
    return changes


def apply_to_stream(
    call: ProxyCall, chunks: chat.Chunks, calls: Sequence[ToolCall], verdicts: Sequence[Verdict]
) -> Response | dict[int, Change]:
    """A buffered stream's judged tool calls written into its chunks, as apply_to_completion does
    for a JSON answer: a blocked call's deltas dropped (``on_block: error``: the policy's error), a
    redacted one's first fragment carrying the whole redacted arguments and its later fragments
    none; the calls a choice keeps numbered 0, 1, ... as the caller's client groups them."""
    fate: dict[tuple[int, int | None], str | None] = {}  # (choice, call index) -> new arguments, None: dropped
    dropped: dict[int, int] = {}
    for tc, verdict in zip(calls, verdicts, strict=True):
        if verdict.blocked:
            if call.caller.on_block != "refusal":
                return call.error(block_error(verdict, TOOL_CALL, call.policy))
            fate[(tc.choice, tc.key)] = None
            dropped[tc.choice] = dropped.get(tc.choice, 0) + 1
        elif verdict.text is not None and verdict.text != tc.arguments:
            fate[(tc.choice, tc.key)] = verdict.text
    if not fate:
        return {}
    renumber: dict[tuple[int, int | None], int] = {}
    for tc in calls:
        if fate.get((tc.choice, tc.key), "") is not None:
            renumber[(tc.choice, tc.key)] = sum(1 for k in renumber if k[0] == tc.choice)
    placed: set[tuple[int, int | None]] = set()
    for pos, chunk in enumerate(chunks.parsed):
        changed = False
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta")
            pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
            if not isinstance(pieces, list):
                continue
            kept: list[Any] = []
            for piece in pieces:
                where = (choice["index"], piece["index"])
                if where in fate or renumber.get(where) != piece["index"]:
                    changed = True
                if where in fate and fate[where] is None:
                    continue
                piece = {**piece, "index": renumber[where]}
                if where in fate:
                    fn = dict(piece.get("function") or {})
                    fn["arguments"] = "" if where in placed else fate[where]
                    placed.add(where)
                    piece["function"] = fn
                kept.append(piece)
            if kept:
                delta["tool_calls"] = kept
            else:
                del delta["tool_calls"]
        if changed:
            chunks.raw[pos] = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
    changes: dict[int, Change] = {}
    for idx in dropped:
        left = sum(1 for k in renumber if k[0] == idx)
        changes[idx] = Change(call.config.refusal_message, refused=not left)
    return changes
