"""The request context rules see: caller-supplied fields plus engine-derived ones.

Derived: ``time.*`` (hour, minute, day_of_week, date, iso, timestamp in the policy's
timezone) and ``content.*`` (length, hash). Caller-supplied values win, so tests and
gateways can pin ``time.hour`` or ``content.length``.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import InvalidInputError

MISSING = object()
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def build_context(
    context: Mapping[str, Any] | None, response: str, *, timezone: str = "UTC", now: dt.datetime | None = None
) -> dict[str, Any]:
    ctx: dict[str, Any] = copy.deepcopy(dict(context)) if context else {}  # most have none: no deepcopy
    try:
        tz = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInputError(f"unknown timezone {timezone!r}") from None
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(tz)
    derived_time = {
        "hour": moment.hour,
        "minute": moment.minute,
        "day_of_week": DAYS[moment.weekday()],
        "date": moment.date().isoformat(),
        "iso": moment.isoformat(),
        "timestamp": moment.timestamp(),
        "timezone": timezone,
    }
    time_ctx = ctx.get("time")
    ctx["time"] = {**derived_time, **(time_ctx if isinstance(time_ctx, dict) else {})}
    content = ctx.get("content")
    ctx["content"] = {
        "length": len(response),
        "hash": sha256_text(response),
        **(content if isinstance(content, dict) else {}),
    }
    return ctx


def lookup(ctx: Mapping[str, Any], dotted: str) -> Any:
    """Value at a dotted path (``user.role``), or MISSING. Lists accept numeric parts."""
    current: Any = ctx
    for part in dotted.split("."):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return MISSING
    return current
