"""One chat call through the guard proxy: :class:`ProxyCall`, what each part of it reads (the
route's caller and policy, the request, the policy's run settings, the deadline) and writes (the
answer's headers, the redacted request), and the answers it can give: the model's, rewritten by
the output stage, or the proxy's own refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from crossaudit.proxy import chat
from crossaudit.proxy.chat import Change, Chunks, ProxyError
from crossaudit.proxy.config import Caller, PolicyRun, ProxyConfig
from crossaudit.proxy.errors import error_response
from crossaudit.proxy.guard import Guard, Verdict

POLICY_HEADER = "x-crossaudit-policy"  # the policy a call names (request), or that decided (answer)
INPUT_DECISION_HEADER = "x-crossaudit-input-decision-id"
OUTPUT_DECISION_HEADER = "x-crossaudit-output-decision-id"
INPUT_ACTION_HEADER = "x-crossaudit-input-action"
OUTPUT_ACTION_HEADER = "x-crossaudit-output-action"
REQUEST_ID_HEADER = "x-request-id"
MAX_CONTEXT_STRING = 256  # model and user fields copied into the evaluation context, at most
DECISION_HEADERS = {
    "input": (INPUT_DECISION_HEADER, INPUT_ACTION_HEADER),
    "output": (OUTPUT_DECISION_HEADER, OUTPUT_ACTION_HEADER),
    # an agent's stages (docs/agents.md): one decision per tool message / tool call, in order
    "tool_result": ("x-crossaudit-tool-result-decision-id", "x-crossaudit-tool-result-action"),
    "tool_call": ("x-crossaudit-tool-call-decision-id", "x-crossaudit-tool-call-action"),
}


class ModelServer(Protocol):
    """What a call asks of the model server it goes to: crossaudit.proxy.upstream.Upstream (which
    itself takes the call, so this module names the methods it needs rather than importing it)."""

    def deadline(self) -> float: ...

    async def send(
        self, request: Request, method: str, path: str, payload: Mapping[str, Any] | None, deadline: float
    ) -> httpx.Response: ...

    async def read_all(self, resp: httpx.Response, deadline: float) -> bytes: ...

    def read_answer(
        self, body: bytes, upstream_headers: httpx.Headers, stream: bool
    ) -> tuple[dict[str, Any] | None, Chunks | None]: ...


@dataclass
class ProxyCall:
    """One guarded chat call, from its route to its answer."""

    request: Request  # the caller's (its Authorization goes upstream with forward_caller_authorization)
    config: ProxyConfig
    guard: Guard  # CrossAudit: each stage's evaluations
    upstream: ModelServer  # the model server (an Upstream)
    caller: Caller
    policy: str
    run: PolicyRun  # the policy's settings (input_mode, stream, windows)
    payload: dict[str, Any]  # the chat request; the input stage puts its redactions here
    headers: dict[str, str]  # the answer's: request id, policy, each stage's decision ids
    request_id: str
    base: dict[str, Any]  # what every evaluation's context holds (see context())
    deadline: float = 0.0  # the loop time the upstream's answer must be complete by

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    @property
    def include_usage(self) -> bool:
        options = self.payload.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))

    @property
    def n(self) -> int:
        return self.payload.get("n") or 1

    def context(self, stage: str, **proxy: Any) -> dict[str, Any]:
        """An evaluation's context: the call's, with the stage and where the text is from."""
        return {**self.base, "proxy": {**self.base["proxy"], "stage": stage, **proxy}}

    async def check(
        self, stage: str, prompt: str, text: str, context: Mapping[str, Any], *, provisional: bool = False
    ) -> Verdict:
        """One evaluation of ``text`` by the call's policy under its caller's CrossAudit key."""
        return await self.guard.check(
            self.caller, self.policy, stage, prompt=prompt, response=text, context=context,
            request_id=self.request_id, provisional=provisional,
        )  # fmt: skip

    def decisions(self, stage: str, verdicts: Sequence[Verdict]) -> None:
        """Decision ids (and actions) of a stage in the answer's headers, comma-separated in
        message/choice order."""
        if not verdicts:
            return
        id_header, action_header = DECISION_HEADERS[stage]
        self.headers[id_header] = ",".join(v.decision_id for v in verdicts if v.decision_id)
        self.headers[action_header] = ",".join(v.action for v in verdicts)
        if not self.headers[id_header]:
            del self.headers[id_header]

    def error(self, e: ProxyError) -> JSONResponse:
        return error_response(e, self.headers)

    def refusal(self, n: int) -> Response:
        """The proxy's own answer of ``n`` choices, each the refusal message (on_block: refusal)."""
        return self.answer(chat.refusal_completion(self.payload.get("model"), self.config.refusal_message, n))

    def answer(
        self,
        completion: dict[str, Any] | None,
        chunks: Chunks | None = None,
        changes: Mapping[int, Change] | None = None,
        fields: chat.Fields | None = None,
    ) -> Response:
        """The answer to send; ``fields``: the upstream's fields outside its texts are checked
        (None: an answer the proxy made)."""
        if chunks is not None:
            events = chunks.replay(changes or {}, fields)
        else:
            assert completion is not None
            completion = chat.rewrite_completion(completion, changes or {})
            if fields is not None:
                completion = fields.answer(completion)
            if not self.stream:
                return JSONResponse(completion, headers=self.headers)
            events = chat.completion_chunks(completion, include_usage=self.include_usage)
        return StreamingResponse(
            _replay(events), media_type="text/event-stream", headers={**self.headers, "cache-control": "no-cache"}
        )


async def evaluate_all(call: ProxyCall, calls: Iterable[Awaitable[Verdict]]) -> list[Verdict]:
    """A stage's evaluations, ``max_evaluations_per_call`` at a time (a long history checked
    message by message must not exhaust the tenant's in-flight evaluations on its own); the
    first failure (in order) is raised once all have ended."""
    gate = asyncio.Semaphore(call.config.limits.max_evaluations_per_call)

    async def gated(c: Awaitable[Verdict]) -> Verdict:
        async with gate:
            return await c

    results = await asyncio.gather(*(gated(c) for c in calls), return_exceptions=True)
    verdicts: list[Verdict] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        verdicts.append(r)
    return verdicts


def base_context(caller: Caller, payload: Mapping[str, Any]) -> dict[str, Any]:
    """What policies' conditions and evaluators see of the call: the caller's name (from the
    operator's configuration), the model asked for, and the end user the caller names."""
    model = payload.get("model")
    ctx: dict[str, Any] = {
        "proxy": {
            "caller": caller.name,
            "model": model if isinstance(model, str) and len(model) <= MAX_CONTEXT_STRING else "",
        }
    }
    user = payload.get("user")
    if isinstance(user, str) and len(user) <= MAX_CONTEXT_STRING:
        ctx["user"] = {"id": user}
    return ctx


async def _replay(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event
