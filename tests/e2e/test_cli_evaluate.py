"""``crossaudit evaluate`` through the real CLI: a policy file evaluated here, and a deployed policy
evaluated by a real server (``--server``), with tables, JSON, inputs from files/stdin, exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, key, run_cli
from tests.e2e.policies import KEYWORDS, custom_policy, returns

pytestmark = pytest.mark.e2e
CLI_TIMEOUT_S = 180

CONTEXT_POLICY = """
name: context-aware
description: only admins may see the word secret
version: "1.0"
evaluators:
  - name: secret_gate
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            role = (context.get("user") or {}).get("role")
            leaked = "secret" in response and role != "admin"
            return {"score": 0.0 if leaked else 1.0, "details": {"role": role, "prompt_len": len(prompt)}}
rules:
  - name: no_secret_for_users
    evaluator: secret_gate
    threshold: 0.5
    action: block
"""

# an evaluator that divides by zero
ZERO_POLICY = custom_policy("zero", returns('{"score": 1 / 0}'), evaluator="div", rules=["divided"], action="flag")


def run(
    *args: str, server: ServerProcess | None = None, api_key: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, server=server, api_key=api_key, stdin=stdin, timeout=CLI_TIMEOUT_S)


@pytest.fixture()
def context_policy(tmp_path: Path) -> Path:
    path = tmp_path / "context.yaml"
    path.write_text(CONTEXT_POLICY)
    return path


def test_a_local_decision_as_a_table_with_exit_codes() -> None:
    policy = "policies/demo_offline.yaml"
    res = run("evaluate", policy, "--prompt", "Who do I contact?", "--response", "Write to jane.doe@example.com")
    assert res.returncode == 1, res.stderr
    out = res.stdout
    for header in ("Rule", "Status", "Score", "Threshold", "Action", "Reason", "Evaluator errors"):
        assert header in out
    redact = next(line for line in out.splitlines() if "redact_emails" in line)
    assert "fail" in redact and "modify" in redact and "0.5" in redact
    assert "NOT PASSED  action: modify  decision: " in out
    assert "modified response: Write to [EMAIL_ADDRESS]" in out
    ok = run("evaluate", policy, "--prompt", "hi", "--response", "Glad to help, have a great day!")
    assert ok.returncode == 0 and "PASSED  action: allow" in ok.stdout and "NOT PASSED" not in ok.stdout


def test_json_files_stdin_and_context(context_policy: Path, tmp_path: Path) -> None:
    (tmp_path / "response.txt").write_text("the secret is 42")
    (tmp_path / "ctx.json").write_text(json.dumps({"user": {"role": "admin"}}))
    as_user = run("evaluate", str(context_policy), "--response", f"@{tmp_path / 'response.txt'}", "--json")
    d = json.loads(as_user.stdout)
    assert as_user.returncode == 1 and d["passed"] is False and d["action"] == "block"
    assert d["rules"][0]["evaluators"][0]["details"]["role"] is None
    as_admin = run(
        "evaluate",
        str(context_policy),
        "--prompt",
        "-",
        "--response",
        f"@{tmp_path / 'response.txt'}",
        "--context",
        f"@{tmp_path / 'ctx.json'}",
        "--json",
        stdin="a prompt read from standard input",
    )
    d = json.loads(as_admin.stdout)
    assert as_admin.returncode == 0 and d["passed"] is True and d["decision_id"]
    assert d["rules"][0]["evaluators"][0]["details"] == {"role": "admin", "prompt_len": 33}
    inline = run("evaluate", str(context_policy), "-r", "secret", "-c", '{"user": {"role": "admin"}}')
    assert inline.returncode == 0


def test_an_evaluator_error_is_shown_and_does_not_pass(tmp_path: Path) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(ZERO_POLICY)
    res = run("evaluate", str(path), "--response", "x")
    assert res.returncode == 1
    assert "ZeroDivisionError" in res.stdout and "errored rules: divided" in res.stdout
    d = json.loads(run("evaluate", str(path), "--response", "x", "--json").stdout)
    assert d["errored_rules"] == ["divided"] and d["rules"][0]["status"] == "error"


def test_usage_and_input_errors_are_one_line(context_policy: Path) -> None:
    assert run("evaluate").returncode == 2
    res = run("evaluate", str(context_policy), "--prompt", "-", "--response", "-")
    assert res.returncode == 2 and "only one of" in res.stderr
    res = run("evaluate", str(context_policy), "--server", "127.0.0.1:9", "--sandbox", "docker")
    assert res.returncode == 2 and "--sandbox applies to local runs" in res.stderr
    res = run("evaluate", str(context_policy), "--api-key", "k")
    assert res.returncode == 2 and "--api-key needs --server" in res.stderr
    for context, why in (("[1, 2]", "expected a JSON object"), ("{oops", "invalid JSON at line 1")):
        res = run("evaluate", str(context_policy), "--context", context)
        assert res.returncode == 1 and why in res.stderr and res.stderr.count("\n") == 1
    res = run("evaluate", "no-such-policy.yaml", "--response", "x")
    assert res.returncode == 1 and "not found" in res.stderr and "--server" in res.stderr


def test_an_input_over_the_request_limit_is_a_usage_error(context_policy: Path, tmp_path: Path) -> None:
    """One request limit (limits.max_request_bytes, 4 MiB): checked here before anything runs,
    exit 2 like any usage error, one line naming the setting - locally and with --server."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (4 * 1024 * 1024 + 1))
    for extra in ((), ("--server", "127.0.0.1:9")):  # nothing listens there: nothing is sent
        res = run("evaluate", str(context_policy), "--response", f"@{big}", *extra)
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith(f"error: --response: {big} holds more than 4194304 bytes") and res.stdout == ""
        assert "(limits.max_request_bytes; set CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES" in res.stderr
        assert res.stderr.count("\n") == 1
    res = run("evaluate", str(context_policy), "--prompt", "-", stdin="y" * (4 * 1024 * 1024 + 1))
    assert res.returncode == 2 and "standard input holds more than 4194304 bytes" in res.stderr
    half = tmp_path / "half.txt"
    half.write_bytes(b"z" * (2 * 1024 * 1024 + 1))
    res = run("evaluate", str(context_policy), "--prompt", f"@{half}", "--response", f"@{half}")
    assert res.returncode == 2 and "--prompt, --response and --context together are 4194308 bytes" in res.stderr  # {}


