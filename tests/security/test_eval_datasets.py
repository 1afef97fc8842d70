"""``crossaudit eval`` against hostile dataset rows: a row nested deeper than the dataset's limit is
a problem of its own line (JSONL, CSV), never ``internal error: RecursionError``; a CSV problem
names the physical line its row starts on; a row the engine cannot take is listed as errored
while the other rows are evaluated, never the end of the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crossaudit import PolicyTester
from crossaudit.evals.dataset import MAX_NESTING, Row, load_dataset
from crossaudit.evals.runner import LLMUsage, run_local, run_server
from crossaudit.kernel.errors import CrossAuditError, InvalidInputError
from crossaudit.kernel.results import Action, Decision
from orchestrator.policy import load_policy
from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.security

RULES = ["r"]
DEEP = 1_000  # past the interpreter's recursion limit
MIDDLE = 500  # parses, but a recursive copy of it does not
# copy.deepcopy takes two Python frames a level: this depth is past the interpreter's 1,000 from any
# stack (MIDDLE alone sits within a few frames of it, so a shallower thread could copy it)
UNCOPYABLE = 800

POLICY = """\
name: "deep"
description: "one rule that passes everything"
version: "1.0"
evaluators:
  - name: "e"
    type: "custom"
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 1.0}
rules:
  - {name: "r", evaluator: "e", threshold: 0.5, action: "block"}
"""


def nested(depth: int) -> Any:
    """An object ``depth`` levels deep (the outer one counted)."""
    doc: Any = {}
    for _ in range(depth - 1):
        doc = {"a": doc}
    return doc


def deep_json(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def row(depth: int, **fields: Any) -> str:
    """A row whose context is ``depth`` levels deep, written without json.dumps (which recurses)."""
    head = json.dumps({"response": "x", "passed": True, **fields})[:-1]
    return head + ', "context": ' + deep_json(depth) + "}"


def problems(path: Path) -> str:
    with pytest.raises(InvalidInputError) as e:
        load_dataset(path, RULES)
    return e.value.message


def test_deep_jsonl_rows_are_problems_of_their_lines(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    lines = [
        '{"response": "ok", "passed": true}',  # 1: fine
        row(DEEP),  # 2: json.loads itself recurses too deep
        "[" * DEEP + "]" * DEEP,  # 3: not even an object
        row(MIDDLE),  # 4: parses, deeper than the limit
        row(MAX_NESTING + 1),  # 5: one level too many
        json.dumps({"response": "ok", "passed": [[[["a"]]]] * 1}),  # 6: a bad value is named, shortly
        json.dumps({"response": "ok", "rules": {"r": nested(MIDDLE // 2)}}),  # 7: deep labels too
    ]
    p.write_text("\n".join(lines) + "\n")
    msg = problems(p)
    assert "RecursionError" not in msg
    for line in (2, 3, 4, 5, 7):
        assert f"d.jsonl:{line}: " in msg and f"nested deeper than {MAX_NESTING} levels" in msg, (line, msg)
    assert "d.jsonl:1:" not in msg
    assert "d.jsonl:6: passed: expected true or false" in msg
    ok = tmp_path / "ok.jsonl"
    ok.write_text(row(MAX_NESTING) + "\n")  # as deep as a server takes a context: loads
    (loaded,) = load_dataset(ok, RULES)
    assert loaded.context == nested(MAX_NESTING)


def test_deep_csv_cells_are_problems_of_their_lines(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    cell = deep_json(DEEP).replace('"', '""')
    middle = deep_json(MIDDLE).replace('"', '""')
    p.write_text(
        "response,passed,context\n"  # 1
        "ok,true,\n"  # 2
        f'x,true,"{cell}"\n'  # 3
        '"two\nlines",true,\n'  # 4-5: one record on two lines
        f'y,true,"{middle}"\n'  # 6
        "z,maybe,\n"  # 7
    )
    msg = problems(p)
    assert "RecursionError" not in msg
    assert f"d.csv:3: context: nested deeper than {MAX_NESTING} levels" in msg
    assert f"d.csv:6: context: nested deeper than {MAX_NESTING} levels" in msg
    assert "d.csv:7: passed: expected true or false, got 'maybe'" in msg  # its physical line, not record 6
    assert "d.csv:2:" not in msg and "d.csv:4:" not in msg


def test_a_csv_field_over_the_size_limit_names_its_own_line(tmp_path: Path) -> None:
    p = tmp_path / "big.csv"
    p.write_text("response,passed\n" + "x" * 200_000 + ",true\n")
    msg = problems(p)
    assert "big.csv:2: invalid CSV: field larger than field limit" in msg, msg
    after = tmp_path / "after.csv"
    after.write_text('response,passed\n"a\nb",true\nok,true\n' + "y" * 200_000 + ",true\n")
    msg = problems(after)
    assert "after.csv:5: invalid CSV: field larger than field limit" in msg, msg


def test_the_cli_lists_a_deep_row_with_its_line(tmp_path: Path) -> None:
    policy = tmp_path / "deep.yaml"
    policy.write_text(POLICY)
    data = tmp_path / "d.jsonl"
    data.write_text('{"response": "ok", "passed": true}\n' + row(DEEP) + "\n")
    res = run_cli("eval", str(policy), str(data), timeout=300)
    assert res.returncode == 2, res.stderr
    assert "internal error" not in res.stderr
    assert f"d.jsonl:2: nested deeper than {MAX_NESTING} levels" in res.stderr


def test_a_row_the_engine_cannot_take_is_listed_and_the_run_goes_on(tmp_path: Path) -> None:
    """A 500-deep context passed loading (before the limit) and then aborted the whole run in the
    engine's copy of the context. A row built elsewhere (not loaded) is refused by the runner, and
    the tester answers a request the engine cannot take with that request's own error."""
    policy = tmp_path / "deep.yaml"
    policy.write_text(POLICY)
    usage = LLMUsage()
    with PolicyTester(str(policy), llm_usage=usage) as tester:
        run = run_local(tester, _rows(nested(MIDDLE)), usage=usage, concurrency=2)
        answers = tester.evaluate_many([("", "fine", {}), ("", "fine", nested(UNCOPYABLE)), ("", "fine", None)])
    by_id = {o.row.id: o for o in run.outcomes}
    assert set(by_id) == {"ok", "deep", "ok2"}
    assert by_id["ok"].passed is True and by_id["ok2"].passed is True and not by_id["ok"].error
    assert by_id["deep"].passed is None and f"nested deeper than {MAX_NESTING} levels" in by_id["deep"].error
    assert isinstance(answers[0], Decision) and isinstance(answers[2], Decision)
    assert isinstance(answers[1], CrossAuditError) and "RecursionError" in answers[1].message


