"""A guarded call's stages: :func:`guarded` runs the input stage, the upstream call (after it, or
beside it with ``input_mode: parallel``) and the output stage, each of which may answer in the
model's place. The input stage evaluates the request's messages (a block never reaches the
upstream; a redaction is what goes upstream), the output stage each choice of the answer (a block
is an error or a refusal; a redaction replaces the choice's text). A stream evaluated window by
window is upstream.py's.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import httpx
from starlette.responses import Response

from crossaudit.proxy import chat, tools
from crossaudit.proxy.call import MAX_CONTEXT_STRING, ProxyCall, evaluate_all
from crossaudit.proxy.chat import Change
from crossaudit.proxy.errors import DEFAULT_BLOCK_STATUS, bad_upstream, block_error, unredactable, upstream_failure
from crossaudit.proxy.guard import Verdict
from crossaudit.proxy.upstream import discard, streamed, windowed

CHAT_PATH = "/chat/completions"


async def guarded(call: ProxyCall) -> Response:
    """The input stage, the model, the output stage: each stage may answer in its place."""
    started = await _input_then_upstream(call)
    if isinstance(started, Response):
        return started
    resp = started
    if call.stream and windowed(call, resp):
        return await streamed(call, resp)
    body = await call.upstream.read_all(resp, call.deadline)
    status, upstream_headers = resp.status_code, resp.headers
    if status != 200:
        return upstream_failure(call.config, status, body, upstream_headers, call.headers)
    completion, chunks = call.upstream.read_answer(body, upstream_headers, call.stream)
    try:  # choice indices checked first: exactly 0..k-1, k <= n, so each choice is evaluated once
        if chunks is not None:
            answers, outside = chunks.texts(asked=call.n), chunks.outside(asked=call.n)
            calls = chat.stream_tool_calls(chunks.choices(asked=call.n))
        else:
            answers = chat.completion_texts(completion or {}, asked=call.n)
            outside = chat.completion_outside(completion or {}, asked=call.n)
            calls = chat.completion_tool_calls(completion or {}, asked=call.n)
    except ValueError as e:
        raise bad_upstream(f"the upstream's answer is not a chat completion: {e}") from None
    changes, verdicts = await asyncio.gather(output_stage(call, answers, outside), _judged(call, calls))
    if isinstance(changes, Response):
        return changes
    if calls:  # each tool call at the tool_call stage (docs/agents.md)
        if chunks is not None:
            applied = tools.apply_to_stream(call, chunks, calls, verdicts)
        else:
            assert completion is not None
            applied = tools.apply_to_completion(call, completion, calls, verdicts)
        if isinstance(applied, Response):
            return applied
        for idx, change in applied.items():  # a choice whose every call was dropped is the refusal
            if not (idx in changes and changes[idx].refused):
                changes[idx] = change
    return call.answer(completion, chunks, changes, chat.Fields(call.payload.get("model")))


async def _judged(call: ProxyCall, calls: list[chat.ToolCall]) -> list[Verdict]:
    return await tools.judge_calls(call, calls) if calls else []


async def _input_then_upstream(call: ProxyCall) -> Response | httpx.Response:
    """The input stage's answer in place of the model's, or the upstream's answer (headers
    read; ``call.deadline`` the loop time its body must end by). ``input_mode: parallel`` sends
    the request upstream at once, beside the input stage: a refused request's answer is dropped
    unread, and a redacted one is sent again, redacted (the upstream saw the original)."""
    early: asyncio.Task[httpx.Response] | None = None
    call.deadline = call.upstream.deadline()
    results = tools.has_tool_results(call.payload)
    if results:  # tool messages are judged before any byte goes upstream, whatever the input mode
        refused = await tools.tool_result_stage(call)
        if refused is not None:
            return refused
    if call.run.input_mode == "parallel" and not results:
        original = copy.deepcopy(call.payload)
        early = asyncio.create_task(call.upstream.send(call.request, "POST", CHAT_PATH, original, call.deadline))
    try:
        refused = await input_stage(call)
        if refused is not None:
            return refused
        if early is not None and call.payload != original:  # redacted: the redacted prompt goes upstream
            discard(early)
            early = None
            call.deadline = call.upstream.deadline()
        if early is None:
            return await call.upstream.send(call.request, "POST", CHAT_PATH, call.payload, call.deadline)
        resp, early = await early, None
        return resp
    finally:
        if early is not None:
            discard(early)


async def input_stage(call: ProxyCall) -> Response | None:
    """Each message's content, and apart from it the text it carries elsewhere. A refusal or
    error when the caller may not go on; otherwise the redacted texts are put in ``call.payload``."""
    messages: list[dict[str, Any]] = call.payload["messages"]
    jobs: list[tuple[int, str, str]] = []  # (message index, field, text)
    for i in chat.input_targets(messages, call.config.input_messages):
        text = chat.message_text(messages[i], f"messages[{i}]")
        if text is not None:
            jobs.append((i, "content", text))
        outside = chat.outside_text(chat.outside_parts(messages[i]))
        if outside is not None:
            jobs.append((i, "outside", outside))
    verdicts = await evaluate_all(
        call,
        (
            call.check("input", text, text, call.context("input", message=_where(messages, i, field)))
            for i, field, text in jobs
        ),
    )
    call.decisions("input", verdicts)
    blocked = next((v for v in verdicts if v.blocked), None)
    judged = zip(jobs, verdicts, strict=True)
    stuck = next((i for (i, f, t), v in judged if f == "outside" and _changes(v, t)), None)
    if blocked is not None or stuck is not None:
        if call.caller.on_block == "refusal":
            return call.refusal(call.n)
        if blocked is not None:
            return call.error(block_error(blocked, "input", call.policy))
        return call.error(unredactable(f"messages[{stuck}]", call.policy, 400))
    for (i, _field, text), verdict in zip(jobs, verdicts, strict=True):
        if _changes(verdict, text):
            messages[i]["content"] = verdict.text  # the redacted prompt is what goes upstream
    return None


def _where(messages: list[dict[str, Any]], i: int, field: str) -> dict[str, Any]:
    """An input evaluation's message, in its context."""
    return {"index": i, "role": messages[i]["role"][:MAX_CONTEXT_STRING], "field": field}