def test_a_deployed_policy_evaluated_by_the_server(server: ServerProcess, tmp_path: Path) -> None:
    with Client(server.address, api_key=key("globex")) as c:
        c.deploy_policy(KEYWORDS)
    # bare --server: $CROSSAUDIT_SERVER; POLICY is the deployed policy's name
    res = run("evaluate", "--server", "keywords", "--response", "bad news", "--json", server=server)
    assert res.returncode == 1, res.stderr
    d = json.loads(res.stdout)
    assert d["environment"] == "production" and d["policy_revision"] == 1 and d["action"] == "flag"
    with Client(server.address, api_key=key("globex")) as c:  # the server decided it: it is in the audit log
        assert c.get_decision(d["decision_id"]).decision_id == d["decision_id"]
    # an explicit address, and a table
    res = run("evaluate", "keywords", f"--server={server.address}", "--response", "fine", server=server)
    assert res.returncode == 0 and "PASSED  action: allow" in res.stdout and "(production)" in res.stdout
    # a policy file stands for the policy it names
    path = tmp_path / "keywords.yaml"
    path.write_text(KEYWORDS)
    res = run("evaluate", str(path), "--server", server.address, "-r", "worse", server=server)
    assert res.returncode == 1 and "no_worse" in res.stdout and "reviews: " in res.stdout
    res = run("evaluate", "keywords", "--server", "--environment", "staging", "-r", "x", server=server)
    assert res.returncode == 1 and res.stderr.startswith("error:") and res.stderr.count("\n") == 1


def test_another_tenants_policy_cannot_be_evaluated(server: ServerProcess) -> None:
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(KEYWORDS.replace("name: keywords", "name: acme-private"))
    res = run("evaluate", "--server", "acme-private", "-r", "bad", server=server, api_key=key("globex"))
    assert res.returncode == 1 and res.stdout == ""
    # exactly what a policy that exists nowhere gets: nothing tells globex that acme has one
    none = run("evaluate", "--server", "nobody-has-this", "-r", "bad", server=server, api_key=key("globex"))
    assert res.stderr == none.stderr.replace("nobody-has-this", "acme-private")
    assert res.stderr.startswith("error: policy 'acme-private' is not deployed") and res.stderr.count("\n") == 1
    res = run("evaluate", "--server", "acme-private", "-r", "bad", server=server, api_key="wrong-key-0123456789")
    assert res.returncode == 1 and res.stderr.startswith("error: invalid API key: ") and res.stderr.count("\n") == 1
    assert "--api-key" in res.stderr and "CROSSAUDIT_API_KEY" in res.stderr  # what to do about it
    own = run("evaluate", "--server", "acme-private", "-r", "fine", server=server, api_key=key("acme"))
    assert own.returncode == 0 and "policy: acme-private" in own.stdout
