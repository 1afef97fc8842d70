"""Webhook signatures in the Standard Webhooks scheme (as Svix, Clerk, Resend and others send).

Every request carries::

    webhook-id: <delivery id>            stable across retries: receivers deduplicate on it
    webhook-timestamp: <unix seconds>    of this attempt: receivers reject old ones (replays)
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>

The key is the tenant's signing secret: a ``whsec_``-prefixed secret is base64 after the prefix
(the Standard Webhooks form, so its libraries verify our requests as they are); any other secret
is used as its UTF-8 bytes. :func:`verify` is what a receiver does (tests use it, and
docs/webhooks.md shows it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time

from crossaudit.kernel.errors import ConfigurationError

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_S = 300  # what receivers should accept between the timestamp and their clock
MIN_SECRET_BYTES = 16  # a shorter signing secret is refused when the keys file is read


class SignatureError(ValueError):
    """A request whose signature or timestamp does not verify."""

    # Not in crossaudit.kernel.errors: raised by verify(), a helper for the receivers of our
    # webhooks, in their process; the server never raises it, so it never crosses the gRPC edge.


def secret_key(secret: str) -> bytes:
    """The HMAC key of a signing secret; ConfigurationError (never quoting it) when a ``whsec_``
    secret is not base64: it is the operator's setting, not a failure of one delivery."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError("a whsec_ signing secret must be base64 after the prefix") from None
    return secret.encode("utf-8")


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot sign, in words that never quote it; None when it can. Checked when
    the keys file is loaded and again at each attempt (a file secret may be rotated)."""
    try:
        key = secret_key(secret)
    except ConfigurationError:
        return "is not base64 after its whsec_ prefix (the Standard Webhooks form: whsec_ then base64)"
    if len(key) < MIN_SECRET_BYTES:
        return f"is shorter than {MIN_SECRET_BYTES} bytes"
    return None


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def headers(secret: str, delivery_id: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    ts = int(time.time() if now is None else now)
    return {ID_HEADER: delivery_id, TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: sign(secret, delivery_id, ts, body)}


def verify(
    secret: str,
    received: dict[str, str],
    body: bytes,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> None:
    """Raise SignatureError unless ``received`` (header name -> value, any case) signs ``body``."""
    lower = {k.lower(): v for k, v in received.items()}
    try:
        delivery_id, ts = lower[ID_HEADER], int(lower[TIMESTAMP_HEADER])
        offered = lower[SIGNATURE_HEADER].split()
    except (KeyError, ValueError):
        raise SignatureError("missing or malformed webhook-id / webhook-timestamp / webhook-signature") from None
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        raise SignatureError("timestamp outside the tolerance (a replay, or a skewed clock)")
    expected = sign(secret, delivery_id, ts, body)
    if not any(hmac.compare_digest(expected, sig) for sig in offered):  # several when a key rotates
        raise SignatureError("no signature matches")
