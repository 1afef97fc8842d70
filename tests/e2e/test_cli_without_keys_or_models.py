"""Issue 19, the guide's examples on a machine with no LLM key and no model, through the real CLI:
``policy validate`` says which rules reach no verdict offline and which request context rules need;
``evaluate`` and ``policy test`` on example 03 show every rule's own verdict, the errored ones as
errored, and each error once. Model downloads point at a loopback port where nothing listens, so a
call's download fails at once and nothing leaves the machine."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.e2e

GUIDE = "policies/guide"
KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "GOOGLE_API_KEY", "GEMINI_API_KEY")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def no_keys_no_models(tmp_path: Path) -> dict[str, str | None]:
    """No provider key; an empty model store and caches; every model source on a closed port."""
    nowhere = f"http://127.0.0.1:{closed_port()}/"
    return {
        **dict.fromkeys(KEYS),
        "HF_HUB_OFFLINE": None,
        "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "HF_HOME": str(tmp_path / "hf"),
        "CROSSAUDIT_DETOXIFY_URL": nowhere,
        "CROSSAUDIT_HF_ENDPOINT": nowhere.rstrip("/"),
        "CROSSAUDIT_SPACY_MODELS_URL": nowhere,
        "CROSSAUDIT_SPACY_MODEL_VERSION": "3.8.0",
    }


def test_validate_names_the_rules_that_reach_no_verdict_and_the_context_rules_need(no_keys_no_models) -> None:
    files = [f"{GUIDE}/{n}" for n in (
        "03_evaluator_types.yaml", "05_actions.yaml", "07_example_basic_content_safety.yaml",
        "08_example_enterprise.yaml", "09_example_multi_language.yaml",
    )]  # fmt: skip
    res = run_cli("policy", "validate", *files, env=no_keys_no_models)
    assert res.returncode == 0, res.stdout + res.stderr  # valid policies: warnings do not fail
    warnings = [line for line in res.stdout.splitlines() if line.startswith("  warning: no verdict")]
    for rule, why in (
        ("llm_safety", "no API key for openai: set config.api_key or OPENAI_API_KEY"),
        ("content_safety_check", "OPENAI_API_KEY"),
        ("toxicity", "detoxify checkpoint (variant original): not found. A call downloads it"),
        ("pii", "entity PERSON needs a spaCy pipeline"),
        ("block_unsafe_content", "OPENAI_API_KEY"),
        ("safety_gate", "OPENAI_API_KEY"),
        ("pii_protection", "entity PERSON needs a spaCy pipeline"),
        ("english_safety", "OPENAI_API_KEY"),
        ("spanish_safety", "OPENAI_API_KEY"),
    ):
        assert any(f"rule {rule!r} (fails closed: " in w and why in w for w in warnings), (rule, res.stdout)
    assert "      - `crossaudit models pull detoxify --variant original`" in res.stdout  # the fix, under its warning
    notes = [line for line in res.stdout.splitlines() if line.startswith("  note: ")]
    assert any("'webhook_rule' apply only when the request's context carries demo.action" in n for n in notes)
    assert any("rule 'compliance_review' applies only when the request's context carries content.category" in n
               for n in notes)  # fmt: skip
    assert not any("detect_language" in n or "previous_rule" in n for n in notes)  # chaining is not context

    strict = run_cli("policy", "validate", "--strict", f"{GUIDE}/07_example_basic_content_safety.yaml",
                     env=no_keys_no_models)  # fmt: skip
    assert strict.returncode == 1 and "✗" in strict.stdout
    keyed = run_cli("policy", "validate", "--strict", f"{GUIDE}/07_example_basic_content_safety.yaml",
                    env={**no_keys_no_models, "OPENAI_API_KEY": "sk-test"})  # fmt: skip
    assert keyed.returncode == 0 and "warning" not in keyed.stdout

    report = json.loads(run_cli("policy", "validate", "--json", *files, env=no_keys_no_models).stdout)
    by_file = {Path(r["file"]).name: r for r in report}
    assert all(r["valid"] for r in report)
    assert any("rule 'block_unsafe_content'" in w for w in by_file["07_example_basic_content_safety.yaml"]["warnings"])
    assert by_file["05_actions.yaml"]["notes"] and by_file["07_example_basic_content_safety.yaml"]["notes"] == []


def test_evaluate_example_03_shows_every_rule_and_each_error_once(no_keys_no_models) -> None:
    res = run_cli(
        "evaluate", f"{GUIDE}/03_evaluator_types.yaml", "--prompt", "hi", "--response", "hello",
        env=no_keys_no_models,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr  # fail-closed: the LLM gate blocks
    rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines() if line.startswith("│ ") and
            line.split("│")[1].strip()}  # fmt: skip
    assert set(rows) == {"llm_safety", "profanity", "toxicity", "pii", "content_safety_check"}, res.stdout
    assert "skipped" not in res.stdout and "stopped processing" not in res.stdout
    assert " pass " in rows["profanity"] and "1.0" in rows["profanity"]  # the custom rule's own verdict
    for rule in ("llm_safety", "toxicity", "pii", "content_safety_check"):
        assert " error " in rows[rule], rows[rule]
    assert "NOT PASSED  action: block" in res.stdout
    assert "errored rules: llm_safety, toxicity, pii, content_safety_check" in res.stdout
    # the long model messages: cut in the table, whole once below it
    table, _, below = res.stdout.partition("NOT PASSED")
    assert "Tried, in order" not in table and "To fix it" not in table
    assert below.count("detoxify checkpoint (variant original): not found.") == 1
    assert below.count("To fix it:") == 2 and below.count("Tried, in order:") == 2  # detoxify, spaCy
    assert "crossaudit models import detoxify PATH --variant original" in below


def test_policy_test_on_example_03_reports_the_errored_rules_and_the_others(no_keys_no_models, tmp_path) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{"name": "hello", "input": {"prompt": "hi", "response": "hello"},
                                  "expected_result": "pass"}] * 2))  # fmt: skip
    res = run_cli(
        "policy", "test", f"{GUIDE}/03_evaluator_types.yaml", "--input", str(cases), env=no_keys_no_models
    )
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    errors = [line for line in lines if line.startswith("  ERROR hello: expected pass, got error/block")]
    assert len(errors) == 2 and all("Tried" not in line for line in errors)
    assert sum(" profanity " in line and " pass " in line for line in lines) == 2  # each case's table
    assert res.stdout.count("To fix it:") == 2  # detoxify's and spaCy's, once for both cases
    args = ("policy", "test", f"{GUIDE}/03_evaluator_types.yaml", "--input", str(cases), "--json")
    report = json.loads(run_cli(*args, env=no_keys_no_models).stdout)
    rules = {r["rule"]: r for r in report["suites"][0]["cases"][0]["rules"]}
    assert rules["profanity"]["status"] == "pass" and rules["profanity"]["score"] == 1.0
    assert rules["toxicity"]["status"] == "error" and rules["toxicity"]["reason"] == "no verdict (fail-closed)"
    assert "Tried, in order:" in rules["toxicity"]["errors"][0]  # JSON keeps the whole message
