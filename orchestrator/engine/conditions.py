"""The 11 condition operators over context values.

A missing field makes positive operators false and negative ones (not_equals, not_in,
not_contains) true: "user.role not_in [admin]" holds for a request with no role.
IP values are compared against CIDR ranges in in/not_in; regex_match uses RE2.
A caller's value never makes a condition raise: an int past a float's range compares as an
infinity (two ints exactly), and one past the interpreter's int-to-text limit has no text (text
operators do not match it).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from typing import Any

from crossaudit.kernel.dsl import Condition, Operator
from orchestrator.engine.context import MISSING, lookup
from orchestrator.policy.regex import search

NEGATIVE = {Operator.NOT_EQUALS, Operator.NOT_IN, Operator.NOT_CONTAINS}


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        try:
            return float(v)
        except OverflowError:  # an int past a float's range
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _equal(a: Any, b: Any) -> bool:
    """Equality that treats 5, 5.0 and "5" alike (gRPC Structs carry numbers as floats)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b  # exactly: two ints past a float's range are not equal as infinities
    if isinstance(a, int | float) or isinstance(b, int | float):
        na, nb = _num(a), _num(b)
        return na is not None and nb is not None and na == nb
    return bool(a == b)


def _member(value: Any, options: list[Any]) -> bool:
    ip = None
    if isinstance(value, str):
        try:
            ip = ipaddress.ip_address(value.strip())
        except ValueError:
            ip = None
    for opt in options:
        if ip is not None and isinstance(opt, str) and "/" in opt:
            try:
                if ip in ipaddress.ip_network(opt, strict=False):
                    return True
            except ValueError:
                continue
        elif ip is not None and isinstance(opt, str):
            try:
                if ip == ipaddress.ip_address(opt.strip()):
                    return True
            except ValueError:
                pass
        if _equal(value, opt):
            return True
    return False


def _text(v: Any) -> str | None:
    """``str(v)``; None for an int past the interpreter's int-to-text limit (ValueError)."""
    try:
        return str(v)
    except ValueError:
        return None


def _contains(haystack: Any, needle: Any) -> bool:
    if isinstance(haystack, list):
        return any(_equal(x, needle) for x in haystack)
    n, h = _text(needle), None if isinstance(haystack, Mapping) else _text(haystack)
    if n is None:
        return False
    if isinstance(haystack, Mapping):
        return n in haystack
    return h is not None and n in h


def check(cond: Condition, ctx: Mapping[str, Any]) -> bool:
    value = lookup(ctx, cond.field)
    if value is MISSING or value is None:
        return cond.operator in NEGATIVE
    op, target = cond.operator, cond.value
    if op is Operator.EQUALS:
        return _equal(value, target)
    if op is Operator.NOT_EQUALS:
        return not _equal(value, target)
    if op is Operator.CONTAINS:
        return _contains(value, target)
    if op is Operator.NOT_CONTAINS:
        return not _contains(value, target)
    if op in (Operator.STARTS_WITH, Operator.ENDS_WITH, Operator.REGEX_MATCH):
        text, pattern = _text(value), _text(target)
        if text is None or pattern is None:
            return False
        if op is Operator.REGEX_MATCH:
            return search(pattern, text)
        return text.startswith(pattern) if op is Operator.STARTS_WITH else text.endswith(pattern)
    if op is Operator.IN:
        return _member(value, list(target))
    if op is Operator.NOT_IN:
        return not _member(value, list(target))
    if op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        a, b = _num(value), _num(target)
        if a is None or b is None:
            return False
        return a > b if op is Operator.GREATER_THAN else a < b
    raise AssertionError(op)  # pragma: no cover - Operator is exhaustive


def check_all(conds: list[Condition], ctx: Mapping[str, Any]) -> tuple[bool, str]:
    """(all hold, reason naming the first that does not)."""
    for c in conds:
        if not check(c, ctx):
            return False, f"condition not met: {c.field} {c.operator.value} {c.value!r}"
    return True, ""
