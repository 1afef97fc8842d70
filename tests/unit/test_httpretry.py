"""The one Retry-After parser and the one set of retryable HTTP statuses (crossaudit.kernel.httpretry),
and that webhook delivery and the LLM evaluators both use them rather than copies of their own."""

from __future__ import annotations

import email.utils
import time
from pathlib import Path

import pytest

from crossaudit.kernel import httpretry
from crossaudit.kernel.httpretry import RETRY_AFTER_MAX_S, RETRYABLE_STATUSES, is_retryable_status, parse_retry_after
from crossaudit.outbox import attempts, limits
from crossaudit.outbox.attempts import Attempt
from orchestrator.evaluators import llm

NOW = 1_700_000_000.0  # a fixed epoch time, so dates are measured without the wall clock


def _date(epoch: float) -> str:
    return email.utils.formatdate(epoch, usegmt=True)


# --- delta-seconds ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("120", 120.0), (" 7 ", 7.0), ("1.5", 1.5), ("007", 7.0)])
def test_delta_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value) == seconds


def test_huge_delta_seconds_are_capped() -> None:
    assert parse_retry_after(str(10**9)) == RETRY_AFTER_MAX_S
    assert parse_retry_after("9" * 400) == RETRY_AFTER_MAX_S  # float() makes it inf
    assert parse_retry_after("9" * 100_000) == RETRY_AFTER_MAX_S  # int() would refuse over 4300 digits
    assert parse_retry_after("3601") == RETRY_AFTER_MAX_S == 3_600.0


def test_a_caller_cap_replaces_the_default() -> None:
    assert parse_retry_after("7200", cap=10_000.0) == 7200.0
    assert parse_retry_after("7200", cap=60.0) == 60.0


# --- HTTP-date (RFC 9110 §5.6.7: IMF-fixdate and the two obsolete forms) -------------------------


def test_imf_fixdate_in_the_future() -> None:
    assert parse_retry_after(_date(NOW + 30), now=NOW) == 30.0
    assert 25 <= (parse_retry_after(_date(time.time() + 30)) or 0) <= 31  # default: the wall clock


@pytest.mark.parametrize(
    "value",
    [
        "Sunday, 06-Nov-94 08:49:37 GMT",  # RFC 850
        "Sun Nov  6 08:49:37 1994",  # asctime, no zone: GMT
        "Sun, 06 Nov 1994 08:49:37 GMT",  # IMF-fixdate
    ],
)
def test_the_three_date_forms_mean_the_same_moment(value: str) -> None:
    moment = 784111777.0  # 1994-11-06T08:49:37Z
    assert parse_retry_after(value, now=moment - 90) == 90.0


def test_a_date_in_the_past_means_now() -> None:
    assert parse_retry_after(_date(NOW - 3600), now=NOW) == 0.0
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT") == 0.0


def test_a_far_date_is_capped() -> None:
    assert parse_retry_after(_date(NOW + 10 * 86_400), now=NOW) == RETRY_AFTER_MAX_S


# --- garbage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        *(None, "", "   ", "soon", "-5", "+5", "1e3", "inf", "nan", "0x10", "1.", ".5", "1,5"),
        *("²", "٣", "2024-01-01", "Sun, 06 Nov 99999 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT" + " " * 80 + "x"),
    ],
)
def test_garbage_is_no_hint(value: str | None) -> None:
    """No hint (None): the caller's own backoff applies. Non-ASCII digits pass str.isdigit()."""
    assert parse_retry_after(value) is None


# --- retryable statuses ----------------------------------------------------------------------


def test_retryable_statuses() -> None:
    assert {408, 409, 425, 429, 500, 502, 503, 504, 529, 599} <= RETRYABLE_STATUSES
    assert not {200, 301, 400, 401, 403, 404, 413, 422, 600} & RETRYABLE_STATUSES
    assert all(is_retryable_status(s) == (s in RETRYABLE_STATUSES) for s in range(100, 700))


# --- one declaration, used by both -----------------------------------------------------------


def test_webhooks_and_llm_calls_share_the_parser_and_the_statuses() -> None:
    assert attempts.is_retryable_status is llm.is_retryable_status is httpretry.is_retryable_status
    assert attempts.parse_retry_after is llm.parse_retry_after is httpretry.parse_retry_after
    assert limits.DeliveryLimits().retry_after_max_s == RETRY_AFTER_MAX_S


def test_webhooks_and_llm_calls_retry_the_same_answers() -> None:
    for status in range(400, 600):
        webhook = Attempt.from_status(status, "5")
        provider = llm._status_error("openai", status, "")
        assert webhook.permanent is not provider.retryable, status
        assert webhook.retry_after_s == llm.retry_after_s({"retry-after": "5"}) == 5.0


def test_no_other_module_parses_http_dates() -> None:
    """A second Retry-After parser would need email.utils' date parser: only the kernel's uses it."""
    root = Path(__file__).resolve().parents[2]
    users = sorted(
        str(p.relative_to(root))
        for top in ("crossaudit", "orchestrator", "sandbox")
        for p in (root / top).rglob("*.py")
        if "parsedate" in p.read_text(encoding="utf-8")
    )
    assert users == ["crossaudit/kernel/httpretry.py"]


def test_delivery_honours_a_configured_ceiling_above_the_default() -> None:
    """``delivery_limits.retry_after_max_s`` is a setting: the parser's default cap must not cut it."""
    assert Attempt.from_status(503, "7200", retry_after_max_s=10_000.0).retry_after_s == 7200.0
    assert Attempt.from_status(503, "7200").retry_after_s == RETRY_AFTER_MAX_S
