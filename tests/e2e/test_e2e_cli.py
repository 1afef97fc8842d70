"""The ``crossaudit`` service commands against the real server: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, ServerProcess, key
from tests.e2e.policies import KEYWORDS, KEYWORDS_V2, UPLOAD_CODE

pytestmark = pytest.mark.e2e


def cli(server: ServerProcess, *args: str, api_key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env["CROSSAUDIT_SERVER"] = server.address
    env["CROSSAUDIT_API_KEY"] = api_key if api_key is not None else key("globex")
    res = subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in res.stdout + res.stderr
    return res


def test_policy_commands(server: ServerProcess, tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1.yaml", tmp_path / "v2.yaml"
    v1.write_text(KEYWORDS)
    v2.write_text(KEYWORDS_V2)
    res = cli(server, "policy", "deploy", str(v1), "--environment", "staging")
    assert res.returncode == 0 and "deployed 'keywords' v1 (new version" in res.stdout and "to staging" in res.stdout
    assert cli(server, "policy", "deploy", str(v2), "-e", "staging").returncode == 0
    listed = json.loads(cli(server, "policy", "list", "--json").stdout)
    assert [(p["name"], p["latest_version"]) for p in listed] == [("keywords", 2)]
    assert cli(server, "policy", "get", "keywords", "-e", "staging").stdout == KEYWORDS_V2
    res = cli(server, "policy", "rollback", "keywords", "-e", "staging")
    assert res.returncode == 0 and "v2 -> v1" in res.stdout
    res = cli(server, "policy", "rollback", "keywords", "-e", "production")
    assert res.returncode == 1 and res.stderr.strip().startswith("error:") and len(res.stderr.splitlines()) == 1


def test_invalid_policy_lists_every_issue_and_exits_1(server: ServerProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\ndescription: d\nversion: '1'\nrules:\n  - name: r\n    evaluator: nope\n    threshold: 2\n"
    )
    res = cli(server, "policy", "deploy", str(bad))
    assert res.returncode == 1
    assert "bad.yaml:6" in res.stderr and "bad.yaml:7" in res.stderr and "rules[0].threshold" in res.stderr


def test_evaluator_and_review_commands(server: ServerProcess, tmp_path: Path) -> None:
    code = tmp_path / "scorer.py"
    code.write_text(UPLOAD_CODE)
    res = cli(server, "evaluator", "upload", str(code), "--name", "cli-scorer", "--json")
    assert res.returncode == 0, res.stderr
    ev = json.loads(res.stdout)
    assert ev["created"] is True and ev["name"] == "cli-scorer"
    res = cli(server, "evaluator", "upload", str(code), "--name", "cli-scorer")
    assert res.returncode == 0 and "already uploaded" in res.stdout and ev["id"] in res.stdout
    assert ev["id"] in cli(server, "evaluator", "list").stdout
    assert "def evaluate" in cli(server, "evaluator", "get", ev["id"], "--code").stdout
    res = cli(server, "evaluator", "upload", str(code), "--name", "x", "--dependency", "pkg @ file:///etc")
    assert res.returncode == 1 and res.stderr.startswith("error:")

    from crossaudit import Client

    with Client(server.address, api_key=key("globex")) as c:
        c.deploy_policy(KEYWORDS)
        d = c.evaluate("keywords", "p", "bad", timeout=10)
    listed = cli(server, "audit", "list", "--policy", "keywords")
    assert listed.returncode == 0 and d.decision_id in listed.stdout and "failed flag" in listed.stdout
    assert json.loads(cli(server, "audit", "get", d.decision_id).stdout)["decision_id"] == d.decision_id
    [review_id] = d.review_ids
    assert review_id in cli(server, "review", "list").stdout
    res = cli(server, "review", "resolve", review_id, "--state", "rejected", "--note", "really bad")
    assert res.returncode == 0 and "rejected" in res.stdout
    assert review_id not in cli(server, "review", "list").stdout
    assert review_id in cli(server, "review", "list", "--state", "any").stdout


def test_wrong_key_and_unreachable_server_are_one_line(server: ServerProcess) -> None:
    """Each says what to do: which flag or variable gives the key, how to start a server."""
    res = cli(server, "policy", "list", api_key="wrong-key-0123456789")
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: invalid API key: this server has no such key (pass one of its keys with ")
    assert "--api-key or CROSSAUDIT_API_KEY" in res.stderr
    res = cli(server, "policy", "list", api_key="")  # none at all
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: missing API key: ")
    assert "pass --api-key or set CROSSAUDIT_API_KEY" in res.stderr
    res = cli(server, "policy", "list", "--server", "127.0.0.1:1", "--timeout", "3")
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: cannot reach the CrossAudit server at 127.0.0.1:1: nothing listens there")
    assert "Start one with `crossaudit serve --dev`, or give its address with --server or CROSSAUDIT_SERVER" in (
        res.stderr
    )
    assert cli(server, "policy", "list", "--bogus-flag").returncode == 2
