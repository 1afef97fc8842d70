"""A rule over two evaluators that both fail has the reason ``no verdict (fail-closed): a: E_a;
b: E_b``. The record's reason was made by replacing ``"a: E_a"`` in that text, which also
rewrote a copy of ``E_a`` inside ``E_b`` (b's message quotes a prompt holding ``"a: E_a"``): then
``E_b`` no longer matched and stayed in the audit record with the rest of the prompt, inside the
leaf, where ``audit erase`` cannot reach it. Any caller could so plant permanent text in the
signed log. The record's reason of a rule with no verdict is now built from the rule's
structured result (policy values, each evaluator's name, error class and the digest of its
message), never from the reason's text (docs/retention.md). A real server on both stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.canonical import sha256_text
from tests.e2e.conftest import ServerProcess, run_cli
from tests.security.test_erased_error_text import at_rest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
"""
# a fails whatever the prompt; b fails quoting the prompt (int() of text)
POLICY = """
name: two
description: d
version: "1.0"
evaluators:
  - name: a
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            raise ValueError("boom")
  - name: b
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": int(prompt)}
rules:
  - name: both
    evaluators: [{name: a}, {name: b}]
    threshold: 0.5
    action: block
"""


@pytest.fixture
def srv(tmp_path: Path, server_store_env: dict[str, str]) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "server", keys_text=KEYS_FILE, env=server_store_env) as s:
        yield s


def test_a_prompt_quoting_another_evaluators_error_leaves_no_text_in_the_record(
    srv: ServerProcess, server_store_env: dict[str, str]
) -> None:
    with Client(srv.address, api_key=ADMIN) as c:
        c.deploy_policy(POLICY)
        first = c.evaluate("two", "1", "r", timeout=60)
        e_a = first.rules[0].evaluators[0].error
        assert e_a and "'" not in e_a, e_a  # quoted by b's message as it is
        d = c.evaluate("two", f"contact alice-zq9183@example.com a: {e_a}", "r", timeout=60)
        assert d.errored_rules == ["both"]
        e_b = d.rules[0].evaluators[1].error or ""
        assert f"a: {e_a}" in e_b and "alice-zq9183" in d.rules[0].reason  # the caller is told
        res = run_cli("audit", "erase", "--decision", d.decision_id, server=srv, api_key=ADMIN)
        assert res.returncode == 0, res.stderr
        rec = c.get_decision(d.decision_id)
    stored = json.dumps(rec.rules)
    assert "alice-zq9183" not in stored, "the prompt's text is in the stored rule reason after erasure"
    [rule] = rec.rules
    assert f"a: SandboxCodeError ValueError (error text not kept; sha256 {sha256_text(e_a)})" in rule["reason"]
    assert f"b: SandboxCodeError ValueError (error text not kept; sha256 {sha256_text(e_b)})" in rule["reason"]
    assert b"alice-zq9183" not in at_rest(srv, server_store_env)
