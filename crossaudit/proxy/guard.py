"""The proxy's side of CrossAudit: one Evaluate call per text, under the caller's CrossAudit key,
and what its decision means for the HTTP answer.

Decisions are made by a running CrossAudit server (the SDK's AsyncClient), so they are audited
there as every decision is, with the proxy's request id; the decision ids go back to the caller
in headers. What a decision does: ``block`` stops the call (an error or a refusal, as
configured); a ``modified_response`` (a ``modify`` rule's redaction) replaces the text; every
other action (flag, require_review, warn, custom, continue, allow) lets the text through
unchanged. CrossAudit not answering fails closed (503) unless ``fail_open`` is set.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crossaudit.kernel.errors import CrossAuditError, ErrorCode
from crossaudit.kernel.results import Action
from crossaudit.proxy.chat import ProxyError
from crossaudit.proxy.config import Caller, ProxyConfig, read_secret
from crossaudit.sdk.client import AsyncClient
from crossaudit.service.models import RemoteDecision

log = logging.getLogger("crossaudit.proxy")

MAX_CLIENTS = 64  # CrossAudit connections kept (one per distinct key); the oldest is closed beyond
# CrossAudit errors that mean "it could not decide now" (fail_open lets the call through on these
# only): a misconfiguration (unknown policy, refused key) always fails closed, and so does
# RESOURCE_EXHAUSTED (the tenant's in-flight cap), which callers can cause at will by calling a lot.
UNAVAILABLE_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED, ErrorCode.INTERNAL})


@dataclass(frozen=True)
class Verdict:
    """One text's decision, as the proxy uses it."""

    decision_id: str  # "" when CrossAudit did not answer and fail_open let the text through
    action: str
    blocked: bool
    text: str | None  # the replacement text (a redaction), or None: unchanged
    block: Mapping[str, Any]  # the block outcome's params (message, error_code, http_status)
    rule: str = ""  # the rule whose block applied


class Guard:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._clients: OrderedDict[str | None, AsyncClient] = OrderedDict()

    def _client(self, caller: Caller) -> AsyncClient:
        """The CrossAudit client of the caller's key (read now: a rotated key file applies to
        the next call)."""
        try:
            key = read_secret(caller.crossaudit_key, f"the CrossAudit key of caller {caller.name!r}")
        except CrossAuditError as e:
            log.error("%s", e.message)
            raise ProxyError(503, "the guard is not available", "server_error", "guard_unavailable") from None
        client = self._clients.get(key)
        if client is None:
            client = AsyncClient(
                self.config.server,
                api_key=key,
                tls=self.config.crossaudit_tls,
                timeout=self.config.limits.evaluation_timeout_s,
            )
            self._clients[key] = client
            while len(self._clients) > MAX_CLIENTS:
                _, old = self._clients.popitem(last=False)
                task = asyncio.get_running_loop().create_task(old.close())
                task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        else:
            self._clients.move_to_end(key)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for c in clients:
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
    ) -> Verdict:
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
            raise ProxyError(
                503, "the guard could not evaluate the request; try again later", "server_error", "guard_unavailable"
            )
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
            if stage == "input":
                raise ProxyError(
                    400, f"the request cannot be evaluated: {e.message}", "invalid_request_error", "guard_rejected"
                )
            raise ProxyError(
                502, f"the model's answer cannot be evaluated: {e.message}", "server_error", "guard_rejected"
            )
        # The proxy's own CrossAudit key refused, or the server's precondition: the operator's to fix.
        log.error("CrossAudit refused the evaluation (%s: %s)", code.value, e.message)
        raise ProxyError(503, "the guard is not available", "server_error", "guard_unavailable")


def verdict_of(decision: RemoteDecision) -> Verdict:
    if decision.action is Action.BLOCK:
        outcome = next((o for o in decision.outcomes if o.action is Action.BLOCK), None)
        params = dict(outcome.params) if outcome is not None else {}
        rule = outcome.rule if outcome is not None else ""
        return Verdict(decision.decision_id, decision.action.value, True, None, params, rule)
    return Verdict(decision.decision_id, decision.action.value, False, decision.modified_response, {})
