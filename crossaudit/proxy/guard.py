"""The proxy's side of CrossAudit: one Evaluate call per text, under the caller's CrossAudit key,
and what its decision means for the HTTP answer.

Decisions are made by a running CrossAudit server (the SDK's AsyncClient), so they are audited
there as every decision is, with the proxy's request id; the decision ids go back to the caller
in headers. What a decision does: ``block`` stops the call (an error or a refusal, as
configured); a ``modified_response`` (a ``modify`` rule's redaction) replaces the text; every
other action (flag, require_review, warn, custom, continue, allow) lets the text through (a
tool call held by require_review excepted: it is dropped like a blocked one, naming its review)
unchanged. CrossAudit not answering fails closed (503) unless ``fail_open`` is set.

A guard failure is answered 503 ``guard_unavailable`` with ``x-should-retry: false`` and a
message saying why: the openai SDKs retry a 503 unless that header says not to, and a retry of a
missing server or a refused key fails the same way, so the caller would only see a slow, flaky
model. :meth:`Guard.check_connection` runs at start, so a proxy with an unreachable CrossAudit or
a wrong key does not start at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, wait_fixed

from crossaudit.api.models import RemoteDecision
from crossaudit.kernel.errors import ConfigurationError, CrossAuditError, ErrorCode, ServerUnavailableError
from crossaudit.kernel.lru import EvictingLRU
from crossaudit.kernel.results import Action
from crossaudit.proxy.chat import ProxyError
from crossaudit.proxy.config import Caller, ProxyConfig, read_secret
from crossaudit.sdk.client import AsyncClient
from crossaudit.sdk.options import API_KEY_ENV, DEFAULT_SERVER
from orchestrator.secrets import SecretGrant

log = logging.getLogger("crossaudit.proxy")

MAX_CLIENTS = 64  # CrossAudit connections kept (one per distinct key); the least recently used is closed beyond
# CrossAudit errors that mean "it could not decide now" (fail_open lets the call through on these
# only): a misconfiguration (unknown policy, refused key) always fails closed, and so does
# RESOURCE_EXHAUSTED (the tenant's in-flight cap), which callers can cause at will by calling a lot.
UNAVAILABLE_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED, ErrorCode.INTERNAL})
# openai-python and openai-node retry 408, 409, 429 and 5xx unless this header says otherwise
# (openai._base_client._should_retry); the guard's failures do not mend within a retry's backoff.
NO_RETRY = {"x-should-retry": "false"}
CHECK_RETRY_S = 0.25  # the start check asks an unreachable CrossAudit again this often


def guard_unavailable(why: str) -> ProxyError:
    """The answer to a call the guard could not evaluate: 503, not to be retried, saying why."""
    return ProxyError(
        503, f"the guard could not evaluate the request: {why}", "server_error", "guard_unavailable", headers=NO_RETRY
    )


@dataclass(frozen=True)
class Verdict:
    """One text's decision, as the proxy uses it."""

    decision_id: str  # "" when CrossAudit did not answer and fail_open let the text through
    action: str
    blocked: bool
    text: str | None  # the replacement text (a redaction), or None: unchanged
    block: Mapping[str, Any]  # the block outcome's params (message, error_code, http_status)
    rule: str = ""  # the rule whose block applied


def _close_later(_key: str | None, client: AsyncClient) -> None:
    """A client evicted for room is closed off the request path (its calls in flight finish)."""
    task = asyncio.get_running_loop().create_task(client.close())
    task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


