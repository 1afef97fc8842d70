"""``policy diff``: two versions of a policy compared as the DSL reads them, in words."""

from __future__ import annotations

import pytest

from orchestrator.policy import load_policy
from orchestrator.policy.diff import MAX_SHOWN_CHARS, diff_policies, show

OLD = """
name: safety
description: blocks unsafe answers
version: "1.0"
evaluators:
  - name: judge
    type: llm
    config: {provider: openai, model: gpt-4, api_key: "${OPENAI_API_KEY}", system_prompt: "Rate safety"}
  - name: words
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 1.0}
rules:
  - name: unsafe
    evaluator: judge
    threshold: 0.7
    action: warn
  - name: profanity
    evaluator: words
    threshold: 0.5
    action: block
"""


def policy(text: str):
    return load_policy(text, env={})


def texts(old: str, new: str) -> list[str]:
    return [c.describe() for c in diff_policies(policy(old), policy(new))]


def test_the_same_policy_written_differently_is_no_change() -> None:
    reformatted = OLD.replace(
        "threshold: 0.5\n    action: block", "action: block\n    threshold: 0.50\n    enabled: true"
    )
    assert reformatted != OLD
    assert diff_policies(policy(OLD), policy(reformatted)) == []


def test_threshold_action_and_version_changes_in_words() -> None:
    new = OLD.replace('version: "1.0"', 'version: "1.1"').replace(
        "threshold: 0.7\n    action: warn", "threshold: 0.6\n    action: block"
    )
    assert texts(OLD, new) == [
        'policy: version "1.0" -> "1.1"',
        "rule 'unsafe': threshold 0.7 -> 0.6 (lower: fewer responses fail)",
        'rule \'unsafe\': action "warn" -> "block"',
    ]
    up = OLD.replace("threshold: 0.5", "threshold: 0.9")
    assert texts(OLD, up) == ["rule 'profanity': threshold 0.5 -> 0.9 (higher: more responses fail)"]


def test_added_removed_and_reordered_rules() -> None:
    new = (
        OLD.replace("  - name: unsafe\n    evaluator: judge\n    threshold: 0.7\n    action: warn\n", "")
        + "  - name: strict\n    evaluator: judge\n    threshold: 0.9\n    action: block\n"
    )
    assert texts(OLD, new) == [
        'rule \'strict\' added: evaluator "judge", threshold 0.9, action "block"',
        "rule 'unsafe' removed",
    ]
    swapped = (
        OLD.replace("  - name: unsafe\n    evaluator: judge\n    threshold: 0.7\n    action: warn\n", "")
        + "  - name: unsafe\n    evaluator: judge\n    threshold: 0.7\n    action: warn\n"
    )
    assert texts(OLD, swapped) == ["rules: order unsafe, profanity -> profanity, unsafe"]


def test_nested_config_keys_and_code_by_digest() -> None:
    new = OLD.replace("model: gpt-4,", "model: gpt-4o,").replace('return {"score": 1.0}', 'return {"score": 0.9}')
    out = texts(OLD, new)
    assert out[0] == 'evaluator \'judge\': config.model "gpt-4" -> "gpt-4o"'
    assert out[1].startswith("evaluator 'words': config.code <") and "sha256" in out[1] and "score" not in out[1]
    assert len(out) == 2


def test_secrets_are_compared_as_written_never_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-must-not-show")
    monkeypatch.setenv("OTHER_KEY", "sk-other-must-not-show")
    new = OLD.replace("${OPENAI_API_KEY}", "${OTHER_KEY}")
    changes = diff_policies(load_policy(OLD), load_policy(new))
    shown = " ".join(c.describe() for c in changes) + repr([c.to_json() for c in changes])
    assert "must-not-show" not in shown
    assert [c.describe() for c in changes] == [
        'evaluator \'judge\': config.api_key "${OPENAI_API_KEY}" -> "${OTHER_KEY}"'
    ]


def test_long_values_are_shown_by_size_and_digest() -> None:
    assert show("x" * MAX_SHOWN_CHARS) == '"' + "x" * MAX_SHOWN_CHARS + '"'
    long = show("x" * (MAX_SHOWN_CHARS + 1))
    assert long.startswith(f"<{MAX_SHOWN_CHARS + 1} chars, 1 line, sha256 ") and "xxx" not in long


def test_hostile_keys_reach_no_terminal_raw() -> None:
    """Keys the author chose (a test case's context) are quoted when they are not plain names:
    an escape sequence in one never reaches a terminal raw."""
    case = '\ntest_cases:\n  - name: c\n    input: {response: "x", context: {%s: 1}}\n    expected_result: pass\n'
    old, new = OLD + case % "plain_key", OLD + case % '"\\e[31mred"'
    texts_ = [c.describe() for c in diff_policies(policy(old), policy(new))]
    assert len(texts_) == 2 and all("\x1b" not in t for t in texts_), texts_
    assert any('input.context."\\u001b[31mred"' in t for t in texts_), texts_


def test_a_validation_issue_never_carries_a_raw_escape_sequence_in_its_path() -> None:
    """The same rule for validation: ``policy validate`` printed an unknown key's path raw, so a
    policy could write escape sequences into the terminal of whoever validated it."""
    from crossaudit.kernel.errors import PolicyValidationError

    hostile = OLD.replace('system_prompt: "Rate safety"', 'system_prompt: "Rate safety", "\\e[31mred": 1')
    with pytest.raises(PolicyValidationError) as err:
        policy(hostile)
    (issue,) = err.value.issues
    assert issue.path == 'evaluators[0].config."\\u001b[31mred"'
    assert "\x1b" not in str(issue)


def test_no_control_bidi_or_separator_character_is_shown_raw() -> None:
    """JSON leaves DEL, C1 controls (an 8-bit CSI/OSC), bidi overrides and U+2028 raw: a policy's
    description or metadata could rewrite a reviewer's terminal, or make the diff read as
    something it is not."""
    hostile = "x\u202eevil\x7f\x9d0;pwned\x9c\x9b1;31m\u2028y"
    new = OLD.replace(
        "description: blocks unsafe answers", f'description: "{hostile.encode("unicode_escape").decode()}"'
    )
    (change,) = diff_policies(policy(OLD), policy(new))
    text = change.describe()
    assert all(ch.isprintable() for ch in text), ascii(text)
    assert "\\u202e" in text and "\\u009b" in text
