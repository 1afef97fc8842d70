"""Which HTTP answers may mend by themselves, and how long the peer asked us to wait.

Webhook and decision-log delivery (``crossaudit.outbox``) and the LLM evaluators
(``orchestrator.evaluators.llm``) both call HTTP peers CrossAudit does not control. They must
agree on which statuses are worth another attempt and read ``Retry-After`` alike, so both are
declared here, once, on the standard library alone (the kernel imports nothing else).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
import re
import time

# Timeouts, conflicts, "too early", rate limits and every server error (529: Anthropic's
# "overloaded"). Any other 4xx will not change by itself, and a redirect is never followed.
RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 425, 429, *range(500, 600)})

# A peer's Retry-After beyond this is taken as this: a confused or hostile peer cannot park a
# message or a call for days. Callers with a configured ceiling pass it as ``cap``.
RETRY_AFTER_MAX_S = 3_600.0

# RFC 9110 §10.2.3: delta-seconds is 1*DIGIT (ASCII). A decimal fraction is accepted as well,
# as some providers send one; a sign, an exponent or a non-ASCII digit is garbage.
_DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# An HTTP-date is 29 characters (IMF-fixdate) and at most 30 in the obsolete forms; a longer
# value is not handed to the date parser.
_MAX_DATE_CHARS = 64


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP answer with ``status`` may succeed if the same request is sent again."""
    return status in RETRYABLE_STATUSES


def parse_retry_after(value: str | None, *, now: float | None = None, cap: float = RETRY_AFTER_MAX_S) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP-date (RFC 9110
    §10.2.3; IMF-fixdate and the obsolete RFC 850 and asctime forms, read as GMT).

    None when there is no value or it is garbage (so the caller's own backoff applies); a date in
    the past is 0.0; anything larger than ``cap`` is ``cap``. ``now`` is the epoch time the
    date is measured from (default: the wall clock).
    """
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)  # however many digits: at worst inf, which the cap takes
    elif not value or len(value) > _MAX_DATE_CHARS:
        return None
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, OverflowError, IndexError):
            return None
        if when.tzinfo is None:  # asctime and "-0000" carry no zone; HTTP dates are GMT
            when = when.replace(tzinfo=dt.UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), cap)
