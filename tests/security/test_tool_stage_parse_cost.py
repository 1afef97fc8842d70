"""A tool call's arguments are measured (their nesting, ``engine_limits.max_tool_arguments_depth``)
before they are parsed, on the server's event loop, for text that need not be JSON. Text the model
writes to defeat that scan (a string that never ends, made of escaped quotes or backslashes, each a
place a string literal could start) is refused as ``InvalidInputError`` in linear time: a
backtracking scan took 33 s for 40 KB and would block every tenant for hours at
``engine_limits.max_content_bytes``."""

from __future__ import annotations

import time

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.limits import EngineLimits
from orchestrator.engine.tools import nesting_depth, parse_arguments

LIMITS = EngineLimits()
N = LIMITS.max_content_bytes // 2 - 32
BUDGET_S = 5.0  # linear is well under a second


@pytest.mark.parametrize(
    "text",
    [
        '"' + '\\"' * N,  # an unterminated string of escaped quotes
        '{"a": "' + '\\"' * N,
        '"a' * N,  # a string opening at every other character
        '"' + "\\" * (2 * N - 1),  # backslashes to the end
        "[" * 40 + '"' + '\\"' * N,
    ],
)
def test_text_that_defeats_a_backtracking_scan_is_refused_in_linear_time(text: str) -> None:
    assert len(text.encode()) <= LIMITS.max_content_bytes
    t0 = time.process_time()
    with pytest.raises(InvalidInputError, match=r"not valid JSON|nested"):
        parse_arguments(text, LIMITS.max_tool_arguments_depth)
    assert time.process_time() - t0 < BUDGET_S


def test_brackets_after_an_unterminated_string_are_not_counted_and_before_it_are() -> None:
    assert nesting_depth("[[[" + '"' + "[[[[") == 3
    assert nesting_depth('["\\\\", [["x\\"]"]]]') == 3
