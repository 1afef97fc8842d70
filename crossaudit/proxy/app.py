"""The guard proxy's HTTP application: OpenAI's ``/v1/chat/completions`` with a CrossAudit policy
applied to the request before it goes upstream and to the answer before it comes back.

One call, in order: the caller's key (401), the policy it names (route or header; 403 when its
key may not use it), the body (413 past the limit, 400 when it is not a chat request), the
input stage (a block never reaches the upstream; a redaction is what goes upstream), the
upstream call (errors as OpenAI-style 502/504; with ``input_mode: parallel`` started beside the
input stage), the output stage (a block is an error or a refusal; a redaction replaces the
answer's text), then the answer: JSON, a stream released window by window (stream.py), or a
buffered stream replayed as SSE. Every answer carries ``x-request-id`` and the decision ids.
docs/proxy.md is the user's guide.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from crossaudit.kernel.errors import CrossAuditError
from crossaudit.proxy import chat
from crossaudit.proxy.chat import Change, Chunks, ProxyError
from crossaudit.proxy.config import Caller, PolicyRun, ProxyConfig, read_secret
from crossaudit.proxy.guard import Guard, Verdict
from crossaudit.proxy.stream import Blocked, StreamGuard, Windows

log = logging.getLogger("crossaudit.proxy")

POLICY_HEADER = "x-crossaudit-policy"  # the policy a call names (request), or that decided (answer)
INPUT_DECISION_HEADER = "x-crossaudit-input-decision-id"
OUTPUT_DECISION_HEADER = "x-crossaudit-output-decision-id"
INPUT_ACTION_HEADER = "x-crossaudit-input-action"
OUTPUT_ACTION_HEADER = "x-crossaudit-output-action"
REQUEST_ID_HEADER = "x-request-id"
MAX_POLICY_NAME = 200  # the DSL's limit on a policy's name
MAX_CONTEXT_STRING = 256  # model and user fields copied into the evaluation context, at most
MAX_DRAIN_BYTES = 16 * 1024 * 1024  # an oversized body is read (and dropped) this far, so the 413 arrives
DEFAULT_BLOCK_STATUS = 403  # the DSL's default block http_status, also for one outside 400-599
EVALUATE_REQUEST_OVERHEAD_BYTES = 16 * 1024  # of an Evaluate request beyond its texts (names, ids, framing)
MAX_UPSTREAM_ERROR_CHARS = 2000  # of an upstream error body that is not JSON, quoted in ours


class ProxyApp:
    """The ASGI application (``.asgi``); the upstream client and CrossAudit clients live in its lifespan."""

    def __init__(self, config: ProxyConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.limits = config.limits
        self.guard = Guard(config)
        self._transport = transport
        self.http: httpx.AsyncClient | None = None
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/policies/{policy}/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/policies/{policy}/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.health, methods=["GET"]),
        ]
        self.asgi = Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers={HTTPException: self._http_error, Exception: self._internal_error},
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.limits.upstream_timeout_s, connect=self.limits.upstream_connect_timeout_s),
            limits=httpx.Limits(max_connections=self.limits.max_upstream_connections),
            trust_env=False,  # what goes upstream is what the configuration says, nothing from ~/.netrc
            follow_redirects=False,  # a redirect never carries the operator's key elsewhere
            transport=self._transport,
        )
        try:
            yield
        finally:
            await self.http.aclose()
            await self.guard.aclose()

    # -- errors --------------------------------------------------------------------------------

    @staticmethod
    def _error(e: ProxyError, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers={**(headers or {}), **e.headers})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            return self._error(ProxyError(405, "method not allowed", "invalid_request_error", "method_not_allowed"))
        return self._error(ProxyError(404, f"no route {request.url.path!r}", "invalid_request_error", "unknown_url"))

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        log.error("internal error serving %s", request.url.path, exc_info=exc)
        return self._error(ProxyError(500, "internal error in the guard proxy", "server_error", "internal_error"))

    # -- who calls, with which policy ------------------------------------------------------------

    def _caller(self, request: Request) -> Caller:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        caller = self.config.caller(token.strip() if scheme.lower() == "bearer" else None)
        if caller is None:
            raise ProxyError(
                401,
                "missing or invalid API key (Authorization: Bearer KEY, a key of the guard proxy)",
                "invalid_request_error",
                "invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        return caller

    def _policy(self, request: Request, caller: Caller) -> str:
        routed = request.path_params.get("policy")
        named = request.headers.get(POLICY_HEADER)
        if routed is not None and named is not None and named != routed:
            raise chat.invalid(
                f"the route names policy {routed!r} and {POLICY_HEADER} names {named!r}", "conflicting_policy"
            )
        policy = routed or named or caller.default_policy
        if not policy:
            raise chat.invalid(
                f"no policy: name one with the {POLICY_HEADER} header or the /policies/NAME/v1 route", "no_policy"
            )
        if len(policy) > MAX_POLICY_NAME:
            raise chat.invalid(f"a policy name has at most {MAX_POLICY_NAME} characters", "invalid_policy")
        if not caller.may_use(policy):
            raise ProxyError(
                403, f"this API key may not use policy {policy!r}", "permission_error", "policy_not_allowed"
            )
        return policy

    async def _body(self, request: Request) -> bytes:
        limit = self.limits.max_request_bytes
        declared = request.headers.get("content-length", "")
        too_large = ProxyError(
            413,
            f"the request body is over {limit} bytes, the guard proxy's limit (limits.max_request_bytes "
            "in its configuration file)",
            "invalid_request_error",
            "request_too_large",
        )
        buf = bytearray()
        over = declared.isdigit() and int(declared) > limit
        seen = 0
        try:  # a body trickled in forever would hold one of max_concurrent_requests for good
            async with asyncio.timeout(self.limits.body_timeout_s):
                async for piece in request.stream():
                    seen += len(piece)
                    if not over:
                        buf += piece
                        over = len(buf) > limit
                    if over and seen > MAX_DRAIN_BYTES:
                        too_large.headers["connection"] = "close"
                        break
        except TimeoutError:
            raise ProxyError(
                408,
                f"the request body did not arrive within {self.limits.body_timeout_s:g}s",
                "invalid_request_error",
                "request_timeout",
                headers={"connection": "close"},
            ) from None
        if over:
            raise too_large
        return bytes(buf)

    # -- routes --------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        headers = {REQUEST_ID_HEADER: uuid.uuid4().hex}
        try:
            caller = self._caller(request)
            if "policy" in request.path_params:
                self._policy(request, caller)
            status, body, upstream_headers = await self._upstream(request, "GET", "/models", None)
            if status != 200:
                return self._upstream_failure(status, body, upstream_headers, headers)
            try:
                answer = json.loads(body)
            except ValueError:
                raise self._bad_upstream("the upstream's model list is not JSON") from None
            return JSONResponse(answer, headers=headers)
        except ProxyError as e:
            return self._error(e, headers)

    async def chat(self, request: Request) -> Response:
        request_id = uuid.uuid4().hex
        headers = {REQUEST_ID_HEADER: request_id}
        try:
            caller = self._caller(request)
            policy = self._policy(request, caller)
            headers[POLICY_HEADER] = quote(policy, safe=" ")
            payload = chat.parse_request(
                await self._body(request), max_messages=self.limits.max_messages, max_choices=self.limits.max_choices
            )
            return await self._guarded(request, caller, policy, payload, headers, request_id)
        except ProxyError as e:
            return self._error(e, headers)

    # -- one guarded call ----------------------------------------------------------------------

    async def _guarded(
        self,
        request: Request,
        caller: Caller,
        policy: str,
        payload: dict[str, Any],
        headers: dict[str, str],
        request_id: str,
    ) -> Response:
        """The input stage, the model, the output stage: each stage may answer in its place."""
        stream = payload.get("stream") is True
        include_usage = _include_usage(payload)
        base = self._context(caller, payload)
        run = self.config.policy_run(policy)
        started = await self._input_then_upstream(request, caller, policy, payload, base, headers, request_id, run)
        if isinstance(started, Response):
            return started
        deadline, resp = started
        if stream and self._windowed(run, payload, resp):
            return await self._streamed(resp, deadline, caller, policy, payload, base, headers, request_id, run)
        body = await self._read_all(resp, deadline)
        status, upstream_headers = resp.status_code, resp.headers
        if status != 200:
            return self._upstream_failure(status, body, upstream_headers, headers)
        completion, chunks = self._read_answer(body, upstream_headers, stream)
        n = payload.get("n") or 1
        try:  # choice indices checked first: exactly 0..k-1, k <= n, so each choice is evaluated once
            if chunks is not None:
                answers, outside = chunks.texts(asked=n), chunks.outside(asked=n)
            else:
                answers = chat.completion_texts(completion or {}, asked=n)
                outside = chat.completion_outside(completion or {}, asked=n)
        except ValueError as e:
            raise self._bad_upstream(f"the upstream's answer is not a chat completion: {e}") from None
        changes = await self._output_stage(
            caller, policy, payload["messages"], answers, outside, base, headers, request_id
        )
        if isinstance(changes, Response):
            return changes
        fields = chat.Fields(payload.get("model"))
        return self._answer(completion, chunks, changes, stream, include_usage, headers, fields)

    async def _input_then_upstream(
        self,
        request: Request,
        caller: Caller,
        policy: str,
        payload: dict[str, Any],
        base: dict[str, Any],
        headers: dict[str, str],
        request_id: str,
        run: PolicyRun,
    ) -> Response | tuple[float, httpx.Response]:
        """The input stage's answer in place of the model's, or the upstream's answer (headers
        read) and the loop time its body must end by. ``input_mode: parallel`` sends the request
        upstream at once, beside the input stage: a refused request's answer is dropped unread,
        and a redacted one is sent again, redacted (the upstream saw the original)."""
        stream = payload.get("stream") is True
        include_usage = _include_usage(payload)
        loop = asyncio.get_running_loop()
        early: asyncio.Task[httpx.Response] | None = None
        deadline = loop.time() + self.limits.upstream_timeout_s
        if run.input_mode == "parallel":
            original = copy.deepcopy(payload)
            early = asyncio.create_task(self._send(request, "POST", "/chat/completions", original, deadline))
        try:
            refused = await self._input_stage(caller, policy, payload, base, headers, request_id, stream, include_usage)
            if refused is not None:
                return refused
            if early is not None and payload != original:  # redacted: the redacted prompt goes upstream
                _discard(early)
                early = None
                deadline = loop.time() + self.limits.upstream_timeout_s
            if early is None:
                return deadline, await self._send(request, "POST", "/chat/completions", payload, deadline)
            resp, early = await early, None
            return deadline, resp
        finally:
            if early is not None:
                _discard(early)

    async def _input_stage(
        self,
        caller: Caller,
        policy: str,
        payload: dict[str, Any],
        base: dict[str, Any],
        headers: dict[str, str],
        request_id: str,
        stream: bool,
        include_usage: bool,
    ) -> Response | None:
        """Each message's content, and apart from it the text it carries elsewhere. A refusal or
        error when the caller may not go on; otherwise the redacted texts are put in ``payload``."""
        messages: list[dict[str, Any]] = payload["messages"]
        jobs: list[tuple[int, str, str]] = []  # (message index, field, text)
        for i in chat.input_targets(messages, self.config.input_messages):
            text = chat.message_text(messages[i], f"messages[{i}]")
            if text is not None:
                jobs.append((i, "content", text))
            outside = chat.outside_text(chat.outside_parts(messages[i]))
            if outside is not None:
                jobs.append((i, "outside", outside))
        verdicts = await self._all(
            self.guard.check(
                caller,
                policy,
                "input",
                prompt=text,
                response=text,
                context={
                    **base,
                    "proxy": {
                        **base["proxy"],
                        "stage": "input",
                        "message": {"index": i, "role": messages[i]["role"][:MAX_CONTEXT_STRING], "field": field},
                    },
                },
                request_id=request_id,
            )
            for i, field, text in jobs
        )
        _decision_headers(headers, INPUT_DECISION_HEADER, INPUT_ACTION_HEADER, verdicts)
        blocked = next((v for v in verdicts if v.blocked), None)
        judged = zip(jobs, verdicts, strict=True)
        stuck = next((i for (i, f, t), v in judged if f == "outside" and _changes(v, t)), None)
        if blocked is not None or stuck is not None:
            if caller.on_block == "refusal":
                n = payload.get("n") or 1
                refusal = chat.refusal_completion(payload.get("model"), self.config.refusal_message, n)
                return self._answer(refusal, None, {}, stream, include_usage, headers)
            if blocked is not None:
                return self._error(self._block_error(blocked, "input", policy), headers)
            return self._error(_unredactable(f"messages[{stuck}]", policy, 400), headers)
        for (i, _field, text), verdict in zip(jobs, verdicts, strict=True):
            if _changes(verdict, text):
                messages[i]["content"] = verdict.text  # the redacted prompt is what goes upstream
        return None

    async def _output_stage(
        self,
        caller: Caller,
        policy: str,
        messages: list[dict[str, Any]],
        answers: Mapping[int, str],
        outside: Mapping[int, str],
        base: dict[str, Any],
        headers: dict[str, str],
        request_id: str,
    ) -> dict[int, Change] | Response:
        """Each choice's content, and apart from it the text it carries elsewhere (tool-call
        arguments, refusal, reasoning): the caller receives that too. The changes to make to the
        answer, or the error that replaces it."""
        prompt = chat.last_user_text(messages)
        found = [(idx, "content", text) for idx, text in answers.items()]
        found += [(idx, "outside", text) for idx, text in outside.items()]
        out_jobs = sorted(found, key=lambda j: (j[0], j[1] != "content"))
        out = await self._all(
            self.guard.check(
                caller,
                policy,
                "output",
                prompt=prompt,
                response=text,
                context={**base, "proxy": {**base["proxy"], "stage": "output", "choice": idx, "field": field}},
                request_id=request_id,
            )
            for idx, field, text in out_jobs
        )
        _decision_headers(headers, OUTPUT_DECISION_HEADER, OUTPUT_ACTION_HEADER, out)
        changes: dict[int, Change] = {}
        for (idx, field, text), verdict in zip(out_jobs, out, strict=True):
            if verdict.blocked or (field == "outside" and _changes(verdict, text)):
                if caller.on_block != "refusal":
                    if verdict.blocked:
                        return self._error(self._block_error(verdict, "output", policy), headers)
                    return self._error(_unredactable(f"choices[{idx}]", policy, DEFAULT_BLOCK_STATUS), headers)
                changes[idx] = Change(self.config.refusal_message, refused=True)
            elif _changes(verdict, text) and not (idx in changes and changes[idx].refused):
                assert verdict.text is not None
                changes[idx] = Change(verdict.text)
        return changes

    @staticmethod
    def _windowed(run: PolicyRun, payload: Mapping[str, Any], resp: httpx.Response) -> bool:
        """A stream evaluated window by window: one choice without logprobs (their tokens spell
        the original text), answered as a stream; others are buffered whole."""
        kind = resp.headers.get("content-type", "").partition(";")[0].strip().lower()
        one = (payload.get("n") or 1) == 1 and not payload.get("logprobs")
        return run.stream == "windows" and one and resp.status_code == 200 and kind == "text/event-stream"

    async def _streamed(
        self,
        resp: httpx.Response,
        deadline: float,
        caller: Caller,
        policy: str,
        payload: dict[str, Any],
        base: dict[str, Any],
        headers: dict[str, str],
        request_id: str,
        run: PolicyRun,
    ) -> Response:
        """A streamed answer released window by window (stream.py). Nothing is sent before the
        first window passed: a block there is the same HTTP error or refusal as a buffered one."""
        prompt = chat.last_user_text(payload["messages"])

        def context(field: str, **more: Any) -> dict[str, Any]:
            proxy = {**base["proxy"], "stage": "output", "choice": 0, "field": field, **more}
            return {**base, "proxy": proxy}

        async def judge(text: str, window: int, final: bool) -> Verdict:
            return await self.guard.check(
                caller, policy, "output", prompt=prompt, response=text, request_id=request_id,
                context=context("content", stream={"window": window, "final": final}), provisional=not final,
            )  # fmt: skip

        async def outside(text: str) -> Verdict:
            return await self.guard.check(
                caller, policy, "output", prompt=prompt, response=text, context=context("outside"),
                request_id=request_id,
            )  # fmt: skip

        include_usage = _include_usage(payload)
        guard = StreamGuard(
            resp,
            Windows(run.window_chars, run.context_chars),
            judge,
            outside,
            deadline=deadline,
            max_bytes=self.limits.max_upstream_response_bytes,
            include_usage=include_usage,
            max_text_bytes=self.limits.max_request_bytes
            - len(prompt.encode("utf-8", "surrogatepass"))
            - len(json.dumps(context("content", stream={"window": 0, "final": True})).encode())
            - EVALUATE_REQUEST_OVERHEAD_BYTES,
            fields=chat.Fields(payload.get("model")),
        )
        events = guard.run()
        try:
            first = await anext(events)
        except ProxyError as e:
            await events.aclose()
            return self._error(self._masked(e), headers)
        if isinstance(first, Blocked):
            await events.aclose()
            _decision_headers(headers, OUTPUT_DECISION_HEADER, OUTPUT_ACTION_HEADER, guard.final or [first.verdict])
            if caller.on_block == "refusal":
                refusal = chat.refusal_completion(payload.get("model"), self.config.refusal_message, 1)
                return self._answer(refusal, None, {}, True, include_usage, headers)
            return self._error(self._stop_error(first, policy), headers)
        if guard.final:  # the whole answer was decided before the first byte: the ids go in headers
            _decision_headers(headers, OUTPUT_DECISION_HEADER, OUTPUT_ACTION_HEADER, guard.final)
        return StreamingResponse(
            self._rest(first, events, guard, caller, policy),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )

    async def _rest(
        self,
        first: bytes,
        events: AsyncGenerator[bytes | Blocked, None],
        guard: StreamGuard,
        caller: Caller,
        policy: str,
    ) -> AsyncIterator[bytes]:
        """The stream after its first window; a window that fails ends it (an error event, or the refusal)."""
        yield first
        try:
            async for item in events:
                if isinstance(item, Blocked):
                    error = None if caller.on_block == "refusal" else self._stop_error(item, policy)
                    for event in guard.cut(self.config.refusal_message, error):
                        yield event
                    return
                yield item
        except ProxyError as e:  # the upstream or the guard failed mid-stream: nothing unevaluated goes
            for event in guard.cut(None, self._masked(e)):
                yield event
        finally:
            await events.aclose()

    def _stop_error(self, blocked: Blocked, policy: str) -> ProxyError:
        if blocked.unredactable:
            return _unredactable("choices[0]", policy, DEFAULT_BLOCK_STATUS)
        error = self._block_error(blocked.verdict, "output", policy)
        error.extra["crossaudit"]["window"] = blocked.window
        return error

    def _masked(self, e: ProxyError) -> ProxyError:
        return ProxyError(e.status, self._mask(e.message), e.type, e.code, headers=e.headers, extra=e.extra)

    async def _all(self, calls: Iterable[Awaitable[Verdict]]) -> list[Verdict]:
        """A stage's evaluations, ``max_evaluations_per_call`` at a time (a long history checked
        message by message must not exhaust the tenant's in-flight evaluations on its own); the
        first failure (in order) is raised once all have ended."""
        gate = asyncio.Semaphore(self.limits.max_evaluations_per_call)

        async def gated(call: Awaitable[Verdict]) -> Verdict:
            async with gate:
                return await call

        results = await asyncio.gather(*(gated(c) for c in calls), return_exceptions=True)
        verdicts: list[Verdict] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            verdicts.append(r)
        return verdicts

    def _context(self, caller: Caller, payload: Mapping[str, Any]) -> dict[str, Any]:
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

    @staticmethod
    def _block_error(verdict: Verdict, stage: str, policy: str) -> ProxyError:
        params = verdict.block
        status = params.get("http_status")
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            status = DEFAULT_BLOCK_STATUS
        message = params.get("message")
        code = params.get("error_code")
        return ProxyError(
            status,
            message if isinstance(message, str) and message else f"blocked by policy {policy!r}",
            "policy_violation",
            code if isinstance(code, str) and code else "policy_violation",
            extra={
                "crossaudit": {
                    "stage": stage,
                    "policy": policy,
                    "rule": verdict.rule,
                    "decision_id": verdict.decision_id,
                }
            },
        )

    def _answer(
        self,
        completion: dict[str, Any] | None,
        chunks: Chunks | None,
        changes: Mapping[int, Change],
        stream: bool,
        include_usage: bool,
        headers: dict[str, str],
        fields: chat.Fields | None = None,
    ) -> Response:
        """The answer to send; ``fields``: the upstream's fields outside its texts are checked
        (None: an answer the proxy made)."""
        if chunks is not None:
            events = chunks.replay(changes, fields)
        else:
            assert completion is not None
            completion = chat.rewrite_completion(completion, changes)
            if fields is not None:
                completion = fields.answer(completion)
            if not stream:
                return JSONResponse(completion, headers=headers)
            events = chat.completion_chunks(completion, include_usage=include_usage)
        return StreamingResponse(
            _replay(events), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
        )

    # -- upstream ------------------------------------------------------------------------------

    def _upstream_headers(self, request: Request, has_body: bool) -> dict[str, str]:
        out = dict(self.config.upstream_headers)
        if has_body:
            out["content-type"] = "application/json"
        out["accept"] = "application/json, text/event-stream"
        if self.config.forward_caller_authorization:
            out["authorization"] = request.headers.get("authorization", "")
        else:
            try:
                key = read_secret(self.config.upstream_key, "the upstream key")
            except CrossAuditError as e:
                log.error("%s", e.message)
                raise ProxyError(
                    502, "the proxy has no upstream credentials", "server_error", "upstream_auth"
                ) from None
            if key:
                out["authorization"] = f"Bearer {key}"
        return out

    async def _upstream(
        self, request: Request, method: str, path: str, payload: Mapping[str, Any] | None
    ) -> tuple[int, bytes, httpx.Headers]:
        """The upstream's status, whole body (bounded) and headers."""
        deadline = asyncio.get_running_loop().time() + self.limits.upstream_timeout_s
        resp = await self._send(request, method, path, payload, deadline)
        body = await self._read_all(resp, deadline)
        return resp.status_code, body, resp.headers

    async def _send(
        self, request: Request, method: str, path: str, payload: Mapping[str, Any] | None, deadline: float
    ) -> httpx.Response:
        """The upstream's answer, its headers read and its body not (the caller closes it)."""
        assert self.http is not None
        headers = self._upstream_headers(request, payload is not None)
        content = json.dumps(payload).encode() if payload is not None else None
        req = self.http.build_request(method, self.config.upstream_url + path, content=content, headers=headers)
        with self._upstream_errors():
            async with asyncio.timeout_at(deadline):
                return await self.http.send(req, stream=True)

    async def _read_all(self, resp: httpx.Response, deadline: float) -> bytes:
        """The upstream's whole body (at most max_upstream_response_bytes), by ``deadline``; then closed."""
        limit = self.limits.max_upstream_response_bytes
        try:
            with self._upstream_errors():
                async with asyncio.timeout_at(deadline):
                    declared = resp.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limit:
                        raise self._too_large(limit)
                    buf = bytearray()
                    async for piece in resp.aiter_bytes():
                        buf += piece
                        if len(buf) > limit:
                            raise self._too_large(limit)
                    return bytes(buf)
        finally:
            await resp.aclose()

    @contextlib.contextmanager
    def _upstream_errors(self) -> Iterator[None]:
        """httpx's failures (and the deadline) as the caller's 502/504."""
        try:
            yield
        except (TimeoutError, httpx.TimeoutException) as e:
            if isinstance(e, httpx.ConnectTimeout):
                raise self._unreachable("no connection in time") from None
            raise ProxyError(
                504,
                f"the upstream did not answer within {self.limits.upstream_timeout_s:g}s",
                "server_error",
                "upstream_timeout",
            ) from None
        except httpx.ConnectError as e:
            raise self._unreachable(str(e) or type(e).__name__) from None
        except httpx.HTTPError as e:
            raise ProxyError(
                502, f"the upstream connection failed: {type(e).__name__}", "server_error", "upstream_error"
            ) from None

    @staticmethod
    def _unreachable(why: str) -> ProxyError:
        log.warning("the upstream is unreachable: %s", why)
        return ProxyError(502, "the upstream is unreachable", "server_error", "upstream_unavailable")

    @staticmethod
    def _too_large(limit: int) -> ProxyError:
        return ProxyError(
            502,
            f"the upstream's answer is over {limit} bytes, the most the guard holds",
            "server_error",
            "upstream_response_too_large",
        )

    @staticmethod
    def _bad_upstream(message: str) -> ProxyError:
        return ProxyError(502, message, "server_error", "upstream_invalid_response")

    def _mask(self, text: str) -> str:
        """``text`` without the operator's upstream key (an upstream may quote what it was sent)."""
        if self.config.forward_caller_authorization:
            return text
        try:
            key = read_secret(self.config.upstream_key, "the upstream key")
        except CrossAuditError:
            return text
        return text.replace(key, "***") if key else text

    def _upstream_failure(
        self, status: int, body: bytes, upstream_headers: httpx.Headers, headers: dict[str, str]
    ) -> Response:
        """A non-200 upstream answer: the caller's mistakes (4xx) come back as the upstream said
        them, less the operator's key; refused operator credentials and server errors are 502."""
        if status in (401, 403) and not self.config.forward_caller_authorization:
            log.error("the upstream refused the proxy's credentials (HTTP %d)", status)
            return self._error(
                ProxyError(502, "the upstream refused the proxy's credentials", "server_error", "upstream_auth"),
                headers,
            )
        if 400 <= status < 500:
            text = self._mask(body.decode("utf-8", "replace"))
            try:  # masked again once decoded: JSON escapes ("\/", "\u0041") hide the key from the raw text
                text = self._mask(json.dumps(json.loads(text), ensure_ascii=False))
                answer = json.loads(text)
            except (ValueError, RecursionError):
                answer = None
            if not isinstance(answer, dict) or "error" not in answer:
                answer = ProxyError(
                    status, text[:MAX_UPSTREAM_ERROR_CHARS] or f"HTTP {status}", "upstream_error", "upstream_error"
                ).body()
            extra = {k: upstream_headers[k] for k in ("retry-after",) if k in upstream_headers}
            return JSONResponse(answer, status_code=status, headers={**headers, **extra})
        log.warning("the upstream answered HTTP %d", status)
        return self._error(
            ProxyError(502, f"the upstream answered HTTP {status}", "server_error", "upstream_error"), headers
        )

    def _read_answer(
        self, body: bytes, upstream_headers: httpx.Headers, stream: bool
    ) -> tuple[dict[str, Any] | None, Chunks | None]:
        """A JSON completion, or (for a streamed request answered as a stream) its chunks."""
        kind = upstream_headers.get("content-type", "").partition(";")[0].strip().lower()
        if stream and kind == "text/event-stream":
            try:
                return None, chat.parse_stream(body)
            except ValueError as e:
                raise self._bad_upstream(self._mask(str(e))) from None
        try:
            completion = json.loads(body)
        except ValueError:
            raise self._bad_upstream("the upstream's answer is not JSON") from None
        if not isinstance(completion, dict):
            raise self._bad_upstream("the upstream's answer is not a JSON object")
        return completion, None


