"""How the guard proxy's failures reach its callers: every one is a :class:`~crossaudit.proxy.chat.ProxyError`
(OpenAI's error format, ``ProxyError.body()``) sent by :func:`error_response`; this module makes
those of a route that does not exist, of a policy's block, and of the upstream (unreachable,
too slow, too large, not a chat answer, or its own error answer passed on less the operator's key).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping

import httpx
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from crossaudit.kernel.errors import CrossAuditError
from crossaudit.proxy.chat import ProxyError
from crossaudit.proxy.config import ProxyConfig, read_secret
from crossaudit.proxy.guard import Verdict
from crossaudit.proxy.messages import error_body
from crossaudit.proxy.stream import Blocked

log = logging.getLogger("crossaudit.proxy")

DEFAULT_BLOCK_STATUS = 403  # the DSL's default block http_status, also for one outside 400-599
MAX_UPSTREAM_ERROR_CHARS = 2000  # of an upstream error body that is not JSON, quoted in ours


def error_response(e: ProxyError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The one way a ProxyError is answered: its body, its status, the call's headers and its own."""
    return JSONResponse(e.body(), status_code=e.status, headers={**(headers or {}), **e.headers})


def _answer_for(request: Request, e: ProxyError) -> JSONResponse:
    """An error of a route the app answers itself: in Anthropic's shape on its Messages route."""
    if request.url.path.endswith("/v1/messages") or "/v1/messages/" in request.url.path:
        return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)
    return error_response(e)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405, in OpenAI's error format."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return _answer_for(
            request, ProxyError(405, "method not allowed", "invalid_request_error", "method_not_allowed")
        )
    return _answer_for(
        request, ProxyError(404, f"no route {request.url.path!r}", "invalid_request_error", "unknown_url")
    )


async def internal_error(request: Request, exc: Exception) -> Response:
    log.error("internal error serving %s", request.url.path, exc_info=exc)
    return _answer_for(request, ProxyError(500, "internal error in the guard proxy", "server_error", "internal_error"))


# -- a policy's block ---------------------------------------------------------------------------


def block_error(verdict: Verdict, stage: str, policy: str) -> ProxyError:
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


def stop_error(blocked: Blocked, policy: str) -> ProxyError:
    """A streamed answer's window that did not pass."""
    if blocked.unredactable:
        return unredactable("choices[0]", policy, DEFAULT_BLOCK_STATUS)
    error = block_error(blocked.verdict, blocked.stage, policy)
    error.extra["crossaudit"]["window"] = blocked.window
    return error


def unredactable(where: str, policy: str, status: int) -> ProxyError:
    """A redaction of text outside a message's content (tool-call arguments, names, refusal,
    reasoning): the guard cannot rewrite those fields faithfully, so it lets none of it through."""
    return ProxyError(
        status,
        f"policy {policy!r} redacts text that {where} carries outside its content (tool-call arguments, names, "
        "refusal, reasoning), which the guard cannot rewrite: nothing of it is passed on",
        "policy_violation",
        "unredactable_content",
    )


# -- the upstream -------------------------------------------------------------------------------


@contextlib.contextmanager
def upstream_errors(timeout_s: float) -> Iterator[None]:
    """httpx's failures (and the deadline) as the caller's 502/504."""
    try:
        yield
    except (TimeoutError, httpx.TimeoutException) as e:
        if isinstance(e, httpx.ConnectTimeout):
            raise unreachable("no connection in time") from None
        raise ProxyError(
            504, f"the upstream did not answer within {timeout_s:g}s", "server_error", "upstream_timeout"
        ) from None
    except httpx.ConnectError as e:
        raise unreachable(str(e) or type(e).__name__) from None
    except httpx.HTTPError as e:
        raise ProxyError(
            502, f"the upstream connection failed: {type(e).__name__}", "server_error", "upstream_error"
        ) from None


def unreachable(why: str) -> ProxyError:
    log.warning("the upstream is unreachable: %s", why)
    return ProxyError(502, "the upstream is unreachable", "server_error", "upstream_unavailable")


def too_large(limit: int) -> ProxyError:
    return ProxyError(
        502,
        f"the upstream's answer is over {limit} bytes, the most the guard holds",
        "server_error",
        "upstream_response_too_large",
    )


def bad_upstream(message: str) -> ProxyError:
    return ProxyError(502, message, "server_error", "upstream_invalid_response")


def no_upstream_credentials() -> ProxyError:
    return ProxyError(502, "the proxy has no upstream credentials", "server_error", "upstream_auth")


def mask(config: ProxyConfig, text: str) -> str:
    """``text`` without the operator's upstream key (an upstream may quote what it was sent)."""
    for grant in (None if config.forward_caller_authorization else config.upstream_key, config.anthropic_key):
        try:
            key = read_secret(grant, "the upstream key")
        except CrossAuditError:
            continue
        text = text.replace(key, "***") if key else text
    return text


def masked(config: ProxyConfig, e: ProxyError) -> ProxyError:
    return ProxyError(e.status, mask(config, e.message), e.type, e.code, headers=e.headers, extra=e.extra)


def upstream_failure(
    config: ProxyConfig, status: int, body: bytes, upstream_headers: httpx.Headers, headers: dict[str, str]
) -> Response:
    """A non-200 upstream answer: the caller's mistakes (4xx) come back as the upstream said
    them, less the operator's key; refused operator credentials and server errors are 502."""
    if status in (401, 403) and not config.forward_caller_authorization:
        log.error("the upstream refused the proxy's credentials (HTTP %d)", status)
        return error_response(
            ProxyError(502, "the upstream refused the proxy's credentials", "server_error", "upstream_auth"),
            headers,
        )
    if 400 <= status < 500:
        text = mask(config, body.decode("utf-8", "replace"))
        try:  # masked again once decoded: JSON escapes ("\/", "\u0041") hide the key from the raw text
            text = mask(config, json.dumps(json.loads(text), ensure_ascii=False))
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
    return error_response(
        ProxyError(502, f"the upstream answered HTTP {status}", "server_error", "upstream_error"), headers
    )
