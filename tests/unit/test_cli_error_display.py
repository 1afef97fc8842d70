"""Each evaluator error is shown once, and short where it repeats (issue 19: a missing model's
dozen-line how-to-fix printed twice per rule, in the reason and in the errors column).

The decisions come from the real engine through PolicyTester, with a Detoxify evaluator whose
model is nowhere (offline, empty store and caches): the real resolution's real message.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from crossaudit import PolicyTester
from crossaudit.cli import policytest, render
from crossaudit.cli.testreport import Suite, case_explanation
from crossaudit.kernel.dsl import TestCase
from crossaudit.kernel.results import Decision, Status
from crossaudit.sdk.cases import judge_case, rule_rows, summary

POLICY = """\
name: no-model
description: two rules share a builtin whose model is missing
version: "1.0"
evaluators:
  - {name: tox, type: builtin, config: {model: detoxify}}
  - {name: fine, type: custom, config: {code: "def evaluate(p, r, c): return {'score': 1.0}"}}
rules:
  - {name: toxic, evaluator: tox, threshold: 0.5, action: flag, priority: 20}
  - {name: also_toxic, evaluator: tox, threshold: 0.7, action: warn, priority: 10}
  - {name: ok, evaluator: fine, threshold: 0.5, action: block}
"""


@pytest.fixture()
def offline(tmp_path: Path) -> dict[str, str]:
    """No Detoxify model in reach: offline, an empty store, empty torch and Hugging Face caches."""
    return {
        "CROSSAUDIT_OFFLINE": "1",
        "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "HF_HOME": str(tmp_path / "hf"),
    }


@pytest.fixture()
def decision(offline: dict[str, str]) -> Decision:
    with PolicyTester(POLICY, env=offline, sandbox="process") as tester:
        return tester.evaluate("hi", "hello")


def printed(decision: Decision) -> str:
    buf = io.StringIO()
    render.print_decision(decision, Console(file=buf, width=160, force_terminal=False))
    return buf.getvalue()


def test_the_reason_leaves_the_error_to_the_errors_column(decision: Decision) -> None:
    rows = {r.rule: r for r in rule_rows(decision)}
    assert decision.rule("toxic").status is Status.ERROR
    assert "Tried, in order" in decision.rule("toxic").reason  # the engine's record keeps it whole
    assert rows["toxic"].reason == "no verdict (fail-closed)"
    (error,) = rows["toxic"].errors
    assert error.startswith("tox: ConfigurationError: detoxify checkpoint (variant original): not found.\n")
    assert "To fix it:" in error and "crossaudit models import detoxify" in error
    assert rows["ok"].status == "pass" and rows["ok"].reason == ""


def test_a_long_error_is_one_line_in_the_table_and_in_full_once_below(decision: Decision) -> None:
    text = printed(decision)
    table, _, below = text.partition("NOT PASSED")
    assert "Tried, in order" not in table and "To fix it" not in table
    assert table.count("(in full below)") == 2  # both rules name it, each in one cell
    # two rules, one evaluator: the whole message once
    assert below.count("To fix it:") == 1 and below.count("Tried, in order:") == 1
    assert "\ntox: ConfigurationError: detoxify checkpoint (variant original): not found.\n  To fix it:\n" in below
    assert len(table.splitlines()) <= 12, table  # a line or two per rule, not a dozen


def test_policy_test_prints_each_long_error_once_per_policy(decision: Decision, capsys) -> None:
    cases = [
        TestCase.model_validate({"name": n, "input": {"response": "hello"}, "expected_result": "pass"})
        for n in ("first", "second")
    ]
    suite = Suite(file="p.yaml", policy="no-model", cases=[judge_case(c, decision) for c in cases])
    for c in suite.cases:
        assert "\n" not in c.line()  # one line per case, for grep
        assert c.line().endswith("toxic: tox: detoxify checkpoint (variant original): not found.; "
                                 "also_toxic: tox: detoxify checkpoint (variant original): not found.")  # fmt: skip
    policytest.print_text([suite], verbose=False)
    out = capsys.readouterr().out
    assert out.count("To fix it:") == 1 and out.count("Tried, in order:") == 1
    assert out.count("(in full below)") == 4  # two rules in each of the two cases' tables
    junit_text = case_explanation(suite.cases[0])  # the JUnit body: the whole text, once per rule
    assert "  reason: no verdict (fail-closed)\n" in junit_text
    assert "\n    To fix it:\n" in junit_text


def test_summary_is_the_first_line() -> None:
    assert summary("what broke.\nTo fix it:\n  - this") == "what broke."
    assert summary("one line  ") == "one line"


def test_details_that_differ_after_the_first_line_are_shown_once(decision: Decision) -> None:
    rows = rule_rows(decision)
    (text,) = render.error_details(rows)
    later = text + " (not retried for 60 s)"  # a later call's remembered failure says more
    again = [row.__class__(**{**row.as_dict(), "errors": (later,)}) for row in rows if row.errors]
    assert render.error_details([*rows, *again]) == [text]
