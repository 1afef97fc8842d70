"""Sending one webhook: the request a ``custom`` action rendered, signed, to a checked address.

The outbox row holds the request as the decision rendered it: URL, method, headers with their
``${NAME}`` references unexpanded (a secret never lands in the database) and the body bytes
(the same bytes, and so the same signature input, on every retry). At each attempt the headers
are expanded from the secrets granted to the tenant *now*, the destination is checked against
its grant and pinned (:mod:`.destinations`), and the Standard Webhooks headers are added
(:mod:`.signing`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from crossaudit.api.records import OutboxRecord
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.outbox import signing
from crossaudit.outbox.attempts import Attempt
from crossaudit.outbox.destinations import DestinationRefused, Resolver, WebhookGrant, system_resolve
from crossaudit.outbox.limits import DeliveryLimits
from orchestrator.policy import envvars
from orchestrator.secrets import SecretSource, SecretUse

KIND = "webhook"
USER_AGENT = "CrossAudit-Webhooks/1"
# Set by the sender, whatever the policy's headers say.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "user-agent",
        signing.ID_HEADER,
        signing.TIMESTAMP_HEADER,
        signing.SIGNATURE_HEADER,
    }
)


HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")  # RFC 9110 token
MAX_NAME_SHOWN = 64  # of a refused header's name, quoted in the delivery's error


def header_problem(name: str, value: str) -> str | None:
    """Why the HTTP library would refuse this header (RFC 9110 field syntax; httpx sends ASCII
    only), in words that never quote the value: a ``${NAME}`` may have put a secret in it. Such a
    request fails the same way at every attempt, so it is dead at once, not retried."""
    if not HEADER_NAME.match(name):
        return "is not an HTTP token (letters, digits and !#$%&'*+.^_`|~-)"
    if "\r" in value or "\n" in value:
        return "holds a line break"
    if any(c != "\t" and (c < " " or c == "\x7f") for c in value):
        return "holds a control character"
    if not value.isascii():
        return "holds a character outside ASCII"
    if value != value.strip(" \t"):
        return "starts or ends with whitespace"
    return None


def webhook_payload(request: Mapping[str, Any], body: Any, limits: DeliveryLimits) -> dict[str, Any]:
    """The outbox payload of a rendered ``custom`` action (ValueError when the body is too large)."""
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(data.encode()) > limits.max_body_bytes:
        raise ValueError(f"the rendered webhook body is larger than {limits.max_body_bytes} bytes")
    return {
        "url": str(request["url"]),
        "method": str(request.get("method") or "POST"),
        "headers": {str(k): str(v) for k, v in dict(request.get("headers") or {}).items()},
        "body": data,
    }


class WebhookSender:
    """Delivers ``webhook`` outbox rows; one shared HTTP client (no proxies, no redirects)."""

    def __init__(
        self,
        grant_for: Callable[[str], WebhookGrant],
        secrets_for: Callable[[str], SecretSource],
        limits: DeliveryLimits,
        *,
        resolve: Resolver = system_resolve,
    ) -> None:
        self.grant_for = grant_for
        self.secrets_for = secrets_for
        self.limits = limits
        self.resolve = resolve  # names to addresses, each then checked (tests resolve locally)
        self.client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,  # the server's HTTP(S)_PROXY must not carry tenants' calls
            timeout=httpx.Timeout(limits.request_timeout_s, connect=limits.connect_timeout_s),
            limits=httpx.Limits(max_connections=limits.max_inflight, max_keepalive_connections=limits.max_inflight),
            headers={"user-agent": USER_AGENT},
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, msg: OutboxRecord) -> Attempt:
        p = msg.payload
        grant = self.grant_for(msg.tenant)
        secret = grant.secret()
        if not secret:
            return Attempt(False, error="no webhook signing secret is granted to this tenant", permanent=True)
        unusable = signing.secret_problem(secret)
        if unusable is not None:  # a file secret rotated into one that cannot sign: the operator's to fix
            return Attempt(
                False,
                error=f"this tenant's webhook signing secret {unusable}: the operator must fix "
                "webhooks.signing_secret in the API-keys file",
                permanent=True,
            )
        use = SecretUse()
        try:
            extra = envvars.expand(dict(p.get("headers") or {}), self.secrets_for(msg.tenant), use, where="headers")
        except ConfigurationError as exc:
            return Attempt(False, error=exc.message, permanent=True)
        headers = {k: v for k, v in extra.items() if k.lower() not in RESERVED_HEADERS}
        for name, value in headers.items():
            problem = header_problem(name, value)
            if problem is not None:
                shown = name[:MAX_NAME_SHOWN] if HEADER_NAME.match(name) else repr(name[:MAX_NAME_SHOWN])
                return Attempt(
                    False,
                    error=f"header {shown} {problem}, which no HTTP request can carry: fix the policy's "
                    "action_config.headers (or the secret a ${NAME} in it expands to)",
                    permanent=True,
                )
        try:
            origin, address = await grant.pin(str(p["url"]), self.resolve)
        except DestinationRefused as exc:
            return Attempt(False, error=str(exc), permanent=True)
        except OSError as exc:  # DNS failure: may be transient
            return Attempt(False, error=str(exc))
        body = str(p.get("body") or "").encode()
        method = str(p.get("method") or "POST").upper()
        url = httpx.URL(str(p["url"]))
        host_header = url.netloc.decode("ascii").rpartition("@")[2]  # host[:port] as written, never credentials
        pinned = url.copy_with(host=address)
        headers.update(signing.headers(secret, msg.id, body))
        headers["host"] = host_header
        if method != "GET":
            headers["content-type"] = "application/json"
        extensions = {"sni_hostname": origin.host} if origin.scheme == "https" else {}
        try:
            request = self.client.build_request(
                method, pinned, headers=headers, content=body if method != "GET" else None, extensions=extensions
            )
            response = await self.client.send(request, stream=True)
        except httpx.TimeoutException:
            return Attempt(False, error=f"no answer within {self.limits.request_timeout_s:g}s")
        except httpx.LocalProtocolError:  # our request, refused before it left: the same at every attempt
            return Attempt(False, error="the HTTP library refused to send this request", permanent=True)
        except (httpx.HTTPError, OSError) as exc:
            return Attempt(False, error=use.mask(f"{type(exc).__name__}: {exc}") or "connection failed")
        except ValueError:  # a value httpx cannot encode; its message would quote it
            return Attempt(False, error="the HTTP library could not encode this request", permanent=True)
        try:
            detail = await _read_some(response, self.limits.max_response_bytes)
        finally:
            await response.aclose()
        return Attempt.from_status(
            response.status_code,
            response.headers.get("retry-after"),
            use.mask(detail),
            retry_after_max_s=self.limits.retry_after_max_s,
        )


async def _read_some(response: httpx.Response, cap: int) -> str:
    """At most ``cap`` bytes of the answer (a receiver cannot make us read a stream forever)."""
    got = bytearray()
    try:
        async for chunk in response.aiter_raw():
            got.extend(chunk[: cap - len(got)])
            if len(got) >= cap:
                break
    except httpx.HTTPError:
        pass
    return bytes(got[:200]).decode("utf-8", "replace").strip()
