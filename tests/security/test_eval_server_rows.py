"""``crossaudit eval --server`` with dataset rows that load but that the server path cannot
carry (a lone surrogate, a non-finite number, an int too large for a float, a context hour that
is text, which a dynamic threshold's time-of-day range reads): each is a problem of its own row,
never an ``internal error`` nor the end of the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.policies import TIME_OF_DAY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
"""
POLICY = TIME_OF_DAY
ROWS = [
    '{"id":"inf","response":"x","context":{"x":1e999},"passed":true}',
    '{"id":"bigint","response":"x","context":{"x":%s},"passed":true}' % ("9" * 400),
    '{"id":"surr","response":"a\\ud800b","passed":true}',
    '{"id":"surrkey","response":"x","context":{"\\udc00":1},"passed":true}',
    '{"id":"hour","response":"x","context":{"time":{"hour":"nine"}},"passed":true}',
    '{"id":"ok","response":"x","passed":true}',
]


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "server", keys_text=KEYS_FILE) as s:
        yield s


def test_rows_the_server_cannot_take_are_problems_of_their_rows(srv: ServerProcess, tmp_path: Path) -> None:
    policy, data = tmp_path / "dyn.yaml", tmp_path / "rows.jsonl"
    policy.write_text(POLICY)
    data.write_text("\n".join(ROWS) + "\n")
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(POLICY)
    res = run_cli("eval", "--json", "--server", srv.address, str(policy), str(data), server=srv, api_key=ADMIN)
    out = res.stdout + res.stderr
    print(out[-3000:])
    assert "Traceback" not in out
    assert res.returncode in (0, 1), out
    assert "internal error" not in out
    assert "time.hour" in out  # the text hour's row is refused, naming the field
