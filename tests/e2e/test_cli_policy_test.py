"""``crossaudit policy test`` through the real CLI: errors counted as errors, failures explained,
files and directories, --json, --junit read back by junitparser, --server against a real server
(uploaded evaluators), and sandbox parity (a dependency the process sandbox cannot install)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from crossaudit import Client
from tests.e2e.conftest import ROOT, ServerProcess, key, need_docker, run_cli
from tests.e2e.policies import UPLOAD_CODE, custom_policy, returns, uses_upload

pytestmark = pytest.mark.e2e
CLI_TIMEOUT_S = 600

ZERO = custom_policy(
    "zero",
    """
    def evaluate(prompt, response, context):
        if "divide" in response:
            return {"score": 1 / 0}
        return {"score": 0.0 if "bad" in response else 1.0}
    """,
    evaluator="div",
    rules=["divided"],
    description="an evaluator that divides by zero on request",
) + """test_cases:
  - name: fine
    input: {response: "hello"}
    expected_result: pass
  - name: zero_division_expected_fail
    input: {response: "divide"}
    expected_result: fail
  - name: zero_division_expected_error
    input: {response: "divide"}
    expected_result: error
    expected_action: block
"""

WRONG = custom_policy(
    "wrong",
    returns('{"score": 0.25 if "bad" in response else 1.0}'),
    evaluator="kw",
    rules=["no_bad"],
    action="flag",
    description="a case whose expectation is wrong",
) + """test_cases:
  - name: ok
    input: {response: "fine"}
    expected_result: pass
  - name: wrongly_expected
    input: {response: "bad"}
    expected_result: pass
"""

NO_CASES = """
name: untested
description: no test cases
version: "1.0"
rules: []
"""

TABULATE = """
name: tabulated
description: declares a pip dependency the server installs
version: "1.0"
evaluators:
  - name: fmt
    type: custom
    config:
      dependencies: ["tabulate"]
      code: |
        from tabulate import tabulate

        def evaluate(prompt, response, context):
            table = tabulate([[response, len(response)]])
            return {"score": 1.0 if "x" not in response else 0.0, "details": {"table": table}}
rules:
  - name: formatted
    evaluator: fmt
    threshold: 0.5
    action: block
test_cases:
  - name: renders
    input: {response: "hello"}
    expected_result: pass
  - name: x_is_blocked
    input: {response: "x"}
    expected_result: fail
"""

UPLOAD_CASES = """
test_cases:
  - name: blocks
    input: {response: "please block me"}
    expected_result: fail
    expected_action: block
  - name: allows
    input: {response: "fine"}
    expected_result: pass
