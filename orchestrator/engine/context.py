"""The request context rules see: caller-supplied fields plus engine-derived ones.

Derived: ``time.*`` (hour, minute, day_of_week, date, iso, timestamp in the policy's
timezone) and ``content.*`` (length, hash). Caller-supplied values win, so tests and
gateways can pin ``time.hour`` or ``content.length``; but ``content.hash`` and ``content.length``
are what a custom action's webhook payload renders (``{{content.hash}}``), so a pinned one must be
what the engine would compute in form: a SHA-256 in hex (kept in lower case) and a non-negative
integer, else InvalidInputError. No request text reaches a webhook's row or body through them.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import InvalidInputError

MISSING = object()
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


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
        **(_pinned_content(content) if isinstance(content, dict) else {}),
    }
    return ctx


def _pinned_content(content: dict[str, Any]) -> dict[str, Any]:
    """The caller's ``content``, its ``hash`` and ``length`` checked to be what the engine would
    derive in form (module docstring): a webhook payload renders them."""
    pinned = dict(content)
    if "hash" in pinned:
        value = pinned["hash"]
        if not (isinstance(value, str) and SHA256_HEX.fullmatch(value)):
            raise InvalidInputError("context content.hash, when given, must be a SHA-256 in hex (64 hex digits)")
        pinned["hash"] = value.lower()
    if "length" in pinned:
        value = pinned["length"]
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise InvalidInputError("context content.length, when given, must be a non-negative integer")
    return pinned


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
