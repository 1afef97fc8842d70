"""YAML syntax errors in plain words at the line:column to fix, through the policy loader and
``crossaudit policy validate`` (crossaudit/kernel/yamlerrors.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit.cli.main import main
from crossaudit.kernel.errors import PolicyValidationError
from orchestrator.policy.validate import load_policy

HEAD = 'name: p\ndescription: d\nversion: "1"\n'

CASES = [
    # (what, policy text, the one issue as printed)
    (
        "a key indented deeper than its siblings",
        HEAD + "rules:\n  - name: r\n    evaluator: e\n     threshold: 0.5\n",
        "p.yaml:7:6: YAML syntax: a mapping value is not allowed here (check the indentation of this line)",
    ),
    (
        "a top-level key indented",
        "name: p\n  description: d\n",
        "p.yaml:2:3: YAML syntax: a mapping value is not allowed here (check the indentation of this line)",
    ),
    (
        "a key indented less than its siblings",
        HEAD + "settings:\n  cache:\n    a: 1\n   b: 2\n",
        "p.yaml:7:4: YAML syntax: this line is indented differently from the lines above it "
        "(check the indentation of this line)",
    ),
    (
        "a list item out of line",
        HEAD + "rules:\n  - name: r\n - name: s\n",
        "p.yaml:6:2: YAML syntax: this line is indented differently from the lines above it "
        "(check the indentation of this line)",
    ),
    (
        "a key at the list's indentation",
        HEAD + "rules:\n  - name: r\n  threshold: 1\n",
        "p.yaml:6:3: YAML syntax: this line is indented differently from the lines above it "
        "(check the indentation of this line)",
    ),
    (
        "a list item where a key belongs",
        "name: p\n- r\n",
        "p.yaml:2:1: YAML syntax: a list item ('-') where a key was expected (check the indentation of this line)",
    ),
    (
        "a tab",
        "name: p\n\tdescription: d\n",
        "p.yaml:2:1: YAML syntax: a tab character: YAML indents and separates with spaces only "
        "(replace the tab with spaces, or put the value in quotes)",
    ),
    (
        "an unclosed double quote",
        'name: "p\ndescription: d\n',
        'p.yaml:1:7: YAML syntax: the quoted value that starts here is never closed (add the closing ")',
    ),
    (
        "an unclosed single quote",
        "name: p\ndescription: 'd\n",
        "p.yaml:2:14: YAML syntax: the quoted value that starts here is never closed (add the closing ')",
    ),
    (
        "an unclosed bracket followed by more keys",
        HEAD + "metadata:\n  tags: [a, b\n  owner: c\n",
        "p.yaml:6:8: YAML syntax: the '[' opened at line 5, column 9 is not closed before this: add ']', "
        "separate items with ',', and quote values that contain ': '",
    ),
    (
        "an unclosed brace at the end of the file",
        HEAD + "metadata: {a: 1",
        "p.yaml:4:11: YAML syntax: the '{' opened here is never closed (add '}')",
    ),
    (
        "a value with ': ' in it",
        "name: p\ndescription: note: read this\n",
        "p.yaml:2:18: YAML syntax: a value contains ': ' (a colon and a space): put the value in quotes",
    ),
    (
        "a line without a colon",
        "name: p\ndescription\nversion: 1\n",
        "p.yaml:2:1: YAML syntax: this line is not 'key: value' (add ':' after the key, or indent the line to "
        "continue the value above)",
    ),
    (
        "text after a quoted value",
        "name: 'it's'\n",
        "p.yaml:1:11: YAML syntax: text follows a complete value on this line: put the whole value in quotes "
        "(inside single quotes write ' as '')",
    ),
    (
        "a value starting with @",
        "name: @p\n",
        "p.yaml:1:7: YAML syntax: a value cannot start with '@' in YAML: put the value in quotes",
    ),
    (
        "an alias-looking value",
        "name: *bold* p\n",
        "p.yaml:1:7: YAML syntax: '*' starts a YAML alias, which policies do not use: put the value in quotes",
    ),
    (
        "two documents",
        "name: p\n---\nname: q\n",
        "p.yaml:2:1: YAML syntax: a policy file holds one YAML document: remove the second '---' (or what follows it)",
    ),
    (
        "an unknown escape",
        'name: "a\\q"\n',
        "p.yaml:1:10: YAML syntax: unknown escape '\\q' in a double-quoted value (write '\\\\' for a backslash, "
        "or use single quotes)",
    ),
    (
        "anything else keeps PyYAML's words",
        "name: [a, , b]\n",
        "p.yaml:1:11: YAML syntax: expected the node content, but found ',' (while parsing a flow node)",
    ),
]


@pytest.mark.parametrize(("what", "text", "shown"), CASES, ids=[c[0] for c in CASES])
def test_syntax_errors_are_plain_words_at_line_and_column(what: str, text: str, shown: str) -> None:
    with pytest.raises(PolicyValidationError) as err:
        load_policy(text, "p.yaml")
    assert [str(i) for i in err.value.issues] == [shown], what


def test_a_duplicate_key_names_where_it_first_was() -> None:
    with pytest.raises(PolicyValidationError) as err:
        load_policy(HEAD + "name: q\n", "p.yaml")
    assert [str(i) for i in err.value.issues] == [
        "p.yaml:4:1: name: duplicate key 'name' (first at line 1; a key may appear once in a mapping)"
    ]


def test_policy_validate_prints_the_located_sentence(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(CASES[0][1])
    assert main(["policy", "validate", "p.yaml"]) == 1
    out = capsys.readouterr()
    assert CASES[0][2] in out.out + out.err
    assert "while parsing" not in out.out + out.err and "Traceback" not in out.out + out.err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("description: " + "9" * 5_000, "a number too long"),  # Python refuses ints of > 4300 digits
        ("? " + "9" * 5_000 + "\n: 1", "a number too long"),  # ... as a key too
        ("description: 2026-13-45", "a value that cannot be read"),  # a date out of range
    ],
)
def test_a_scalar_python_cannot_hold_is_a_located_issue(text: str, said: str) -> None:
    """Before: an untyped ValueError (INTERNAL on the server, "internal error" in the CLI)."""
    with pytest.raises(PolicyValidationError) as err:
        load_policy(text, "p.yaml")
    (issue,) = err.value.issues
    assert said in issue.message and issue.file == "p.yaml" and issue.line == 1