def _decision_headers(headers: dict[str, str], id_header: str, action_header: str, verdicts: Sequence[Verdict]) -> None:
    """Decision ids (and actions) of a stage, comma-separated in message/choice order."""
    if not verdicts:
        return
    headers[id_header] = ",".join(v.decision_id for v in verdicts if v.decision_id)
    headers[action_header] = ",".join(v.action for v in verdicts)
    if not headers[id_header]:
        del headers[id_header]


def _include_usage(payload: Mapping[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _discard(task: asyncio.Task[httpx.Response]) -> None:
    """An upstream call started beside the input stage, not wanted: stopped, or its answer closed unread."""

    def close(t: asyncio.Task[httpx.Response]) -> None:
        if not t.cancelled() and t.exception() is None:
            asyncio.get_running_loop().create_task(t.result().aclose())

    task.cancel()
    task.add_done_callback(close)


def _changes(verdict: Verdict, text: str) -> bool:
    return verdict.text is not None and verdict.text != text


def _unredactable(where: str, policy: str, status: int) -> ProxyError:
    """A redaction of text outside a message's content (tool-call arguments, names, refusal,
    reasoning): the guard cannot rewrite those fields faithfully, so it lets none of it through."""
    return ProxyError(
        status,
        f"policy {policy!r} redacts text that {where} carries outside its content (tool-call arguments, names, "
        "refusal, reasoning), which the guard cannot rewrite: nothing of it is passed on",
        "policy_violation",
        "unredactable_content",
    )


async def _replay(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event
