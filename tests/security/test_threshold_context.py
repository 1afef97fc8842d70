"""A dynamic threshold's ``time_of_day_modifier`` reads the caller's ``time.hour`` (and
``time.minute``): a value that is not an hour (text, a list, NaN, a bool, a huge number, 24, 9.5)
is a typed refusal naming the field, never ``internal error``, and the request's text never
reaches the server's log (no traceback quoting it). A valid pinned hour still decides."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import InvalidInputError
from tests.e2e.conftest import ServerProcess
from tests.e2e.policies import TIME_OF_DAY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
"""
SUBJECT = "alice-zq9183@example.com"
POLICY = TIME_OF_DAY
BAD_HOURS: list[object] = [SUBJECT, [1, 2], {"h": SUBJECT}, float("nan"), float("inf"), True, 1e300, 24, -1, 9.5]


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "server", keys_text=KEYS_FILE) as s:
        yield s


def test_a_context_hour_that_is_not_an_hour_is_a_typed_refusal_and_never_logged(srv: ServerProcess) -> None:
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(POLICY)
        for hour in BAD_HOURS:
            with pytest.raises(InvalidInputError, match=r"time\.hour") as e:
                c.evaluate("dyn", "a prompt", "an answer", {"time": {"hour": hour}}, timeout=60)
            assert "internal error" not in str(e.value) and SUBJECT not in str(e.value), (hour, str(e.value))
        with pytest.raises(InvalidInputError, match=r"time\.minute"):
            c.evaluate("dyn", "a prompt", "an answer", {"time": {"hour": 10, "minute": SUBJECT}}, timeout=60)
        d = c.evaluate("dyn", "a prompt", "an answer", {"time": {"hour": 10, "minute": 30}}, timeout=60)
        assert d.decision_id and d.rule("r").threshold == pytest.approx(0.6)  # 0.5 + the 09:00-17:00 range
    log = srv.log.read_text(errors="replace")
    assert SUBJECT not in log, "the request's context value is in the server log"
    assert "Traceback" not in log
