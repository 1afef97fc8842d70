"""How ``policy test`` judges and reports cases, and how ``evaluate`` reads its inputs: the pure
parts (crossaudit/sdk/cases.py, crossaudit/cli/testreport.py, render.py, connect.py, evaluate.py)."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped
from pydantic import ValidationError
from rich.console import Console

from crossaudit.cli import connect, evaluate, render
from crossaudit.cli.testreport import (
    MAX_POLICY_FILES,
    Suite,
    case_explanation,
    discover,
    json_report,
    junit_xml,
    run_ok,
)
from crossaudit.kernel.dsl import TestCase
from crossaudit.kernel.errors import InvalidInputError, RequestTooLargeError
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.sdk.cases import CaseStatus, Tally, errored_rules, judge_case, rule_rows


def case(expected: str, action: str | None = None, name: str = "c") -> TestCase:
    doc = {"name": name, "input": {"response": "r"}, "expected_result": expected}
    if action:
        doc["expected_action"] = action
    return TestCase.model_validate(doc)


def passing() -> Decision:
    rule = RuleResult(
        rule="ok_rule",
        status=Status.PASS,
        passed=True,
        score=0.9,
        threshold=0.5,
        evaluators=[EvaluatorResult(evaluator="e", kind="custom", status=Status.PASS, score=0.9)],
    )
    return Decision(policy="p", policy_version="1", passed=True, action=Action.ALLOW, rules=[rule], decision_id="d1")


def blocked() -> Decision:
    rule = RuleResult(
        rule="strict",
        status=Status.FAIL,
        passed=False,
        score=0.2,
        threshold=0.8,
        action=Action.BLOCK,
        reason="score below threshold",
        evaluators=[EvaluatorResult(evaluator="e", kind="custom", status=Status.FAIL, score=0.2)],
    )
    return Decision(policy="p", policy_version="1", passed=False, action=Action.BLOCK, rules=[rule], decision_id="d2")


def errored(*, listed: bool = True) -> Decision:
    """A fail-closed block because the evaluator raised ZeroDivisionError (``listed``: the engine
    also names the rule in errored_rules, as it does; False: only the rule's status says so)."""
    rule = RuleResult(
        rule="divided",
        status=Status.ERROR,
        passed=False,
        threshold=0.5,
        action=Action.BLOCK,
        reason="no verdict (fail-closed): div: evaluator raised ZeroDivisionError: division by zero",
        evaluators=[
            EvaluatorResult(
                evaluator="div",
                kind="custom",
                status=Status.ERROR,
                error="evaluator raised ZeroDivisionError: division by zero",
                error_type="SandboxCodeError",
            )
        ],
    )
    return Decision(
        policy="p",
        policy_version="1",
        passed=False,
        action=Action.BLOCK,
        rules=[rule],
        errored_rules=["divided"] if listed else [],
        decision_id="d3",
    )


# --- judging --------------------------------------------------------------------------------


def test_matching_decisions_pass_and_wrong_ones_fail() -> None:
    assert judge_case(case("pass"), passing()).status is CaseStatus.PASS
    assert judge_case(case("fail", "block"), blocked()).status is CaseStatus.PASS
    wrong = judge_case(case("pass"), blocked())
    assert (wrong.status, wrong.ok, wrong.error) == (CaseStatus.FAIL, False, None)
    assert wrong.line() == "FAIL  c: expected pass, got fail/block"
    wrong_action = judge_case(case("fail", "flag"), blocked())
    assert wrong_action.status is CaseStatus.FAIL and wrong_action.expected == "fail/flag"


@pytest.mark.parametrize("listed", [True, False])
def test_an_errored_rule_is_an_error_even_when_the_case_expects_fail(listed: bool) -> None:
    r = judge_case(case("fail"), errored(listed=listed))
    assert r.status is CaseStatus.ERROR and not r.ok
    assert r.actual == "error/block (errored rules: divided)"
    assert "ZeroDivisionError" in (r.error or "")
    assert r.line().startswith("ERROR c: expected fail, got error/block")
    assert judge_case(case("pass"), errored(listed=listed)).status is CaseStatus.ERROR


def test_a_case_expecting_an_error_passes_on_one_and_checks_its_action() -> None:
    assert judge_case(case("error"), errored()).status is CaseStatus.PASS
    assert judge_case(case("error", "block"), errored()).status is CaseStatus.PASS
    assert judge_case(case("error", "warn"), errored()).status is CaseStatus.FAIL
    assert judge_case(case("error"), blocked()).status is CaseStatus.FAIL  # no error happened
    assert judge_case(case("error"), passing()).status is CaseStatus.FAIL


def test_a_request_that_could_not_be_evaluated() -> None:
    r = judge_case(case("fail"), None, "policy 'p' not found")
    assert (r.status, r.actual, r.error) == (CaseStatus.ERROR, "error (no decision)", "policy 'p' not found")
    assert judge_case(case("error"), None, "boom").status is CaseStatus.PASS
    assert judge_case(case("error", "block"), None, "boom").status is CaseStatus.FAIL  # no action to compare


def test_notes_reach_only_the_cases_their_evaluator_errored_in() -> None:
    notes = {"div": "dependency 'tabulate' needs the docker sandbox", "other": "unrelated"}
    r = judge_case(case("fail"), errored(), notes=notes)
    assert r.notes == ("dependency 'tabulate' needs the docker sandbox",)
    assert "local results may differ" in (r.error or "") and "unrelated" not in (r.error or "")
    assert judge_case(case("fail"), blocked(), notes=notes).notes == ()


def test_a_rule_rescued_by_its_fallback_is_not_an_error_but_shows_the_primary_error() -> None:
    d = errored(listed=False)
    rescued = d.rules[0].model_copy(
        update={
            "status": Status.PASS,
            "passed": True,
            "score": 0.9,
            "action": None,
            "fallback_used": True,
            "evaluators": [
                EvaluatorResult(evaluator="backup", kind="custom", status=Status.PASS, score=0.9),
                *d.rules[0].evaluators,
            ],
        }
    )
    d = d.model_copy(update={"rules": [rescued], "passed": True, "action": Action.ALLOW})
    assert errored_rules(d) == []
    assert judge_case(case("pass"), d).status is CaseStatus.PASS
    (row,) = rule_rows(d)
    assert row.errors == ("div: SandboxCodeError: evaluator raised ZeroDivisionError: division by zero",)


def test_rows_and_tally() -> None:
    (row,) = rule_rows(blocked())
    assert (row.rule, row.status, row.score, row.threshold, row.action, row.reason) == (
        "strict", "fail", 0.2, 0.8, "block", "score below threshold"
    )  # fmt: skip
    t = Tally()
    for s in (CaseStatus.PASS, CaseStatus.FAIL, CaseStatus.ERROR, CaseStatus.PASS):
        t.add(s)
    assert (t.total, t.ok, t.line()) == (4, False, "2 passed, 1 failed, 1 error")


def test_the_schema_accepts_error_and_nothing_else() -> None:
    assert case("error").expected_result == "error"
    with pytest.raises(ValidationError):
        case("maybe")


# --- discovery ------------------------------------------------------------------------------


def test_directories_are_searched_recursively_skipping_hidden_and_linked_dirs(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "outside").mkdir()
    for p in ("a/one.yaml", "a/b/two.yml", "a/b/notes.txt", ".hidden/three.yaml", "outside/four.yaml"):
        (tmp_path / p).write_text("x")
    os.symlink(tmp_path / "outside", tmp_path / "a" / "link")
    found = discover([str(tmp_path / "a"), str(tmp_path / "a" / "one.yaml"), str(tmp_path / "outside" / "four.yaml")])
    assert [(f.path.relative_to(tmp_path).as_posix(), f.explicit) for f in found] == [
        ("a/b/two.yml", False),
        ("a/one.yaml", False),  # named again: listed once
        ("outside/four.yaml", True),
    ]
    with pytest.raises(InvalidInputError, match="no such file or directory"):
        discover([str(tmp_path / "missing.yaml")])
    assert MAX_POLICY_FILES >= 1000


# --- reports --------------------------------------------------------------------------------


def suites() -> list[Suite]:
    ok = Suite(file="a.yaml", policy="A", cases=[judge_case(case("pass", name="fine"), passing())], where="local")
    bad = Suite(
        file="b.yaml",
        policy="B",
        cases=[
            judge_case(case("pass", name="wrong"), blocked(), duration_s=0.25),
            judge_case(case("fail", name="div\x00\x1b[31m"), errored()),
        ],
        warnings=["local results may differ from the server's: x"],
    )
    broken = Suite(file="c.yaml", error="c.yaml:3:1: rules[0].evaluator: undefined evaluator 'x'")
    skipped = Suite(file="d.yaml", policy="D", skipped="no test cases")
    return [ok, bad, broken, skipped]


def test_junit_xml_reads_back_with_a_junit_reader(tmp_path: Path) -> None:
    path = tmp_path / "report.xml"
    path.write_bytes(junit_xml(suites()))
    xml = JUnitXml.fromfile(str(path))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (5, 1, 2, 1)
    by_name = {s.name: s for s in xml}
    assert set(by_name) == {"A", "B", "c.yaml", "D"}
    a, b, c, d = by_name["A"], by_name["B"], by_name["c.yaml"], by_name["D"]
    assert [tc.is_passed for tc in a] == [True]
    wrong, div = list(b)
    assert wrong.time == 0.25 and isinstance(wrong.result[0], Failure)
    assert wrong.result[0].message == "expected pass, got fail/block"
    assert "rule strict: fail, score 0.2, threshold 0.8, action block" in wrong.result[0].text
    assert isinstance(div.result[0], Error) and "ZeroDivisionError" in div.result[0].text
    assert "\x00" not in div.name and "\x1b" not in div.name  # XML 1.0 cannot carry them: replaced
    assert {p.name for p in b.properties()} >= {"file", "warning"}
    (load,) = list(c)
    assert isinstance(load.result[0], Error) and "undefined evaluator" in load.result[0].text
    (skip,) = list(d)
    assert isinstance(skip.result[0], Skipped)


def test_json_report_and_exit_status() -> None:
    report = json_report(suites(), where="local")
    assert json.loads(json.dumps(report)) == report
    assert report["ok"] is False
    assert report["summary"] == {
        "policies": 4, "skipped_policies": 1, "cases": 3, "tests": 5, "passed": 1, "failed": 1, "errors": 2,
        "skipped": 1,
    }  # fmt: skip
    b = report["suites"][1]
    assert [c["status"] for c in b["cases"]] == ["fail", "error"]
    assert b["cases"][1]["rules"][0]["errors"] == [
        "div: SandboxCodeError: evaluator raised ZeroDivisionError: division by zero"
    ]
    assert run_ok([suites()[0]]) is True
    assert run_ok([suites()[3]]) is False  # nothing ran
    assert run_ok([]) is False


def test_the_console_total_json_and_junit_counts_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JUnit said tests="23" skipped="6" where the console said "17 passed": a policy found without
    test cases is one skipped test in JUnit, so the console's total and the JSON summary count it
    too, and JUnit's tests is their passed + failed + errors + skipped."""
    from crossaudit.cli.policytest import print_text

    runs = suites()
    path = tmp_path / "report.xml"
    path.write_bytes(junit_xml(runs))
    xml = JUnitXml.fromfile(str(path))
    print_text(runs, verbose=False)
    total = capsys.readouterr().out.strip().splitlines()[-1]
    shape = r"total: (\d+) policies, (\d+) passed, (\d+) failed, (\d+) errors, (\d+) skipped \(no test cases\)"
    m = re.fullmatch(shape, total)
    assert m, total
    policies, passed, failed, errors, skipped = map(int, m.groups())
    assert policies == len(runs) == len(list(xml))
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (passed + failed + errors + skipped, failed, errors,
                                                                  skipped)  # fmt: skip
    summary = json_report(runs, where="local")["summary"]
    assert (summary["tests"], summary["passed"], summary["failed"], summary["errors"], summary["skipped"]) == (
        xml.tests, passed, failed, errors, skipped)  # fmt: skip


def test_explanations_name_every_rule_field() -> None:
    text = case_explanation(judge_case(case("fail"), errored()))
    assert text.splitlines()[0].startswith("ERROR c: expected fail, got error/block")
    assert "rule divided: error, score -, threshold 0.5, action block" in text
    assert "evaluator error: div: SandboxCodeError: evaluator raised ZeroDivisionError" in text


def test_tables_show_values_and_never_pass_control_characters_through() -> None:
    d = errored()
    d.rules[0].reason = "evil \x1b]0;title\x07 reason"
    buf = io.StringIO()
    out = Console(file=buf, width=200, force_terminal=False)
    render.print_decision(d, out)
    text = buf.getvalue()
    assert "\x1b" not in text and "\\x1b" in text
    assert "divided" in text and "0.5" in text and "SandboxCodeError" in text
    assert "NOT PASSED  action: block  decision: d3" in text and "errored rules: divided" in text
    assert render.printable("a\tb\nc\x9b") == "a\tb\nc\\x9b"


# --- connection and inputs ------------------------------------------------------------------


def test_a_server_value_that_is_not_an_address_goes_back_to_the_positionals(tmp_path: Path) -> None:
    import argparse

    assert connect.looks_like_address("127.0.0.1:50051") and connect.looks_like_address("localhost:1")
    assert not connect.looks_like_address("keywords") and not connect.looks_like_address("policy.yaml")
    f = tmp_path / "host:1"
    f.write_text("x")
    assert not connect.looks_like_address(str(f))  # an existing path is a path
    args = argparse.Namespace(server="my-policy")
    assert connect.reclaim_positional(args) == "my-policy" and args.server == ""
    args = argparse.Namespace(server="127.0.0.1:9")
    assert connect.reclaim_positional(args) is None and args.server == "127.0.0.1:9"


def test_inputs_come_from_text_files_or_stdin_within_a_bound(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "resp.txt"
    f.write_text("from a file ✓")
    assert evaluate.read_input("plain", "--prompt") == "plain"
    assert evaluate.read_input(f"@{f}", "--response") == "from a file ✓"
    with pytest.raises(InvalidInputError, match="not found"):
        evaluate.read_input(f"@{tmp_path / 'none'}", "--prompt")
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        evaluate.read_input(f"@{tmp_path / 'bin'}", "--prompt")
    # the request limit, the server's variable (limits.max_request_bytes): each input, and together
    monkeypatch.setenv("CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES", "4")
    with pytest.raises(RequestTooLargeError, match=r"more than 4 bytes, .*\(limits.max_request_bytes; set CROSSAUDIT"):
        evaluate.read_input(f"@{f}", "--response")
    with pytest.raises(RequestTooLargeError, match="--prompt is 5 bytes, over the 4 bytes"):
        evaluate.read_input("plain", "--prompt")  # inline text too
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"abc")))
    assert evaluate.read_input("-", "--prompt") == "abc"
    with pytest.raises(RequestTooLargeError, match="together are 6 bytes"):
        evaluate.check_inputs("abc", "d", {})  # + "{}"


def test_context_must_be_a_json_object(tmp_path: Path) -> None:
    assert evaluate.parse_context(None) == {}
    assert evaluate.parse_context('{"user": {"role": "admin"}}') == {"user": {"role": "admin"}}
    (tmp_path / "ctx.json").write_text('{"a": 1}')
    assert evaluate.parse_context(f"@{tmp_path / 'ctx.json'}") == {"a": 1}
    with pytest.raises(InvalidInputError, match="expected a JSON object, got list"):
        evaluate.parse_context("[1]")
    with pytest.raises(InvalidInputError, match="invalid JSON at line 1"):
        evaluate.parse_context("{nope")
    with pytest.raises(InvalidInputError, match="invalid JSON"):
        evaluate.parse_context('{"x": NaN}')
