"""Which rules reach no verdict here or offline, and which request context rules need
(orchestrator/readiness.py, behind ``crossaudit policy validate``): the LLM
evaluators' own settings and the builtins' own model resolution, on temporary places."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from crossaudit.modelserver.store import ModelStore
from orchestrator.policy import load_policy
from orchestrator.readiness import readiness, unready_evaluators

CUSTOM = '{type: custom, config: {code: "def evaluate(p, r, c): return {\'score\': 1.0}"}}'


def policy(evaluators: str, rules: str):
    text = f"""\
name: p
description: d
version: "1"
evaluators:
{textwrap.indent(textwrap.dedent(evaluators), "  ")}
rules:
{textwrap.indent(textwrap.dedent(rules), "  ")}
"""
    return load_policy(text, "p.yaml")


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    """No key, no model anywhere: an empty store and caches; downloads (if on) would go nowhere."""
    return {
        "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "HF_HOME": str(tmp_path / "hf"),
        "CROSSAUDIT_SPACY_PACKAGE": "xx_crossaudit_test_sm",
    }


LLM = "- {name: judge, type: llm, config: {provider: openai, model: gpt-4o-mini}}\n"


def test_an_llm_without_a_key_leaves_its_rule_without_a_verdict(places) -> None:
    p = policy(LLM, "- {name: gate, evaluator: judge, action: block}\n")
    (warning,) = readiness(p, places).warnings
    assert warning == (
        "no verdict here: rule 'gate' (fails closed: block): evaluators[0] (judge): llm evaluator 'judge': "
        "no API key for openai: set config.api_key or OPENAI_API_KEY"
    )
    assert readiness(p, {**places, "OPENAI_API_KEY": "sk-test"}).warnings == []


def test_llm_keys_and_endpoints_are_judged_as_a_call_judges_them(places) -> None:
    named = policy(
        "- {name: judge, type: llm, config: {provider: anthropic, model: m, api_key: '${MY_KEY}'}}\n",
        "- {name: gate, evaluator: judge, action: warn}\n",
    )
    (warning,) = readiness(named, places).warnings
    assert "rule 'gate' (fails closed: warn)" in warning and "MY_KEY" in warning
    assert readiness(named, {**places, "MY_KEY": "k"}).warnings == []
    local = policy(  # an OpenAI-compatible server (vLLM, Ollama) needs no key
        "- {name: judge, type: llm, config: {provider: openai_compatible, model: m, base_url: 'http://127.0.0.1:8000/v1'}}\n",
        "- {name: gate, evaluator: judge}\n",
    )
    assert readiness(local, places).warnings == []
    azure = policy(
        "- {name: judge, type: llm, config: {provider: azure, model: deployment}}\n",
        "- {name: gate, evaluator: judge}\n",
    )
    (warning,) = readiness(azure, {**places, "AZURE_OPENAI_API_KEY": "k"}).warnings
    assert "AZURE_OPENAI_ENDPOINT" in warning


def test_a_builtin_whose_model_is_not_here_names_the_fix_without_the_places(places) -> None:
    p = policy(
        "- {name: tox, type: builtin, config: {model: detoxify}}\n",
        "- {name: toxic, evaluator: tox, action: modify}\n",
    )
    (offline,) = readiness(p, places).warnings  # offline mode off: a call would download it
    first, *rest = offline.splitlines()
    assert first == (
        "no verdict offline: rule 'toxic' (fails closed: block): evaluators[0] (tox): detoxify checkpoint "
        "(variant original): not found. A call downloads it unless offline mode is on (CROSSAUDIT_OFFLINE=1)."
    )
    assert rest[0] == "To fix it:" and any("crossaudit models import detoxify PATH" in line for line in rest)
    assert "Tried, in order" not in offline  # the check did not try a download: no "skipped" step
    (here,) = readiness(p, {**places, "CROSSAUDIT_OFFLINE": "1"}).warnings
    assert here.startswith("no verdict here: rule 'toxic'") and "A call downloads" not in here


def test_a_builtin_served_from_here_is_ready(places, tmp_path: Path) -> None:
    src = tmp_path / "imported"
    (src / "hf").mkdir(parents=True)
    (src / "mine.ckpt").write_bytes(b"a checkpoint")
    (src / "hf" / "config.json").write_text("{}")
    p = policy(
        """\
        - {name: tox, type: builtin, config: {model: detoxify}}
        - {name: lang, type: builtin, config: {model: langdetect}}
        - {name: pii, type: builtin, config: {model: presidio, entities: [EMAIL, SSN]}}
        """,
        """\
        - {name: toxic, evaluator: tox}
        - {name: language, evaluator: lang}
        - {name: patterns, evaluator: pii}
        """,
    )
    assert set(unready_evaluators(p, places)) == {"tox"}  # langdetect and pattern entities need nothing
    ModelStore(places["CROSSAUDIT_MODEL_STORE"]).import_path("detoxify", src, "original")
    assert readiness(p, places).warnings == []


def test_ner_entities_are_located_at_the_field_that_asks_for_them(places) -> None:
    p = policy(
        "- {name: pii, type: builtin, config: {model: presidio, entities: [PERSON, EMAIL]}}\n",
        "- {name: names, evaluator: pii, action: flag}\n",
    )
    (warning,) = readiness(p, {**places, "HF_HUB_OFFLINE": "1"}).warnings
    assert warning.startswith(
        "no verdict here: rule 'names' (fails closed: flag): evaluators[0].config.entities (pii): presidio: "
        "entity PERSON needs a spaCy pipeline"
    )


def test_fallbacks_consensus_and_fail_open_are_told_apart(places) -> None:
    p = policy(
        f"""\
        {LLM}
        - {{name: backup, {CUSTOM[1:]}
        """,
        """\
        - {name: rescued, evaluator: judge, fallback: {evaluator: backup}}
        - {name: vote, evaluators: [{name: judge}, {name: backup}], consensus_strategy: majority, action: flag}
        - {name: open, evaluator: judge, fallback: {on_error: allow}}
        - {name: warned, evaluator: judge, action: block, fallback: {on_error: warn}}
        - {name: off, evaluator: judge, enabled: false}
        """,
    )
    (warning,) = readiness(p, places).warnings  # one per evaluator, naming every rule it touches
    assert warning.startswith(
        "no verdict here: rule 'open' (allowed by fallback.on_error); rule 'warned' (fallback.on_error=warn: warn); "
        "rule 'vote' decides without its vote (a fail vote): evaluators[0] (judge): "
    )
    assert "rescued" not in warning and "'off'" not in warning


def test_context_fields_a_request_must_carry_are_notes(places) -> None:
    p = policy(
        f"- {{name: e, {CUSTOM[1:]}\n",
        """\
        - {name: admins, evaluator: e, conditions: [{field: user.role, operator: in, value: [admin, owner]},
                                                    {field: time.hour, operator: greater_than, value: 8}]}
        - {name: chained, evaluator: e, priority: -1,
           conditions: [{field: previous_rule.admins.score, operator: less_than, value: 0.5}]}
        - {name: not_bots, evaluator: e, conditions: [{field: request.agent, operator: not_equals, value: bot}]}
        """,
    )
    ready = readiness(p, places)
    assert ready.warnings == []
    assert ready.notes == [
        "rule 'admins' applies only when the request's context carries user.role "
        """(e.g. --context '{"user": {"role": "admin"}}'); otherwise it is skipped""",
        "rule 'not_bots' reads request.agent from the request's context "
        "(absent, a not_equals/not_in/not_contains condition holds)",
    ]
    only = policy(
        f"- {{name: e, {CUSTOM[1:]}\n",
        """\
        - {name: a, evaluator: e, conditions: [{field: demo.action, operator: equals, value: block}]}
        - {name: b, evaluator: e, conditions: [{field: demo.action, operator: equals, value: warn}]}
        """,
    )
    (note,) = readiness(only, places).notes
    assert note == (
        "rules 'a', 'b' apply only when the request's context carries demo.action "
        """(e.g. --context '{"demo": {"action": "block"}}'); otherwise they are skipped """
        "(every rule of the policy: such a request is allowed with no rule applied)"
    )