"""


def run(
    *args: str, server: ServerProcess | None = None, api_key: str | None = None, sandbox: str | None = "process"
) -> subprocess.CompletedProcess[str]:
    return run_cli("policy", "test", *args, server=server, api_key=api_key, sandbox=sandbox, timeout=CLI_TIMEOUT_S)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_an_evaluator_that_raises_is_an_error_not_a_pass(tmp_path: Path) -> None:
    policy = write(tmp_path / "zero.yaml", ZERO)
    res = run(str(policy))
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert "  PASS  fine: pass/allow" in lines
    err = next(line for line in lines if "zero_division_expected_fail" in line)
    assert err.startswith("  ERROR zero_division_expected_fail: expected fail, got error/block")
    assert "(errored rules: divided)" in err
    assert "ZeroDivisionError: division by zero" in err
    assert "  PASS  zero_division_expected_error: error/block (errored rules: divided)" in lines
    assert "  2 passed, 0 failed, 1 error" in lines
    # the failing case explains itself: its rule, with status, threshold, action, reason and error
    table = res.stdout.split(err, 1)[1]
    assert "divided" in table and "0.5" in table and "block" in table and "SandboxCodeError" in table
    report = json.loads(run(str(policy), "--json").stdout)
    (suite,) = report["suites"]
    assert [c["status"] for c in suite["cases"]] == ["pass", "error", "pass"]
    assert report["summary"]["errors"] == 1 and report["ok"] is False
    (rule,) = suite["cases"][1]["rules"]
    assert rule["status"] == "error" and rule["threshold"] == 0.5 and rule["action"] == "block"
    assert "ZeroDivisionError" in rule["errors"][0]


def test_failures_explain_themselves_and_verbose_explains_passes(tmp_path: Path) -> None:
    policy = write(tmp_path / "wrong.yaml", WRONG)
    res = run(str(policy))
    assert res.returncode == 1
    assert "  FAIL  wrongly_expected: expected pass, got fail/flag" in res.stdout
    assert "  PASS  ok: pass/allow" in res.stdout
    explained = res.stdout.split("wrongly_expected", 1)[1]
    row = next(line for line in explained.splitlines() if "no_bad" in line)
    assert "fail" in row and "0.25" in row and "0.5" in row and "flag" in row
    assert res.stdout.count("no_bad") == 1  # passing cases are not explained without -v
    verbose = run(str(policy), "-v")
    assert verbose.stdout.count("no_bad") == 2


def test_files_and_directories_with_junit_and_json(tmp_path: Path) -> None:
    tree = tmp_path / "policies"
    write(tree / "zero.yaml", ZERO)
    write(tree / "nested" / "wrong.yml", WRONG)
    write(tree / "nested" / "untested.yaml", NO_CASES)  # found in a directory: skipped
    write(tree / ".hidden" / "ignored.yaml", "not: a policy")
    write(tree / "notes.txt", "not yaml")
    extra = write(tmp_path / "single" / "zero_again.yaml", ZERO.replace("name: zero", "name: zero-again"))
    junit = tmp_path / "report.xml"
    res = run(str(tree), str(extra), "--junit", str(junit), "--json")
    assert res.returncode == 1
    report = json.loads(res.stdout)
    files = [Path(s["file"]).relative_to(tmp_path).as_posix() for s in report["suites"]]
    assert files == ["policies/nested/untested.yaml", "policies/nested/wrong.yml", "policies/zero.yaml",
                     "single/zero_again.yaml"]  # fmt: skip
    assert report["summary"] == {
        "policies": 4, "skipped_policies": 1, "cases": 8, "tests": 9, "passed": 5, "failed": 1, "errors": 2,
        "skipped": 1,
    }  # fmt: skip
    xml = JUnitXml.fromfile(str(junit))
    suites = {s.name: s for s in xml}
    assert set(suites) == {"untested", "wrong", "zero", "zero-again"}
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (9, 1, 2, 1)
    zero = {c.name: c for c in suites["zero"]}
    assert zero["fine"].is_passed and zero["zero_division_expected_error"].is_passed
    (error,) = zero["zero_division_expected_fail"].result
    assert isinstance(error, Error) and "ZeroDivisionError" in error.text and "rule divided: error" in error.text
    (failure,) = {c.name: c for c in suites["wrong"]}["wrongly_expected"].result
    assert isinstance(failure, Failure) and failure.message == "expected pass, got fail/flag"
    assert "rule no_bad: fail, score 0.25, threshold 0.5, action flag" in failure.text
    (skipped,) = next(iter(suites["untested"])).result
    assert isinstance(skipped, Skipped)
    # text: one block per policy and a total
    text = run(str(tree), str(extra)).stdout
    assert "policies/nested/untested.yaml: untested: skipped (no test cases)" in text
    assert "total: 4 policies, 5 passed, 1 failed, 2 errors, 1 skipped (no test cases)" in text  # JUnit's 9 tests


def test_a_named_file_without_cases_or_an_invalid_one_is_an_error(tmp_path: Path) -> None:
    res = run(str(write(tmp_path / "untested.yaml", NO_CASES)))
    assert res.returncode == 1 and "no test cases" in res.stdout
    bad = write(tmp_path / "bad.yaml", "name: x\ndescription: d\nversion: '1'\nrules: [{name: r, evaluator: nope}]\n")
    good = write(tmp_path / "good.yaml", WRONG.split("  - name: wrongly_expected")[0])
    res = run(str(bad), str(good), "--json")
    report = json.loads(res.stdout)
    assert res.returncode == 1 and "undefined evaluator 'nope'" in report["suites"][0]["error"]
    assert report["suites"][1]["cases"][0]["status"] == "pass"  # the other file still ran
    assert run(str(tmp_path / "missing.yaml")).returncode == 1
    assert run().returncode == 2
    assert run(str(bad), str(good), "--input", str(bad)).returncode == 2  # --input: one policy only


def test_a_dependency_the_process_sandbox_cannot_install_is_said_plainly(tmp_path: Path) -> None:
    assert importlib.util.find_spec("tabulate") is None, "this test needs a package the virtualenv lacks"
    res = run(str(write(tmp_path / "tab.yaml", TABULATE)), "--sandbox", "process", "--json")
    assert res.returncode == 1
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "local results may differ from the server's" in warnings[0]
    assert "dependency 'tabulate' needs the docker sandbox" in warnings[0]
    assert "the process sandbox cannot install packages" in warnings[0]
    (suite,) = json.loads(res.stdout)["suites"]
    assert suite["where"] == "local (process sandbox)" and suite["warnings"]
    for case in suite["cases"]:
        assert case["status"] == "error" and "needs the docker sandbox" in case["error"]


@pytest.mark.docker
def test_locally_the_server_sandbox_installs_the_dependency(tmp_path: Path) -> None:
    need_docker()
    res = run(str(write(tmp_path / "tab.yaml", TABULATE)), sandbox=None)  # default: auto, as `serve`
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[local (docker sandbox)]" in res.stdout and "2 passed, 0 failed, 0 errors" in res.stdout
    assert "warning:" not in res.stderr


def test_against_a_server_with_an_uploaded_evaluator(server: ServerProcess, tmp_path: Path) -> None:
    with Client(server.address, api_key=key("globex")) as c:
        uploaded = c.upload_evaluator("cli-test-upload", UPLOAD_CODE)
    policy = write(tmp_path / "uses_upload.yaml", uses_upload(uploaded.id) + UPLOAD_CASES)
    deploy = subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", "policy", "deploy", str(policy), "--server", server.address,
         "--api-key", key("globex")],
        cwd=ROOT, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert deploy.returncode == 0, deploy.stderr
    junit = tmp_path / "server.xml"
    res = run(str(policy), "--server", "--junit", str(junit), "--json", server=server)
    assert res.returncode == 0, res.stdout + res.stderr
    (suite,) = json.loads(res.stdout)["suites"]
    assert suite["where"] == f"server {server.address} (production)" and suite["warnings"] == []
    assert [(c["name"], c["status"], c["actual"]) for c in suite["cases"]] == [
        ("blocks", "pass", "fail/block"),
        ("allows", "pass", "pass/allow"),
    ]
    assert all(c["decision"]["decision_id"] for c in suite["cases"])
    xml = JUnitXml.fromfile(str(junit))
    assert (xml.tests, xml.failures, xml.errors) == (2, 0, 0)
    # locally the uploaded evaluator does not exist: errors, saying why
    local = run(str(policy), "--json")
    assert local.returncode == 1 and "which only a server has (use --server)" in local.stderr
    assert {c["status"] for c in json.loads(local.stdout)["suites"][0]["cases"]} == {"error"}
    # a file that is not what is deployed: the cases still run against the deployed version, said so
    edited = write(tmp_path / "edited.yaml", policy.read_text().replace('version: "1.0"', 'version: "1.1"'))
    res = run(str(edited), f"--server={server.address}", server=server)
    assert res.returncode == 0 and "differs from the deployed 'uses-upload' (revision 1 in production)" in res.stderr
    # the same counting on the server: the ZeroDivisionError case is an error there too
    zero = write(tmp_path / "zero.yaml", ZERO)
    with Client(server.address, api_key=key("globex")) as c:
        c.deploy_policy(zero)
    res = run(str(zero), "--server", "--json", server=server)
    assert res.returncode == 1
    assert [c["status"] for c in json.loads(res.stdout)["suites"][0]["cases"]] == ["pass", "error", "pass"]


def test_another_tenants_deployment_is_not_reachable(server: ServerProcess, tmp_path: Path) -> None:
    policy = write(tmp_path / "wrong.yaml", WRONG.replace("name: wrong\n", "name: acme-wrong\n", 1))
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(policy)
    res = run(str(policy), "--server", "--json", server=server, api_key=key("globex"))
    (suite,) = json.loads(res.stdout)["suites"]
    assert res.returncode == 1 and suite["cases"] == []
    # the same answer as a policy that exists nowhere: another tenant's deployments are never named
    assert suite["error"] == (f"policy 'acme-wrong' is not deployed to 'production' (nor to any other environment; "
                              f"crossaudit policy list shows what is) (server {server.address})")
    mine = run(str(policy), "--server", server=server, api_key=key("acme"))
    assert mine.returncode == 1 and "FAIL  wrongly_expected" in mine.stdout  # acme reaches its own
    res = run(str(policy), "--server", "127.0.0.1:1", "--timeout", "3", server=server)
    assert res.returncode == 1 and res.stderr.startswith("error: cannot reach the CrossAudit server at 127.0.0.1:1")
    assert "crossaudit serve --dev" in res.stderr  # says what to do


def test_llm_answers_recorded_then_replayed_with_the_provider_gone(tmp_path: Path) -> None:
    """``--record DIR`` against a local OpenAI-compatible server, which is then stopped:
    ``--replay DIR`` answers from the cassette, in a fresh process with no key and no network."""
    from tests.unit.test_llm_providers import FakeProviders

    fake = FakeProviders()
    try:
        path = write(
            tmp_path / "judged.yaml",
            f"""
