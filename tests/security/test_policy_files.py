"""The service never reads a file that a policy names.

A tenant sends a policy with ``code_file`` (absolute, or relative to the server's working
directory), a custom evaluator to be found as ``evaluators/<name>.py`` next to a policy file
name of its choosing, or a builtin model path: the server must refuse it with INVALID_ARGUMENT
naming the field, and answer exactly the same whether the file exists or not. The CLI and the
Client inline those files before sending, so authors keep using them.

Service tests drive a real ``crossaudit serve`` process (working directory: the repository) on
an ephemeral loopback port, through raw gRPC where the attacker would.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from crossaudit import Client, PolicyTester
from crossaudit.kernel.errors import PolicyValidationError
from tests.e2e.conftest import ROOT, ServerProcess, key, raw_deploy

pytestmark = pytest.mark.security
e2e = pytest.mark.e2e

CALL_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 120.0
SERVER_PY = "policies/guide/evaluators/compliance_checker.py"  # defines evaluate(); relative to the server's cwd
EXISTING_FILES = ("/etc/hostname", "/etc/passwd", str(ROOT / SERVER_PY))


def missing_path() -> str:
    return f"/etc/no-such-file-{secrets.token_hex(6)}"


def policy(evaluators: str, rules: str = "  - {name: r, evaluator: e}") -> str:
    return f'name: files\ndescription: d\nversion: "1.0"\nevaluators:\n{evaluators}\nrules:\n{rules}\n'


def code_file_policy(path: str) -> str:
    return policy(f'  - name: e\n    type: custom\n    config:\n      code_file: "{path}"')


def by_name_policy(name: str) -> str:
    return policy(f"  - name: {name}\n    type: custom", f"  - {{name: r, evaluator: {name}}}")


def answer(e: grpc.RpcError | None) -> tuple[grpc.StatusCode | None, str, bytes]:
    """Everything the caller learns: code, message, rich details."""
    if e is None:
        return None, "accepted", b""
    rich = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin", b"")
    return e.code(), e.details(), rich


# --- the exploits -----------------------------------------------------------------------------------


@e2e
def test_absolute_code_file_is_refused_alike_for_existing_and_missing_files(server: ServerProcess) -> None:
    answers = {
        path: answer(raw_deploy(server.address, code_file_policy(path))) for path in (*EXISTING_FILES, missing_path())
    }
    first = next(iter(answers.values()))
    assert first[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert "evaluators[0].config.code_file" in first[1] and "never reads" in first[1]
    assert all(a == first for a in answers.values()), answers


@e2e
def test_relative_code_file_is_refused_alike_for_existing_and_missing_files(server: ServerProcess) -> None:
    paths = (SERVER_PY, "policies/guide/evaluators/missing.py", "../../../../../../etc/hostname", "README.md")
    answers = {p: answer(raw_deploy(server.address, code_file_policy(p), filename="p.yaml")) for p in paths}
    first = next(iter(answers.values()))
    assert first[0] is grpc.StatusCode.INVALID_ARGUMENT and "evaluators[0].config.code_file" in first[1]
    assert all(a == first for a in answers.values()), answers


@e2e
def test_evaluators_dir_next_to_a_policy_filename_is_never_looked_up(server: ServerProcess) -> None:
    # The server's cwd holds policies/guide/evaluators/compliance_checker.py; another name does not exist.
    for filename in ("policies/guide/any.yaml", str(ROOT / "policies/guide/any.yaml")):
        exists = answer(raw_deploy(server.address, by_name_policy("compliance_checker"), filename=filename))
        absent = answer(raw_deploy(server.address, by_name_policy("no_such_checker"), filename=filename))
        assert exists[0] is grpc.StatusCode.INVALID_ARGUMENT and "evaluators[0]" in exists[1]
        assert "has no code" in exists[1]
        assert exists[1].replace("compliance_checker", "X") == absent[1].replace("no_such_checker", "X")
        assert exists[0] == absent[0]


@e2e
def test_builtin_model_path_is_refused_alike_for_existing_and_missing_files(server: ServerProcess) -> None:
    def builtin(path: str) -> str:
        return policy(f'  - name: e\n    type: builtin\n    config: {{model: detoxify, checkpoint: "{path}"}}')

    answers = {p: answer(raw_deploy(server.address, builtin(p))) for p in (*EXISTING_FILES, missing_path())}
    first = next(iter(answers.values()))
    assert first[0] is grpc.StatusCode.INVALID_ARGUMENT and "evaluators[0].config.checkpoint" in first[1]
    assert all(a == first for a in answers.values()), answers


# --- authors keep their files: the CLI and the Client inline them -------------------------------------


def write_project(root: Path, marker: str) -> Path:
    """A policy using ``code_file`` and ``evaluators/<name>.py`` (block and flow configs)."""
    (root / "impl").mkdir(parents=True)
    (root / "evaluators").mkdir()
    (root / "impl/scorer.py").write_text(
        "def evaluate(prompt, response, context):\n"
        f'    return {{"score": 1.0, "details": {{"from": "file {marker}"}}}}\n'
    )
    (root / "evaluators/by_name.py").write_text(
        "def evaluate(prompt, response, context):\n"
        f'    return {{"score": 1.0, "details": {{"from": "local {marker}", "cfg": context["evaluator_config"]}}}}\n'
    )
    path = root / "policy.yaml"
    path.write_text(
        f"""# a policy naming local files
