"""The guard proxy's HTTP application: OpenAI's ``/v1/chat/completions`` with a CrossAudit policy
applied to the request before it goes upstream and to the answer before it comes back.

This module is its routing: the app and its routes, and what a call must pass before its stages
run: the caller's key (401), the policy it names (route or header; 403 when its key may not use
it), the body (413 past the limit, 408 when it does not arrive, 400 when it is not a chat
request). Then, one :class:`~crossaudit.proxy.call.ProxyCall` at a time: stages.py (the input
stage, the upstream call, the output stage), upstream.py (the model server; a stream released
window by window), errors.py (every failure as OpenAI's error answer). Every answer carries
``x-request-id`` and the decision ids. docs/proxy.md is the user's guide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from crossaudit.proxy import chat, messages_call
from crossaudit.proxy import messages as msgs
from crossaudit.proxy.call import POLICY_HEADER, REQUEST_ID_HEADER, ProxyCall, base_context
from crossaudit.proxy.chat import ProxyError
from crossaudit.proxy.config import Caller, ProxyConfig
from crossaudit.proxy.errors import bad_upstream, error_response, http_error, internal_error, masked, upstream_failure
from crossaudit.proxy.guard import Guard
from crossaudit.proxy.stages import guarded
from crossaudit.proxy.upstream import Upstream

MAX_POLICY_NAME = 200  # the DSL's limit on a policy's name
MAX_DRAIN_BYTES = 16 * 1024 * 1024  # an oversized body is read (and dropped) this far, so the 413 arrives


class ProxyApp:
    """The ASGI application (``.asgi``); the upstream client and CrossAudit clients live in its lifespan."""

    def __init__(self, config: ProxyConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.limits = config.limits
        self.guard = Guard(config)
        self.upstream = Upstream(config, transport)
        self.anthropic = Upstream(config, transport, anthropic=True)  # used when anthropic_url is set
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/policies/{policy}/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/policies/{policy}/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/policies/{policy}/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.health, methods=["GET"]),
        ]
        self.asgi = Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers={HTTPException: http_error, Exception: internal_error},
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        self.upstream.open()
        self.anthropic.open()
        try:
            yield
        finally:
            await self.upstream.aclose()
            await self.anthropic.aclose()
            await self.guard.aclose()

    # -- who calls, with which policy ------------------------------------------------------------

    def _caller(self, request: Request, *, x_api_key: bool = False) -> Caller:
        """``x_api_key``: the key may come as Anthropic's SDKs send it (``x-api-key: KEY``)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else None
        if key is None and x_api_key:
            key = request.headers.get("x-api-key", "").strip() or None
        caller = self.config.caller(key)
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
            status, body, upstream_headers = await self.upstream.fetch(request, "GET", "/models", None)
            if status != 200:
                return upstream_failure(self.config, status, body, upstream_headers, headers)
            try:
                answer = json.loads(body)
            except ValueError:
                raise bad_upstream("the upstream's model list is not JSON") from None
            return JSONResponse(answer, headers=headers)
        except ProxyError as e:
            return error_response(e, headers)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (messages_call.py), its errors in Anthropic's shape."""
        request_id = uuid.uuid4().hex
        headers = {REQUEST_ID_HEADER: request_id}
        try:
            if not self.config.anthropic_url:
                raise ProxyError(
                    404,
                    "this proxy serves no Anthropic upstream (anthropic_upstream.url in its configuration)",
                    "invalid_request_error",
                    "no_anthropic_upstream",
                )
            caller = self._caller(request, x_api_key=True)
            policy = self._policy(request, caller)
            headers[POLICY_HEADER] = quote(policy, safe=" ")
            msgs.check_version(request.headers.get("anthropic-version"))
            payload = msgs.parse_request(await self._body(request), max_messages=self.limits.max_messages)
            call = self._call(request, self.anthropic, caller, policy, payload, headers, request_id)
            return await messages_call.guarded(call)
        except ProxyError as e:
            return msgs.error_response(masked(self.config, e), headers)

    def _call(
        self,
        request: Request,
        upstream: Upstream,
        caller: Caller,
        policy: str,
        payload: dict[str, Any],
        headers: dict[str, str],
        request_id: str,
    ) -> ProxyCall:
        """One request's ProxyCall, whichever API it came in by (``upstream``: that API's model)."""
        return ProxyCall(
            request=request,
            config=self.config,
            guard=self.guard,
            upstream=upstream,
            caller=caller,
            policy=policy,
            run=self.config.policy_run(policy),
            payload=payload,
            headers=headers,
            request_id=request_id,
            base=base_context(caller, payload),
        )

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
            call = self._call(request, self.upstream, caller, policy, payload, headers, request_id)
            return await guarded(call)
        except ProxyError as e:
            return error_response(e, headers)