name: judged
description: an LLM judge
version: "1.0"
evaluators:
  - name: judge
    type: llm
    config: {{provider: openai_compatible, model: llama3, base_url: "{fake.url}/v1"}}
rules:
  - {{name: safe, evaluator: judge, threshold: 0.5, action: block}}
test_cases:
  - name: fine
    input: {{response: "hello"}}
    expected_result: pass
  - name: abusive
    input: {{response: "you idiot"}}
    expected_result: fail
    expected_action: block
""",
        )
        fake.answer('{"safety_score": 0.9, "violations": [], "reasoning": "fine"}')
        fake.answer('{"safety_score": 0.1, "violations": ["insult"], "reasoning": "abusive"}')
        rec = tmp_path / "cassettes"
        no_proxy = {"NO_PROXY": "127.0.0.1", "HTTP_PROXY": None, "HTTPS_PROXY": None, "OPENAI_API_KEY": None}
        res = run_cli("policy", "test", str(path), "--json", "--record", str(rec), env=no_proxy)
        assert res.returncode == 0, res.stderr
        assert len(fake.requests) == 2 and (rec / "judged@1.0.json").is_file()
    finally:
        fake.close()
    recorded = json.loads(res.stdout)
    res = run_cli("policy", "test", str(path), "--json", "--replay", str(rec), env=no_proxy)
    assert res.returncode == 0, res.stderr
    replayed = json.loads(res.stdout)
    assert [c["rules"] for c in replayed["suites"][0]["cases"]] == [c["rules"] for c in recorded["suites"][0]["cases"]]
    assert replayed["cassette"]["calls"] == 2 and replayed["cassette"]["unrecorded"] == 0

    path.write_text(path.read_text().replace('version: "1.0"', 'version: "1.1"'))
    res = run_cli("policy", "test", str(path), "--replay", str(rec), env=no_proxy)
    assert res.returncode == 2 and "recorded for version 1.0, not 1.1" in res.stderr
