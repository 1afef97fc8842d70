"""crossaudit.evals.dataset: JSONL and CSV rows, every problem at once with its line, unknown rules named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossaudit.evals.dataset import Row, check_rows, load_dataset, row_to_json
from crossaudit.kernel.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[2]
RULES = ["no_profanity", "tone", "redact_emails"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_jsonl_rows() -> None:
    rows = load_dataset(ROOT / "policies" / "demo_offline.eval.jsonl", [*RULES, "hostile_tone_review"])
    assert len(rows) == 24
    first = rows[0]
    assert first.line == 1 and first.id == "friendly" and first.source == "file"
    assert first.passed is True and first.action == "allow"
    assert first.rules["no_profanity"] is True
    profane = next(r for r in rows if r.id == "profanity_plain")
    assert profane.rules == {"no_profanity": False}


def test_defaults_and_round_trip(tmp_path: Path) -> None:
    p = write(
        tmp_path, "d.jsonl", '{"response": "hi", "passed": true}\n\n{"response": "x", "rules": {"tone": "fail"}}\n'
    )
    rows = load_dataset(p, RULES)
    assert [r.id for r in rows] == ["line-1", "line-3"]  # blank lines keep their numbers
    assert rows[0].prompt == "" and rows[0].context == {} and rows[0].rules == {}
    again = write(tmp_path, "again.jsonl", "".join(json.dumps(row_to_json(r)) + "\n" for r in rows))
    back = load_dataset(again, RULES)
    assert [(r.id, r.prompt, r.response, r.passed, r.rules) for r in back] == [
        (r.id, r.prompt, r.response, r.passed, r.rules) for r in rows
    ]


def test_every_problem_at_once_with_lines(tmp_path: Path) -> None:
    text = "\n".join(
        [
            '{"response": "ok", "passed": true}',  # 1: fine
            '{"response": "ok", "passed": "yes"}',  # 2: passed not a bool
            "{not json",  # 3
            '{"response": "ok", "rules": {"toen": "fail"}}',  # 4: unknown rule, named with a suggestion
            '{"response": "ok", "rules": {"tone": "maybe"}}',  # 5: bad label
            '{"response": 3, "action": "explode"}',  # 6: two problems on one line
            '{"prompt": "only a prompt", "passed": false}',  # 7: nothing to evaluate
            '{"response": "ok", "colour": "red", "passed": true}',  # 8: unknown field
            '{"response": "ok"}',  # 9: no label
            "[1, 2]",  # 10: not an object
        ]
    )
    with pytest.raises(InvalidInputError) as e:
        load_dataset(write(tmp_path, "bad.jsonl", text), RULES)
    msg = e.value.message
    for line, needle in [
        (2, "passed: expected true or false"),
        (3, "invalid JSON"),
        (4, "rules.toen: rule 'toen' is not in the policy (did you mean 'tone'?)"),
        (5, "rules.tone: expected pass or fail"),
        (6, "response: expected a string"),
        (6, "action: 'explode' is not one of"),
        (7, "no response"),
        (8, "unknown field 'colour'"),
        (9, "no label"),
        (10, "expected a JSON object"),
    ]:
        assert f"bad.jsonl:{line}: {needle}" in msg, (line, needle, msg)
    assert ":1:" not in msg
    assert "bad.jsonl: 11 problem(s):" in msg  # line 6 has three: response, action, nothing to evaluate
    assert msg.index("bad.jsonl:2:") < msg.index("bad.jsonl:3:")  # in line order


def test_unknown_rule_without_a_close_name_lists_the_rules(tmp_path: Path) -> None:
    p = write(tmp_path, "d.jsonl", '{"response": "x", "rules": {"completely_else": "pass"}}\n')
    with pytest.raises(InvalidInputError, match=r"rule 'completely_else' is not in the policy \(its rules: "):
        load_dataset(p, RULES)


def test_empty_dataset(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="no rows"):
        load_dataset(write(tmp_path, "empty.jsonl", "\n\n"), RULES)
    with pytest.raises(InvalidInputError, match="no rows"):
        load_dataset(write(tmp_path, "empty.csv", "id,response,passed\n"), RULES)
    with pytest.raises(InvalidInputError, match="file not found"):
        load_dataset(tmp_path / "nope.jsonl", RULES)
    with pytest.raises(InvalidInputError, match="no rows"):
        check_rows([], RULES)


def test_repeated_ids(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "d.jsonl",
        '{"id": "a", "response": "x", "passed": true}\n{"id": "a", "response": "y", "passed": true}\n',
    )
    with pytest.raises(InvalidInputError, match=r"d.jsonl:2: id 'a' repeats line 1's"):
        load_dataset(p, RULES)


def test_csv_with_rule_columns_and_json_columns(tmp_path: Path) -> None:
    text = (
        "id,prompt,response,context,passed,action,rule:tone,rule:no_profanity\n"
        'r1,Hi,"Hello, friend",,true,allow,pass,pass\n'
        'r2,Rude?,badword1,"{""user"": ""u1""}",false,block,,fail\n'
    )
    rows = load_dataset(write(tmp_path, "d.csv", text), RULES)
    assert rows[0] == Row(
        2, "r1", "Hi", "Hello, friend", {}, True, "allow", {"tone": True, "no_profanity": True}, {}, "file"
    )
    assert rows[1].line == 3 and rows[1].context == {"user": "u1"} and rows[1].rules == {"no_profanity": False}
    text2 = 'response,rules,scores\nhi,"{""tone"": ""fail""}","{""tone"": 0.2}"\n'
    (row,) = load_dataset(write(tmp_path, "d2.csv", text2), RULES)
    assert row.rules == {"tone": False} and row.scores == {"tone": 0.2}


def test_csv_problems_are_located_by_record(tmp_path: Path) -> None:
    text = (
        "id,response,passed,rule:tnoe,weird\n"  # 1: an unknown column; rule:tnoe an unknown rule
        "a,ok,true,pass,\n"  # 2
        "b,ok,perhaps,,\n"  # 3
        "c,ok,true,,,extra\n"  # 4: a value too many
    )
    with pytest.raises(InvalidInputError) as e:
        load_dataset(write(tmp_path, "d.csv", text), RULES)
    msg = e.value.message
    assert "d.csv:1: unknown column 'weird'" in msg
    assert "d.csv:2: rules.tnoe: rule 'tnoe' is not in the policy (did you mean 'tone'?)" in msg
    assert "d.csv:3: passed: expected true or false, got 'perhaps'" in msg
    assert "d.csv:4: 1 value(s) more than the header's columns" in msg


def test_rows_without_text_need_scores(tmp_path: Path) -> None:
    p = write(tmp_path, "prod.jsonl", '{"id": "review:1", "rules": {"tone": "fail"}, "scores": {"tone": 0.2}}\n')
    (row,) = load_dataset(p, RULES)
    assert row.prompt is None and row.response is None and row.scores == {"tone": 0.2}
    bad = write(tmp_path, "bad.jsonl", '{"rules": {"tone": "fail"}, "scores": {"tone": 1.5}}\n')
    with pytest.raises(InvalidInputError, match=r"scores.tone: expected a number in \[0, 1\]"):
        load_dataset(bad, RULES)


def test_check_rows_names_unknown_rules() -> None:
    rows = [Row(4, "review:9", None, None, {}, None, None, {"gone": False}, {"gone": 0.1}, "review:9")]
    with pytest.raises(InvalidInputError, match=r"rows:4: rule 'gone' is not in the policy"):
        check_rows(rows, RULES)


def test_the_json_schema_agrees_with_the_loader() -> None:
    import jsonschema

    schema = json.loads((ROOT / "policies" / "dataset.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for line in (ROOT / "policies" / "demo_offline.eval.jsonl").read_text().splitlines():
        validator.validate(json.loads(line))
    good = [
        {"response": "x", "passed": True},
        {"id": 3, "prompt": "p", "response": "x", "context": {"a": 1}, "action": "block"},
        {"rules": {"tone": "fail"}, "scores": {"tone": 0.25}},
        {
            "stage": "tool_call",
            "tool": {"name": "send", "arguments": {"to": "a@b.c"}, "call_id": "c1"},
            "passed": False,
        },
        {"stage": "tool_call", "prompt": "p", "tool": {"name": "send", "arguments": "[1, 2]"}, "action": "allow"},
        {"stage": "tool_result", "tool": {"name": "fetch"}, "response": "page", "passed": True},
        {"stage": "tool_result", "response": "page", "rules": {"tone": "pass"}},
        {"stage": "input", "prompt": "p", "response": "p", "passed": True},
    ]
    bad = [
        {"response": "x"},  # no label
        {"response": "x", "passed": "yes"},
        {"response": "x", "rules": {"tone": "Fail"}},
        {"response": "x", "action": "explode"},
        {"prompt": "only", "passed": False},  # nothing to evaluate
        {"response": "x", "passed": True, "colour": "red"},
        {"rules": {"tone": "fail"}, "scores": {"tone": 1.5}},
        {"response": 3, "passed": True},
        {"stage": "tool", "response": "x", "passed": True},
        {"stage": "tool_call", "tool": {"arguments": {}}, "passed": True},  # no name
        {"stage": "tool_call", "tool": {"name": "send"}, "passed": True},  # no arguments
        {"stage": "tool_call", "tool": {"name": "send", "arguments": 3}, "passed": True},
        {"stage": "tool_call", "tool": {"name": "", "arguments": {}}, "passed": True},
        {"stage": "tool_call", "response": "{}", "tool": {"name": "send", "arguments": {}}, "passed": True},
        {"stage": "tool_call", "tool": {"name": "send", "arguments": {}, "colour": 1}, "passed": True},
        {"stage": "tool_call", "tool": {"name": "s", "arguments": {}}, "context": {"tool": {}}, "passed": True},
        {"stage": "tool_result", "tool": {"name": "fetch", "arguments": {}}, "response": "x", "passed": True},
        {"stage": "tool_result", "prompt": "p", "response": "x", "passed": True},
        {"stage": "tool_result", "tool": {"name": "fetch"}, "passed": True},  # no output
        {"response": "x", "tool": {"name": "fetch"}, "passed": True},  # a tool without a tool stage
    ]
    for doc in good:
        validator.validate(doc)
    for doc in bad:
        assert not validator.is_valid(doc), doc
    for n, doc in enumerate(good + bad):  # the loader accepts exactly what the schema accepts
        assert _loads(doc) == (n < len(good)), doc


def _loads(doc: dict) -> bool:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "one.jsonl"
        path.write_text(json.dumps(doc) + "\n")
        try:
            load_dataset(path, RULES)
        except InvalidInputError:
            return False
    return True
