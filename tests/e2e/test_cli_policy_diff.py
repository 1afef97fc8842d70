"""``crossaudit policy diff`` through the real CLI: files, versions stored on a real server
(``NAME@VERSION``), JSON, ``--exit-code``, and what a caller may not see or send."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, key, run_cli
from tests.e2e.policies import trivial

pytestmark = pytest.mark.e2e


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_two_files_in_words_json_and_exit_code(tmp_path: Path) -> None:
    old = write(tmp_path / "v1.yaml", trivial("gate"))
    new = write(tmp_path / "v2.yaml", trivial("gate").replace("threshold: 0.5", "threshold: 0.4"))
    res = run_cli("policy", "diff", str(old), str(new))
    assert res.returncode == 0
    assert "rule 'fine': threshold 0.5 -> 0.4 (lower: fewer responses fail)" in res.stdout
    assert run_cli("policy", "diff", str(old), str(new), "--exit-code").returncode == 1
    assert run_cli("policy", "diff", str(old), str(old), "--exit-code").returncode == 0
    doc = json.loads(run_cli("policy", "diff", str(old), str(new), "--json").stdout)
    assert [(c["area"], c["name"], c["field"], c["before"], c["after"]) for c in doc["changes"]] == [
        ("rule", "fine", "threshold", 0.5, 0.4)
    ]


def test_an_invalid_side_gets_its_located_issues(tmp_path: Path) -> None:
    old = write(tmp_path / "v1.yaml", trivial("gate"))
    bad = write(tmp_path / "bad.yaml", trivial("gate").replace("threshold: 0.5", "threshold: 7"))
    res = run_cli("policy", "diff", str(old), str(bad))
    assert res.returncode == 1
    assert "bad.yaml" in res.stdout + res.stderr and "threshold" in res.stdout + res.stderr
    res = run_cli("policy", "diff", str(old), "../no such/thing@x")
    assert res.returncode == 1 and "no such file" in res.stdout + res.stderr


def test_stored_versions_on_a_server_and_another_tenants_are_not_found(server: ServerProcess, tmp_path: Path) -> None:
    with Client(server.address, api_key=key("globex")) as globex:
        globex.deploy_policy(trivial("gated"), environment="production")
        globex.deploy_policy(trivial("gated").replace('version: "1.0"', 'version: "1.1"'), environment="production")
    with Client(server.address, api_key=key("acme")) as acme:
        acme.deploy_policy(trivial("acme_only"), environment="production")
    res = run_cli("policy", "diff", "gated@1", "gated@2", server=server)
    assert res.returncode == 0, res.stderr
    assert "gated@1 -> gated@2: 1 change(s)" in res.stdout and 'policy: version "1.0" -> "1.1"' in res.stdout
    local = write(tmp_path / "local.yaml", trivial("gated").replace("action: block", "action: warn"))
    res = run_cli("policy", "diff", "gated", str(local), server=server)  # the deployed one (v2) against a file
    assert res.returncode == 0, res.stderr
    assert 'rule \'fine\': action "block" -> "warn"' in res.stdout
    # globex's key: acme's policy is answered exactly as a name nobody has (NOT_FOUND), nothing shown
    theirs = run_cli("policy", "diff", "acme_only@1", "gated@1", server=server)
    nobodys = run_cli("policy", "diff", "no_such@1", "gated@1", server=server)
    assert theirs.returncode == nobodys.returncode == 1 and theirs.stdout == nobodys.stdout == ""
    assert theirs.stderr.replace("acme_only", "NAME") == nobodys.stderr.replace("no_such", "NAME")
    assert "has no version 1" in theirs.stderr
