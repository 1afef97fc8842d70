"""Policy loading and validation: real YAML text and files, every error located."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from crossaudit.kernel.errors import PolicyValidationError
from crossaudit.kernel.limits import PolicyLimits
from orchestrator.policy import load_policy, load_policy_file
from orchestrator.policy.schema import policy_json_schema_text
from tests.conftest import ROOT

HEAD = 'name: "T"\ndescription: "d"\nversion: "1.0"\n'
EVAL = """
evaluators:
  - name: "safety_check"
    type: "custom"
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 1.0}
"""


def issues_of(text: str, **kw) -> list[str]:
    with pytest.raises(PolicyValidationError) as info:
        load_policy(textwrap.dedent(text), "p.yaml", **kw)
    for issue in info.value.issues:
        assert issue.file == "p.yaml"
    return [str(i) for i in info.value.issues]


ALL_POLICY_FILES = sorted(p for p in (ROOT / "policies").rglob("*.yaml"))


@pytest.mark.parametrize("path", ALL_POLICY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_policy_is_valid(path: Path) -> None:
    policy = load_policy_file(path)
    assert policy.name and policy.rules


def test_guide_common_error_missing_required_fields() -> None:
    msgs = issues_of('name: "Test Policy"\n')
    assert any("missing required field 'description'" in m for m in msgs)
    assert any("missing required field 'version'" in m for m in msgs)
    assert all(m.startswith("p.yaml:1:1") for m in msgs)


def test_guide_common_error_undefined_evaluator_with_suggestion() -> None:
    msgs = issues_of(HEAD + EVAL + "rules:\n  - name: test_rule\n    evaluator: safety_chek\n")
    assert msgs == [
        "p.yaml:14:16: rules[0].evaluator: undefined evaluator 'safety_chek' (did you mean 'safety_check'?) "
        "(define it in the evaluators section)"
    ]


def test_guide_common_error_threshold_out_of_range() -> None:
    msgs = issues_of(HEAD + EVAL + "rules:\n  - name: r\n    evaluator: safety_check\n    threshold: 1.5\n")
    assert msgs == ["p.yaml:15:16: rules[0].threshold: threshold must be between 0.0 and 1.0, got 1.5"]


def test_guide_correct_snippets_load() -> None:
    load_policy('name: "Test Policy"\ndescription: "Test policy description"\nversion: "1.0"\n')
    p = load_policy(
        HEAD + 'evaluators:\n  - name: "safety_check"\n    type: "llm"\n'
        'rules:\n  - name: "test_rule"\n    evaluator: "safety_check"\n'
    )
    assert p.rules[0].threshold == 0.5 and p.rules[0].action == "block"
    assert any("no model given" in w for w in p.warnings)


def test_all_errors_reported_at_once_with_did_you_mean() -> None:
    text = (
        HEAD
        + EVAL
        + textwrap.dedent("""\
        rules:
          - name: r1
            evaluatr: safety_check
            threshold: 0.5
            action: blok
          - name: r1
            evaluator: safety_check
            conditions:
              - field: user.role
                operator: equal
                value: admin
        """)
    )
    msgs = issues_of(text)
    joined = "\n".join(msgs)
    assert "unknown field 'evaluatr' (did you mean 'evaluator'?)" in joined
    assert "got 'blok' (did you mean 'block'?)" in joined
    assert "duplicate rule name 'r1'" in joined
    assert "got 'equal' (did you mean 'equals'?)" in joined
    assert "rules[1].conditions[0].operator" in joined
    assert len(msgs) >= 5


@pytest.mark.parametrize(
    ("rule_extra", "expected"),
    [
        ("    conditions: [{field: request.ip, operator: in, value: ['10.0.0.0/33']}]\n", "invalid CIDR range"),
        ("    conditions: [{field: x, operator: regex_match, value: '(a)\\1'}]\n", "invalid regular expression"),
        ("    conditions: [{field: x, operator: in, value: 'abc'}]\n", "needs a list value"),
        ("    conditions: [{field: x, operator: greater_than, value: 'abc'}]\n", "needs a number"),
        (
            "    conditions: [{field: x, operator: equals, value: 1}, {field: x, operator: equals, value: 2}]\n",
            "rule can never run",
        ),
        (
            "    conditions: [{field: x, operator: greater_than, value: 5}, {field: x, operator: less_than, value: 3}]\n",  # noqa: E501
            "rule can never run",
        ),
        ("    threshold: dynamic\n", "threshold 'dynamic' needs threshold_config"),
        ("    threshold_config: {base_threshold: 0.5}\n", "threshold_config needs threshold: 'dynamic'"),
        ("    consensus_strategy: majority\n", "consensus_strategy needs 'evaluators'"),
        ("    fallback: {evaluator: nope}\n", "undefined evaluator 'nope'"),
        (
            "    action: custom\n    action_config: {webhook_url: 'https://h/x', payload: {a: '{{rule.nme}}'}}\n",
            "unknown template field {{rule.nme}} (did you mean 'rule.name'?)",
        ),
        ("    action: flag\n    action_config: {severity: urgent}\n", "got 'urgent'"),
        ("    action: flag\n    action_config: {auto_escalate_after: 'soon'}\n", "auto_escalate_after"),
        (
            "    threshold: dynamic\n    threshold_config: {base_threshold: 0.5, time_of_day_modifier: {'9-17': 0.1}}\n",  # noqa: E501
            "must look like '09:00-17:00'",
        ),
    ],
)
def test_semantic_errors(rule_extra: str, expected: str) -> None:
    msgs = issues_of(HEAD + EVAL + "rules:\n  - name: r\n    evaluator: safety_check\n" + rule_extra)
    assert any(expected in m for m in msgs), msgs
    assert all(":" in m.split(" ")[0] for m in msgs)  # file:line:col prefix


def test_chaining_errors_unknown_later_disabled_cycle() -> None:
    def rule(name: str, prio: int, reads: str | None = None, enabled: bool = True) -> str:
        cond = (
            f"    conditions: [{{field: previous_rule.{reads}.score, operator: less_than, value: 1}}]\n"
            if reads
            else ""
        )
        return (
            f"  - name: {name}\n    evaluator: safety_check\n    priority: {prio}\n    enabled: {str(enabled).lower()}\n"  # noqa: E501
            + cond
        )

    msgs = issues_of(HEAD + EVAL + "rules:\n" + rule("a", 10, "ghost") + rule("b", 10, "c") + rule("c", 5))
    assert any("unknown rule 'ghost'" in m for m in msgs)
    assert any("rule 'c' (priority 5) cannot run before this rule (priority 10)" in m for m in msgs)
    msgs = issues_of(HEAD + EVAL + "rules:\n" + rule("a", 10, "b") + rule("b", 10, "a"))
    assert any("previous_rule cycle" in m for m in msgs)
    msgs = issues_of(HEAD + EVAL + "rules:\n" + rule("a", 10, "b") + rule("b", 20, None, enabled=False))
    assert any("reads disabled rule 'b'" in m for m in msgs)
    msgs = issues_of(HEAD + EVAL + "rules:\n" + rule("a", 10, "a"))
    assert any("cannot read its own result" in m for m in msgs)


def test_custom_code_must_define_evaluate() -> None:
    text = HEAD + "evaluators:\n  - name: e\n    type: custom\n    config:\n      code: 'def run(x): pass'\n"
    msgs = issues_of(text + "rules:\n  - name: r\n    evaluator: e\n")
    assert any("evaluate" in m and "evaluators[0].config.code" in m for m in msgs)
    msgs = issues_of(
        HEAD + "evaluators:\n  - name: e\n    type: custom\n    config:\n      code: 'def evaluate(:'\n"
        "rules:\n  - name: r\n    evaluator: e\n"
    )
    assert any("evaluators[0].config.code" in m for m in msgs)


@pytest.mark.parametrize("dep", ["git+https://x/y.git", "-e .", "pkg; rm -rf /", "../local", "--index-url x", "a\nb"])
def test_hostile_dependencies_rejected(dep: str) -> None:
    text = HEAD + f"evaluators:\n  - name: e\n    type: custom\n    config:\n      dependencies: [{json.dumps(dep)}]\n"
    text += "      code: |\n        def evaluate(prompt, response, context):\n            return {'score': 1}\n"
    msgs = issues_of(text + "rules:\n  - name: r\n    evaluator: e\n")
    assert any("dependencies" in m for m in msgs)


def test_unset_env_is_a_warning_naming_the_variable_never_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        HEAD
        + "evaluators:\n  - name: e\n    type: llm\n    config: {provider: openai, model: m, api_key: '${CA_TEST_KEY}'}\n"  # noqa: E501
    )
    text += "rules:\n  - name: r\n    evaluator: e\n"
    policy = load_policy(text, env={})
    assert policy.warnings == ["environment variable CA_TEST_KEY is not set (needed at evaluation time)"]
    policy = load_policy(text, env={"CA_TEST_KEY": "sk-secret-value"})
    assert policy.warnings == [] and "sk-secret-value" not in repr(policy.model_dump())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: &x [1]\nb: *x\n", "anchors and aliases are not allowed"),
        ("a: !!python/object/apply:os.system ['true']\n", "is not allowed"),
        ("name: a\nname: b\n", "duplicate key 'name'"),
        ("name: [unclosed\n", "YAML syntax: the '[' opened here is never closed (add ']')"),
        ("", "empty"),
        ("- just\n- a list\n", "must be a YAML mapping"),
        ("<<: {a: 1}\n", "merge keys are not allowed"),
    ],
)
def test_hostile_or_malformed_yaml(text: str, expected: str) -> None:
    msgs = issues_of(text)
    assert any(expected in m for m in msgs), msgs


def test_billion_laughs_fails_fast() -> None:
    lol = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, 10):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lol += f"{cur}: &{cur} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
    tracemalloc.start()
    try:
        msgs = issues_of(lol)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert any("anchors and aliases" in m for m in msgs)
    assert peak < 64 * 1024 * 1024  # refused before expanding: expansion would take GBs (and minutes)


def test_depth_node_and_size_caps() -> None:
    deep = "a: " + "[" * 100 + "]" * 100 + "\n"
    assert any("too deep" in m for m in issues_of(deep))
    many = "a: [" + ",".join(["1"] * 200) + "]\n"
    assert any("too many YAML nodes" in m for m in issues_of(many, limits=PolicyLimits(max_nodes=100)))
    big = "a: '" + "x" * 2000 + "'\n"
    assert any("larger than" in m for m in issues_of(big, limits=PolicyLimits(max_file_bytes=1000)))


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyValidationError, match="file not found"):
        load_policy_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(PolicyValidationError, match="not UTF-8"):
        load_policy_file(bad)


def test_committed_schema_is_fresh() -> None:
    committed = (ROOT / "policies" / "policy.schema.json").read_text()
    assert committed == policy_json_schema_text(), "run `make schema` to refresh policies/policy.schema.json"
    schema = json.loads(committed)
    assert "anyOf" in schema["$defs"]["EvaluatorSpec"]["properties"]["config"]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_cli_validate_exit_codes_and_no_traceback(tmp_path: Path) -> None:
    ok = run_cli("policy", "validate", "policies/demo_offline.yaml")
    assert ok.returncode == 0 and "✓" in ok.stdout
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text("a: &a [1]\nb: *a\n" + "c: " + "[" * 500 + "\n")
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(bytes(range(256)))
    res = run_cli(
        "policy", "validate", str(hostile), str(garbage), str(tmp_path / "nope.yaml"), "policies/demo_offline.yaml"
    )
    assert res.returncode == 1
    assert "Traceback" not in res.stdout + res.stderr
    assert res.stdout.count("✗") == 3 and res.stdout.count("✓") == 1
    usage = run_cli("policy", "frobnicate")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_cli_schema_matches_committed() -> None:
    res = run_cli("policy", "schema")
    assert res.returncode == 0
    assert res.stdout == (ROOT / "policies" / "policy.schema.json").read_text()


def test_every_problem_of_one_rule_is_reported_at_once() -> None:
    """A bad regex, a bad CIDR and an unknown operator in one rule: three issues, not just the operator."""
    text = textwrap.dedent(
        """\
        name: p
        description: d
        version: "1"
        evaluators:
          - {name: e, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
        rules:
          - name: r
            evaluator: e
            conditions:
              - {field: a, operator: regex_match, value: "(a"}
              - {field: request.ip, operator: in, value: ["10.0.0.0/33"]}
              - {field: b, operator: equal, value: 1}
        """
    )
    with pytest.raises(PolicyValidationError) as info:
        load_policy(text, "p.yaml")
    paths = sorted(i.path for i in info.value.issues)
    assert paths == [
        "rules[0].conditions[0].value",
        "rules[0].conditions[1].value[0]",
        "rules[0].conditions[2].operator",
    ], [str(i) for i in info.value.issues]


@pytest.mark.parametrize("field", ["max_review_time", "auto_approve_after"])
def test_absurd_durations_are_validation_errors_not_date_overflows(field: str) -> None:
    """A review time of ~2.7e11 years passed validation and overflowed the date at decision time (INTERNAL)."""
    text = textwrap.dedent(
        f"""\
        name: p
        description: d
        version: "1"
        evaluators:
          - {{name: e, type: custom, config: {{code: "def evaluate(p, r, c): pass"}}}}
        rules:
          - {{name: r, evaluator: e, action: require_review, action_config: {{{field}: "99999999999999d"}}}}
        """
    )
    with pytest.raises(PolicyValidationError, match="longer than the maximum of 3650d"):
        load_policy(text, "p.yaml")


def test_policy_names_are_nfc_and_hold_nothing_invisible() -> None:
    """Two spellings of one name are one name (stored in NFC); a bidi control, a zero-width or
    no-break space is a located error naming the character (crossaudit.kernel.names)."""
    body = 'description: "d"\nversion: "1.0"\n' + EVAL + "rules:\n  - {name: r, evaluator: safety_check}\n"
    nfd = load_policy('name: "Cafe\\u0301"\n' + body, "p.yaml")
    assert nfd.name == "Caf\u00e9" == load_policy('name: "Caf\\u00e9"\n' + body, "p.yaml").name
    for escaped, char in [
        ("pay\\u202eroll", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("\\u2066a\\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("a\\u200fb", "U+200F RIGHT-TO-LEFT MARK"),
        ("a\\u2060b", "U+2060 WORD JOINER"),
        ("a\\u00adb", "U+00AD SOFT HYPHEN"),
        ("a\\u2007b", "U+2007 FIGURE SPACE"),
    ]:
        [msg] = issues_of(f'name: "{escaped}"\n' + body)
        assert msg.startswith("p.yaml:1:7: name: character ") and char in msg, msg
    [msg] = issues_of('name: " padded"\n' + body)
    assert "whitespace" in msg