async def output_stage(
    call: ProxyCall, answers: Mapping[int, str], outside: Mapping[int, str]
) -> dict[int, Change] | Response:
    """Each choice's content, and apart from it the text it carries elsewhere (tool-call
    arguments, refusal, reasoning): the caller receives that too. The changes to make to the
    answer, or the error that replaces it."""
    prompt = chat.last_user_text(call.payload["messages"])
    found = [(idx, "content", text) for idx, text in answers.items()]
    found += [(idx, "outside", text) for idx, text in outside.items()]
    jobs = sorted(found, key=lambda j: (j[0], j[1] != "content"))
    verdicts = await evaluate_all(
        call,
        (
            call.check("output", prompt, text, call.context("output", choice=idx, field=field))
            for idx, field, text in jobs
        ),
    )
    call.decisions("output", verdicts)
    changes: dict[int, Change] = {}
    for (idx, field, text), verdict in zip(jobs, verdicts, strict=True):
        if verdict.blocked or (field == "outside" and _changes(verdict, text)):
            if call.caller.on_block != "refusal":
                if verdict.blocked:
                    return call.error(block_error(verdict, "output", call.policy))
                return call.error(unredactable(f"choices[{idx}]", call.policy, DEFAULT_BLOCK_STATUS))
            changes[idx] = Change(call.config.refusal_message, refused=True)
        elif _changes(verdict, text) and not (idx in changes and changes[idx].refused):
            assert verdict.text is not None
            changes[idx] = Change(verdict.text)
    return changes


def _changes(verdict: Verdict, text: str) -> bool:
    return verdict.text is not None and verdict.text != text
