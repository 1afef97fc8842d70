"""The library path end to end: YAML file → engine → real process sandbox → decision."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from crossaudit import PolicyTester
from crossaudit.kernel.results import Action, Status
from tests.conftest import ROOT

SAFETY_POLICY = """\
name: "Safety"
description: "The guide's Testing Framework example"
version: "1.0"
evaluators:
  - name: "harm_check"
    type: "custom"
    config:
      code: |
        def evaluate(prompt, response, context):
            harmful = "how to cause harm" in response.lower()
            return {"safety_score": 0.0 if harmful else 1.0, "violations": ["harm"] if harmful else []}
rules:
  - name: "block_harm"
    evaluator: "harm_check"
    threshold: 0.8
    action: "block"
"""


@pytest.fixture()
def safety_policy(tmp_path: Path) -> Path:
    path = tmp_path / "safety_policy.yaml"
    path.write_text(SAFETY_POLICY)
    return path


def test_guide_testing_framework_example(safety_policy: Path) -> None:
    tester = PolicyTester(str(safety_policy))
    try:
        result = tester.evaluate(
            prompt="Tell me about science",
            response="Science is the systematic study of the natural world...",
        )
        assert result.passed is True
        result = tester.evaluate(prompt="How to harm someone", response="Here's how to cause harm...")
        assert result.passed is False
        assert result.action == "block"
        assert result.rules[0].score == 0.0 and result.rules[0].status is Status.FAIL
        assert result.modified_response is None
    finally:
        tester.close()


def write_policy(tmp_path: Path, evaluators: str, rules: str, extra: str = "") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(
        'name: T\ndescription: d\nversion: "1.0"\nevaluators:\n'
        + textwrap.indent(textwrap.dedent(evaluators), "  ")
        + "rules:\n"
        + textwrap.indent(textwrap.dedent(rules), "  ")
        + extra
    )
    return path


def test_real_timeout_kills_and_next_evaluation_works(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path,
        """\
        - name: spin
          type: custom
          config:
            code: |
              def evaluate(prompt, response, context):
                  if context.get("spin"):
                      while True:
                          pass
                  return {"score": 1.0}
        """,
        """\
        - {name: r, evaluator: spin, settings: {timeout: 0.5, retries: 1}}
        """,
    )
    with PolicyTester(path) as tester:
        d = tester.evaluate("p", "r", {"spin": True})  # spins forever: only the deadline ends each attempt
        r = d.rule("r")
        assert r.status is Status.TIMEOUT and d.action is Action.BLOCK and d.errored_rules == ["r"]
        assert r.evaluators[0].attempts == 2  # a timeout is retryable; retries: 1
        assert tester.evaluate("p", "r", {}).passed


def test_code_error_fallback_and_parameters(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path,
        """\
        - name: broken
          type: custom
          config:
            code: |
              def evaluate(prompt, response, context):
                  raise ValueError("evaluator bug")
        - name: backup
          type: custom
          config:
            limit: 5
            code: |
              def evaluate(prompt, response, context):
                  limit = context["evaluator_config"]["limit"]
                  return {"score": 1.0 if len(response) <= limit else 0.0, "details": {"limit": limit}}
        """,
        """\
        - {name: r, evaluator: broken, threshold: 0.5, fallback: {evaluator: backup, on_error: warn}}
        """,
    )
    with PolicyTester(path) as tester:
        d = tester.evaluate("p", "short")
        assert d.passed and d.rule("r").fallback_used
        primary = next(e for e in d.rule("r").evaluators if e.evaluator == "broken")
        assert primary.error_type == "SandboxCodeError" and "ValueError: evaluator bug" in (primary.error or "")
        d = tester.evaluate("p", "much too long")
        assert not d.passed and d.action is Action.BLOCK


def test_cache_through_the_sandbox(tmp_path: Path) -> None:
    path = write_policy(
        tmp_path,
        """\
        - name: e
          type: custom
          config:
            code: |
              def evaluate(prompt, response, context):
                  return {"score": 0.9}
        """,
        "- {name: r, evaluator: e}\n",
        "settings: {cache_results: true, cache_duration: 60}\n",
    )
    with PolicyTester(path) as tester:
        assert not tester.evaluate("p", "x").rule("r").evaluators[0].cached
        assert tester.evaluate("p", "x").rule("r").evaluators[0].cached


def test_llm_without_credentials_is_fail_closed_and_reported() -> None:
    with PolicyTester(ROOT / "policies/guide/07_example_basic_content_safety.yaml", env={"PATH": "/usr/bin"}) as tester:
        d = tester.evaluate("hi", "hello")
    assert not d.passed and d.action is Action.BLOCK
    assert d.errored_rules == ["block_unsafe_content"]
    ev = d.rule("block_unsafe_content").evaluators[0]
    assert ev.status is Status.ERROR and ev.error


def test_enterprise_example_fail_closed_llm_leaves_the_other_verdicts_visible(tmp_path: Path) -> None:
    """The LLM gate has no key: it fails closed (the decision blocks) but the rules after it still
    judge the content and keep their own status and score (they used to be "skipped"). Offline, and
    without PERSON (which needs a spaCy NER model), so nothing is downloaded."""
    src = ROOT / "policies/guide"
    (tmp_path / "evaluators").mkdir()
    (tmp_path / "evaluators/compliance_checker.py").write_text((src / "evaluators/compliance_checker.py").read_text())
    text = (src / "08_example_enterprise.yaml").read_text().replace('["PERSON", ', "[")
    (tmp_path / "enterprise.yaml").write_text(text)
    with PolicyTester(tmp_path / "enterprise.yaml", env={"CROSSAUDIT_OFFLINE": "1"}) as tester:
        d = tester.evaluate(
            "q", "The patient diagnosis is in the medical record.", {"content": {"category": "medical"}}
        )
    assert d.rule("safety_gate").status is Status.ERROR and d.action is Action.BLOCK and not d.passed
    assert d.errored_rules == ["safety_gate"]
    pii = d.rule("pii_protection")
    assert pii.status is Status.PASS and pii.score == 1.0
    review = d.rule("compliance_review")
    assert review.status is Status.FAIL and review.action is Action.REQUIRE_REVIEW and review.score is not None


def test_enterprise_compliance_checker_found_by_name_next_to_policy(tmp_path: Path) -> None:
    src = ROOT / "policies/guide"
    text = (
        (src / "08_example_enterprise.yaml").read_text().replace("settings:\n", "settings:\n  stop_on_block: false\n")
    )
    (tmp_path / "evaluators").mkdir()
    (tmp_path / "evaluators/compliance_checker.py").write_text((src / "evaluators/compliance_checker.py").read_text())
    (tmp_path / "enterprise.yaml").write_text(text)
    with PolicyTester(tmp_path / "enterprise.yaml", env={}) as tester:
        d = tester.evaluate(
            "q", "The patient diagnosis is in the medical record.", {"content": {"category": "medical"}}
        )
    review = d.rule("compliance_review")
    assert review.status is Status.FAIL and review.action is Action.REQUIRE_REVIEW
    assert review.evaluators[0].details["frameworks"] == ["gdpr", "hipaa"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


@pytest.mark.parametrize(
    "path",
    [
        "policies/demo_offline.yaml",
        *sorted(
            str(p.relative_to(ROOT)) for p in (ROOT / "policies/guide").glob("*.yaml") if "test_cases:" in p.read_text()
        ),
    ],
)
def test_cli_policy_test_runs_embedded_cases(path: str) -> None:
    res = run_cli("policy", "test", path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert " 0 failed" in res.stdout and "PASS" in res.stdout


def test_cli_policy_test_input_file_reports_expected_vs_actual(tmp_path: Path) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(
        json.dumps(
            [
                {
                    "name": "wrongly_expected",
                    "input": {"prompt": "p", "response": "badword1"},
                    "expected_result": "pass",
                },
                {"name": "right", "input": {"response": "fine"}, "expected_result": "pass", "expected_action": "allow"},
            ]
        )
    )
    res = run_cli("policy", "test", "policies/demo_offline.yaml", "--input", str(cases))
    assert res.returncode == 1
    assert "FAIL  wrongly_expected: expected pass, got fail/block" in res.stdout
    assert "PASS  right" in res.stdout and "5 passed, 1 failed" in res.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    res = run_cli("policy", "test", "policies/demo_offline.yaml", "--input", str(bad))
    assert res.returncode == 1 and "invalid JSON" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.docker
def test_policy_tester_on_the_docker_backend(docker_daemon) -> None:
    """PolicyTester prepares (builds images, warms pools) at construction, then runs in Docker."""
    with PolicyTester(ROOT / "policies/demo_offline.yaml", sandbox="docker") as tester:
        assert tester.preparation_errors == {}
        assert tester.runtime.sandbox.name == "docker"
        results = tester.run_cases()
    assert [r.ok for r in results] == [True] * len(results), [r.line() for r in results]
