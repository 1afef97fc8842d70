"""A streamed answer's release mapped through its redaction in work linear in its length
(docs/proxy.md#streaming, ``crossaudit/proxy/stream.py``).

The attack: one e-mail address in a 40,000-character streamed answer made the last release diff
the whole answer with difflib (quadratic) on the proxy's event loop, 36 s during which every other
caller's stream stood still. The work here is counted (characters compared), not timed, except
for one ratio of two sizes measured side by side in the same test.
"""

from __future__ import annotations

import time

import pytest

from crossaudit.proxy import stream
from crossaudit.proxy.stream import release

ADDRESS = "jane.doe@example.com"
REDACTED = "[EMAIL_ADDRESS]"
WORDS = "sun", "sky", "air", "sea", "oak", "elm", "fog", "ice"
LINEAR_FACTOR = 4  # one redaction: the equal text before and after it, each compared about twice
RATIO_SLACK = 3  # the 10x larger answer may take up to 30x as long (quadratic: ~120x)
TIMED_REPEATS = 5
TIMER_FLOOR_S = 1e-4  # a 5k release timed below this counts as this (the clock's noise)


def answer(chars: int, addresses: int = 1) -> tuple[str, str]:
    """``chars`` characters of words with ``addresses`` e-mail addresses spread evenly, and its redaction."""
    words = "".join(f"{WORDS[i % len(WORDS)]} " for i in range(chars // 4 + 1))
    step = chars // (addresses + 1)
    parts = [words[k * step : (k + 1) * step] for k in range(addresses + 1)]
    text = f" {ADDRESS} ".join(parts)
    return text, text.replace(ADDRESS, REDACTED)


@pytest.mark.parametrize("chars", [5_000, 50_000])
def test_one_redaction_is_aligned_in_work_linear_in_the_answer(chars: int) -> None:
    evaluated, modified = answer(chars)
    got = stream.align(evaluated, modified)
    at = evaluated.index(ADDRESS)
    assert got.regions == [(at, at + len(ADDRESS), at, at + len(REDACTED))]  # exactly the address
    assert got.work <= LINEAR_FACTOR * (len(evaluated) + len(modified))
    assert release(evaluated, modified, 0, len(evaluated)) == (modified, len(evaluated))


def test_many_redactions_are_each_aligned_exactly_within_the_bound() -> None:
    evaluated, modified = answer(50_000, addresses=100)
    got = stream.align(evaluated, modified)
    starts = [i for i in range(len(evaluated)) if evaluated.startswith(ADDRESS, i)]
    assert [r[0] for r in got.regions] == starts
    assert all(i2 - i1 == len(ADDRESS) and j2 - j1 == len(REDACTED) for i1, i2, j1, j2 in got.regions)
    assert got.work <= stream.DIFF_WORK_PER_CHAR * (len(evaluated) + len(modified)) + stream.DIFF_WORK_BASE
    assert release(evaluated, modified, 0, len(evaluated)) == (modified, len(evaluated))
    # a window's cut inside the 50th address holds it back whole
    fiftieth = starts[49]
    sent, upto = release(evaluated, modified, 0, fiftieth + 3)
    assert upto == fiftieth and sent == modified[: fiftieth - 49 * (len(ADDRESS) - len(REDACTED))]
    assert sent.endswith(" ") and sent.count(REDACTED) == 49


def test_work_past_the_bound_makes_the_rest_one_region() -> None:
    """Changes the bounded search cannot align (here: every other character, no anchor of
    MIN_ANCHOR_CHARS equal ones between them) cost at most the bound: what is left becomes one
    changed region (held back whole, sent redacted), never a longer search."""
    evaluated = "".join(f"{c}x" for c in "abcdefgh" * 5_000)
    modified = "".join(f"{c}y" for c in "abcdefgh" * 5_000)
    got = stream.align(evaluated, modified)
    assert got.work <= stream.DIFF_WORK_PER_CHAR * (len(evaluated) + len(modified)) + stream.DIFF_WORK_BASE
    assert got.regions == [(1, len(evaluated), 1, len(modified))]
    assert release(evaluated, modified, 0, len(evaluated)) == (modified, len(evaluated))
    assert release(evaluated, modified, 0, 100) == ("a", 1)


def _cpu(evaluated: str, modified: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        release(evaluated, modified, 0, len(evaluated))
        best = min(best, time.process_time() - t0)
    return best


def test_releasing_a_10x_longer_redacted_answer_costs_about_10x() -> None:
    """Measured side by side, least of several runs (a loaded machine slows both alike): the
    quadratic diff took ~120x as long for 10x the text (0.38 s at 5k, 45.6 s at 50k)."""
    small, large = answer(5_000), answer(50_000)
    _cpu(*small, 1)  # warm
    base = max(_cpu(*small, TIMED_REPEATS), TIMER_FLOOR_S)
    ratio = _cpu(*large, 1) / base
    if 10 * RATIO_SLACK < ratio < 20 * RATIO_SLACK:  # noise, not a quadratic (~120x): measured again
        ratio = _cpu(*large, TIMED_REPEATS) / base
    assert ratio <= 10 * RATIO_SLACK, f"a 10x longer answer took {ratio:.0f}x as long to release"