name: inlined-{marker}
description: d
version: "1.0"
evaluators:
  - name: scorer
    type: custom
    config: {{code_file: impl/scorer.py}}   # relative to this file
  - name: by_name
    type: custom
    config:
      words: [a, b]
rules:
  - {{name: r1, evaluator: scorer}}
  - {{name: r2, evaluator: by_name}}
"""
    )
    return path


@e2e
def test_cli_deploy_inlines_code_file_and_evaluators_dir(server: ServerProcess, tmp_path: Path) -> None:
    path = write_project(tmp_path / "project", "cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    res = subprocess.run(  # from another directory: files resolve next to the policy, not the cwd
        [
            sys.executable,
            "-m",
            "crossaudit.cli",
            "policy",
            "deploy",
            str(path),
            "--server",
            server.address,
            "--api-key",
            key("acme"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert res.returncode == 0, res.stderr
    with Client(server.address, api_key=key("acme")) as c:
        d = c.evaluate("inlined-cli", "p", "r", timeout=CALL_TIMEOUT_S)
        stored = c.get_policy("inlined-cli").content
    assert d.rule("r1").evaluators[0].details == {"from": "file cli"}
    assert d.rule("r2").evaluators[0].details == {"from": "local cli", "cfg": {"words": ["a", "b"]}}
    assert "code_file" not in stored and "# relative to this file" in stored  # comments survive


@e2e
def test_client_deploy_local_file_beats_an_upload_of_the_same_name(server: ServerProcess, tmp_path: Path) -> None:
    path = write_project(tmp_path / "project", "client")
    with Client(server.address, api_key=key("acme")) as c:
        c.upload_evaluator(
            "by_name",
            'def evaluate(prompt, response, context):\n    return {"score": 1.0, "details": {"from": "upload"}}\n',
        )
        c.deploy_policy(path)  # inlined: the author's local file wins
        d = c.evaluate("inlined-client", "p", "r", timeout=CALL_TIMEOUT_S)
        assert d.rule("r2").evaluators[0].details["from"] == "local client"
        # policy text with no base_dir is sent as is: code_file is refused, a bare name means the upload
        with pytest.raises(PolicyValidationError, match="code_file"):
            c.deploy_policy(path.read_text())
        inline = "config: {code: \"def evaluate(p, r, c):\\n    return {'score': 1.0}\\n\"}"
        c.deploy_policy(path.read_text().replace("config: {code_file: impl/scorer.py}", inline))
        d = c.evaluate("inlined-client", "p", "r", timeout=CALL_TIMEOUT_S)
        assert d.rule("r2").evaluators[0].details["from"] == "upload"
        c.deploy_policy(path.read_text(), base_dir=path.parent)  # text + base_dir: inlined again
        d = c.evaluate("inlined-client", "p", "r", timeout=CALL_TIMEOUT_S)
        assert d.rule("r2").evaluators[0].details["from"] == "local client"


@e2e
def test_errors_of_an_inlined_policy_point_at_the_authors_lines(server: ServerProcess, tmp_path: Path) -> None:
    path = write_project(tmp_path / "project", "lines")
    text = path.read_text().replace("evaluator: by_name}", "evaluator: by_nam}")
    path.write_text(text)
    line = next(n for n, ln in enumerate(text.splitlines(), 1) if "by_nam}" in ln)
    with Client(server.address, api_key=key("acme")) as c, pytest.raises(PolicyValidationError) as err:
        c.deploy_policy(path)
    (issue,) = err.value.issues
    assert issue.path == "rules[1].evaluator" and issue.line == line, issue
    path.write_text(text.replace("impl/scorer.py", "impl/nope.py"))  # a missing local file: said locally
    with Client(server.address, api_key=key("acme")) as c, pytest.raises(PolicyValidationError) as err:
        c.deploy_policy(path)
    (issue,) = err.value.issues
    assert issue.path == "evaluators[0].config.code_file" and "file not found" in issue.message


def test_policy_tester_resolves_files_locally(tmp_path: Path) -> None:
    path = write_project(tmp_path / "project", "tester")
    with PolicyTester(path) as tester:
        d = tester.evaluate("p", "r")
    assert d.rule("r1").evaluators[0].details == {"from": "file tester"}
    assert d.rule("r2").evaluators[0].details["from"] == "local tester"