class Guard:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._clients: EvictingLRU[str | None, AsyncClient] = EvictingLRU(MAX_CLIENTS, _close_later)

    def _client(self, caller: Caller) -> AsyncClient:
        """The CrossAudit client of the caller's key (read now: a rotated key file applies to
        the next call)."""
        try:
            key = read_secret(caller.crossaudit_key, f"the CrossAudit key of caller {caller.name!r}")
        except CrossAuditError as e:
            log.error("%s", e.message)
            raise guard_unavailable(
                "the proxy has no CrossAudit key for this caller (its variable or file is unset; the proxy's log "
                "says which)"
            ) from None
        client = self._clients.get(key)
        if client is None:
            client = AsyncClient(
                self.config.server,
                api_key=key,
                tls=self.config.crossaudit_tls,
                timeout=self.config.limits.evaluation_timeout_s,
            )
            self._clients[key] = client  # beyond MAX_CLIENTS, the least recently used is closed
        return client

    @property
    def server(self) -> str:
        return self.config.server or DEFAULT_SERVER

    async def check_connection(self) -> None:
        """At start: every CrossAudit key the callers use is read and accepted by the server
        (``GetServerInfo``, which every role may call), else ConfigurationError saying what to fix.
        An unreachable server is asked again until ``start_check_timeout_s``; it stops the start
        unless every caller is ``fail_open`` (then a warning: they are served without the guard)."""
        limit = self.config.limits.start_check_timeout_s
        deadline = asyncio.get_running_loop().time() + limit
        checked: set[SecretGrant | None] = set()
        for caller in self.config.callers_list():
            if caller.crossaudit_key in checked:
                continue
            checked.add(caller.crossaudit_key)
            whose = f"the CrossAudit key of caller {caller.name!r}"
            source = caller.crossaudit_key.describe() if caller.crossaudit_key else f"${API_KEY_ENV}"
            try:
                self._client(caller)  # reads the key
            except ProxyError:
                raise ConfigurationError(
                    f"{whose} ({source}) is unset, unreadable or empty: the proxy reads it for every call"
                ) from None
            try:
                info = await self._server_info(caller, deadline)
            except ServerUnavailableError as e:
                waited = f"(waited {limit:g}s: limits.start_check_timeout_s)"
                if all(c.fail_open for c in self.config.callers_list()):
                    log.warning("%s %s; every caller is fail_open: serving without the guard", e.message, waited)
                    return
                raise ConfigurationError(f"the guard proxy needs CrossAudit: {e.message} {waited}") from None
            except CrossAuditError as e:
                refused = f"CrossAudit at {self.server} refused {whose} ({source}): {e.message}"
                raise ConfigurationError(refused) from None
            log.info("CrossAudit at %s accepts %s (tenant %s)", self.server, whose, info.tenant)

    async def _server_info(self, caller: Caller, deadline: float) -> Any:
        """``GetServerInfo`` with the caller's key, asked again every ``CHECK_RETRY_S`` while the
        server is unreachable (it may be starting) until ``deadline`` (loop time). A server that
        accepts the connection but does not answer in time is not asked again."""
        loop = asyncio.get_running_loop()

        async def ask() -> Any:
            async with asyncio.timeout(max(0.1, deadline - loop.time())):
                return await self._client(caller).server_info()

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(ServerUnavailableError),
            wait=wait_fixed(CHECK_RETRY_S),
            stop=lambda _: loop.time() + CHECK_RETRY_S >= deadline,
            reraise=True,
        )
        try:
            return await retrying(ask)
        except TimeoutError:
            raise ServerUnavailableError(f"CrossAudit at {self.server} did not answer") from None

    async def aclose(self) -> None:
        for c in self._clients.drain():
            await c.close()

    async def check(
        self,
        caller: Caller,
        policy: str,
        stage: str,
        *,
        prompt: str,
        response: str,
        context: Mapping[str, Any],
        request_id: str,
        provisional: bool = False,
    ) -> Verdict:
        """``provisional``: a window of a streamed answer, audited by the server only if it blocks."""
        client = self._client(caller)
        try:
            decision = await client.evaluate(
                policy,
                prompt,
                response,
                context,
                environment=caller.environment,
                timeout=self.config.limits.evaluation_timeout_s,
                stage=stage,
                request_id=request_id,
                provisional=provisional,
            )
        except CrossAuditError as e:
            return self._failed(e, caller, policy, stage)
        return verdict_of(decision)

    def _failed(self, e: CrossAuditError, caller: Caller, policy: str, stage: str) -> Verdict:
        code = ErrorCode(e.code) if e.code in ErrorCode.__members__.values() else ErrorCode.INTERNAL
        if code in UNAVAILABLE_CODES:
            if caller.fail_open:
                log.warning(
                    "CrossAudit did not decide (%s: %s); fail_open lets the %s stage of caller %s through",
                    code.value,
                    e.message,
                    stage,
                    caller.name,
                )
                return Verdict("", "fail-open", False, None, {})
            log.warning("CrossAudit did not decide (%s: %s); failing closed", code.value, e.message)
            raise guard_unavailable(self._why(e, code))
        if code is ErrorCode.RESOURCE_EXHAUSTED:
            raise ProxyError(
                503,
                "too many evaluations at once for this caller's tenant; try again later",
                "server_error",
                "guard_overloaded",
            )
        if code is ErrorCode.NOT_FOUND:
            raise ProxyError(
                404,
                f"policy {policy!r} is not deployed in environment {caller.environment!r}",
                "invalid_request_error",
                "policy_not_found",
            )
        if code is ErrorCode.INVALID_ARGUMENT:
            if stage in ("input", "tool_result"):  # the caller's request; else the model's answer
                raise ProxyError(
                    400, f"the request cannot be evaluated: {e.message}", "invalid_request_error", "guard_rejected"
                )
            raise ProxyError(
                502, f"the model's answer cannot be evaluated: {e.message}", "server_error", "guard_rejected"
            )
        # The proxy's own CrossAudit key refused, or the server's precondition: the operator's to fix.
        log.error("CrossAudit refused the evaluation (%s: %s)", code.value, e.message)
        raise guard_unavailable(self._why(e, code))

    def _why(self, e: CrossAuditError, code: ErrorCode) -> str:
        """Why the guard could not decide, for the caller: the cause and whose it is to fix, but
        nothing of CrossAudit's own texts (addresses, store errors), which the proxy's log has."""
        if isinstance(e, ServerUnavailableError):
            return (
                "the proxy cannot reach CrossAudit (its operator must start it or correct crossaudit.server); "
                "a retry will fail the same way until then"
            )
        if code is ErrorCode.DEADLINE_EXCEEDED:
            within = self.config.limits.evaluation_timeout_s
            return f"CrossAudit did not decide within {within:g}s (limits.evaluation_timeout_s)"
        if code is ErrorCode.UNAUTHENTICATED:
            return "CrossAudit refused the proxy's key for this caller (its operator must correct crossaudit_api_key)"
        if code is ErrorCode.PERMISSION_DENIED:
            return "the proxy's CrossAudit key for this caller may not evaluate (it needs role service or admin)"
        if code is ErrorCode.INTERNAL:
            return "CrossAudit failed while deciding (its server log says why)"
        return f"CrossAudit could not decide ({code.value}; its server log says why)"


# A tool call a rule holds for review is not the caller's to make until a reviewer approves it; the
# proxy cannot hold an HTTP answer that long, so it answers as a block would, naming the review.
HELD_CALL_CODE = "held_for_review"


def verdict_of(decision: RemoteDecision) -> Verdict:
    if decision.action is Action.REQUIRE_REVIEW and decision.stage == "tool_call":
        reviews = ", ".join(decision.review_ids) or "pending"
        params = {
            "message": f"the tool call {decision.tool_name or ''} is held for review ({reviews})".replace("  ", " "),
            "error_code": HELD_CALL_CODE,
        }
        outcome = next((o for o in decision.outcomes if o.action is Action.REQUIRE_REVIEW), None)
        return Verdict(decision.decision_id, decision.action.value, True, None, params, outcome.rule if outcome else "")
    if decision.action is Action.BLOCK:
        outcome = next((o for o in decision.outcomes if o.action is Action.BLOCK), None)
        params = dict(outcome.params) if outcome is not None else {}
        rule = outcome.rule if outcome is not None else ""
        return Verdict(decision.decision_id, decision.action.value, True, None, params, rule)
    return Verdict(decision.decision_id, decision.action.value, False, decision.modified_response, {})