def test_a_row_the_client_cannot_send_is_listed_and_the_run_goes_on() -> None:
    class Refusing:
        def evaluate(self, name: str, prompt: str, response: str, context: Any, **_: Any) -> Any:
            if context:  # what building a Struct of a too deep context raises
                raise RecursionError("maximum recursion depth exceeded")
            return Decision(policy="deep", policy_version="1.0", passed=True, action=Action.ALLOW, rules=[])

    rows = _rows({"a": 1})
    run = run_server(Refusing(), "deep", load_policy(POLICY), rows, environment="production", address="x")
    by_id = {o.row.id: o for o in run.outcomes}
    assert set(by_id) == {"ok", "deep", "ok2"}
    assert "RecursionError" in by_id["deep"].error and by_id["deep"].passed is None
    assert not by_id["ok"].error and by_id["ok"].passed is True
    deep = run_server(Refusing(), "deep", load_policy(POLICY), _rows(nested(MIDDLE)), environment="p", address="x")
    assert f"nested deeper than {MAX_NESTING} levels" in {o.row.id: o for o in deep.outcomes}["deep"].error


def _rows(context: dict[str, Any]) -> list[Row]:
    """Rows as a production source or a caller may build them (not through load_dataset)."""
    return [
        Row(1, "ok", "", "fine", {}, True, None, {}, {}, "file"),
        Row(2, "deep", "", "fine", context, True, None, {}, {}, "file"),
        Row(3, "ok2", "", "also fine", {}, True, None, {}, {}, "file"),
    ]


def test_the_nesting_limit_is_what_a_server_takes_and_lines_are_physical(tmp_path: Path) -> None:
    """MAX_NESTING is the depth a server takes a context at, so a row that loads can be sent; a
    JSONL line ends at LF, CRLF or CR only (a JSON string may hold U+2028 raw, which
    str.splitlines() took for a line end, breaking a valid row in two and renumbering the rest)."""
    from crossaudit.service.config import ServiceLimits

    assert ServiceLimits().max_struct_depth == MAX_NESTING
    p = tmp_path / "d.jsonl"
    p.write_text(
        '{"response": "a\u2028b\u0085c", "passed": true}\r\n{"response": "ok", "passed": "yes"}\n', encoding="utf-8"
    )
    msg = problems(p)
    assert "d.jsonl:2: passed: expected true or false, got 'yes'" in msg
    assert "d.jsonl:1:" not in msg and "d.jsonl:3:" not in msg
    p.write_text('{"response": "a\u2028b", "passed": true}\n', encoding="utf-8")
    (loaded,) = load_dataset(p, RULES)
    assert loaded.response == "a\u2028b"
