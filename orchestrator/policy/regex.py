"""Linear-time regular expressions (RE2) for ``regex_match``: no catastrophic backtracking.

Patterns are compiled once (LRU) with error logging off (RE2 otherwise writes to stderr)
and a memory cap, so a hostile pattern costs bounded time and memory.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

MAX_PROGRAM_MEMORY = 8 << 20  # bytes RE2 may use to compile one pattern


class RegexError(ValueError):
    """A pattern RE2 refuses. Internal only, not in crossaudit.kernel.errors: policy validation
    compiles every ``regex_match`` pattern and reports this as a PolicyIssue (the engine runs
    validated policies only), so it never crosses an edge."""


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = MAX_PROGRAM_MEMORY
    return opts


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """Compile ``pattern`` with RE2 or raise RegexError with RE2's reason."""
    try:
        return re2.compile(pattern, _options())
    except Exception as e:  # re2._re2.Error
        reason = e.args[0] if e.args else str(e)
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(str(reason)) from None


def search(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).search(text) is not None
