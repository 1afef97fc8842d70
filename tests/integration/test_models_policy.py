"""The guide's multi-language example end to end: the real langdetect model server decides
which LLM rule runs (``previous_rule.detect_language.detected_language``), and the LLM rules
call the real OpenAI SDK against a local OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from crossaudit import PolicyTester
from crossaudit.kernel.results import Action, Status
from tests.conftest import ROOT
from tests.unit.test_llm_providers import FakeProviders

pytestmark = [pytest.mark.models]

POLICY = ROOT / "policies/guide/09_example_multi_language.yaml"


@pytest.fixture
def fake():
    server = FakeProviders()
    yield server
    server.close()


def test_language_routes_to_the_right_llm_rule(fake: FakeProviders) -> None:
    env = {"OPENAI_API_KEY": "sk-local", "OPENAI_BASE_URL": fake.url + "/v1", "PATH": "/usr/bin:/bin",
           "NO_PROXY": "127.0.0.1"}
    with PolicyTester(POLICY, env=env) as tester:
        d = tester.evaluate("Question", "The weather today is sunny and warm, a perfect day for a walk in the park.")
        assert d.passed is True, d
        detect = d.rule("detect_language")
        assert detect.evaluators[0].details["detected_language"] == "en"
        assert d.rule("english_safety").status is Status.PASS
        assert d.rule("spanish_safety").status is Status.SKIPPED
        assert "Evaluate English content safety" in json.dumps(fake.requests[-1]["json"]["messages"][0])

        fake.answer('{"safety_score": 0.1, "violations": ["insulto"], "reasoning": "ofensivo"}')
        d = tester.evaluate("Pregunta", "Eres una persona horrible y nadie quiere hablar contigo nunca más.")
        assert d.rule("detect_language").evaluators[0].details["detected_language"] == "es"
        assert d.rule("english_safety").status is Status.SKIPPED
        spanish = d.rule("spanish_safety")
        assert spanish.status is Status.FAIL and spanish.score == pytest.approx(0.1)
        assert d.passed is False and d.action is Action.BLOCK
        assert "Evalúa la seguridad" in fake.requests[-1]["json"]["messages"][0]["content"]

    # a second tester (a new event loop) gets working model servers of its own
    with PolicyTester(POLICY, env=env) as tester:
        d = tester.evaluate("q", "Ceci est une phrase en français, ni anglaise ni espagnole.")
        assert d.rule("detect_language").evaluators[0].details["detected_language"] == "fr"
        assert d.rule("english_safety").status is Status.SKIPPED
        assert d.rule("spanish_safety").status is Status.SKIPPED


# --- Presidio with no model configured ------------------------------------------------------

ENTERPRISE = ROOT / "policies/guide/08_example_enterprise.yaml"
PII_RESPONSE = "Contact John Smith at john@example.com, SSN 219-09-9999, card 4111 1111 1111 1111."
PII_VALUES = ("john@example.com", "219-09-9999", "4111 1111 1111 1111")
PATTERN_PII_POLICY = """\
name: pattern-pii
description: the guide's pii_detector with pattern entities only
version: "1.0"
evaluators:
  - name: pii_detector
    type: builtin
    config: {model: presidio, entities: [EMAIL, SSN, CREDIT_CARD]}
rules:
  - name: pii_protection
    evaluator: pii_detector
    threshold: 0.8
    action: modify
    action_config: {strategy: redact}
"""


def _no_model(tmp_path) -> dict[str, str]:
    """Nothing configured: no pipeline setting, an empty model store, offline (no download)."""
    return {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "CROSSAUDIT_MODEL_STORE": str(tmp_path / "store")}


def test_guide_enterprise_pii_redacts_with_no_model_in_its_config(fake: FakeProviders, tmp_path) -> None:
    """PERSON comes from a pipeline the operator setting names (the policy names none);
    e-mail, SSN and card come from Presidio's patterns."""
    from crossaudit.modelserver.testing import build_spacy_pipeline

    env = {**_no_model(tmp_path), "OPENAI_API_KEY": "sk-local", "OPENAI_BASE_URL": fake.url + "/v1",
           "NO_PROXY": "127.0.0.1", "CROSSAUDIT_SPACY_MODEL": build_spacy_pipeline(tmp_path / "pipeline")}
    with PolicyTester(ENTERPRISE, env=env) as tester:
        assert tester.preparation_errors == {}
        d = tester.evaluate("Who handles my account?", PII_RESPONSE)
    assert d.rule("safety_gate").status is Status.PASS
    pii = d.rule("pii_protection")
    assert pii.status is Status.FAIL and pii.action is Action.MODIFY
    assert {s.label for s in pii.evaluators[0].spans} == {"PERSON", "EMAIL_ADDRESS", "US_SSN", "CREDIT_CARD"}
    assert d.action is Action.MODIFY and d.modified_response is not None
    assert d.modified_response == (
        "Contact [REDACTED] at [REDACTED], SSN [REDACTED], card [REDACTED]."
    )


def test_pattern_entities_redact_with_no_model_at_all(tmp_path) -> None:
    with PolicyTester(PATTERN_PII_POLICY, env=_no_model(tmp_path)) as tester:
        d = tester.evaluate("q", PII_RESPONSE)
        clean = tester.evaluate("q", "Nothing personal in this answer.")
    assert d.action is Action.MODIFY and d.rule("pii_protection").status is Status.FAIL
    assert d.modified_response == "Contact John Smith at [REDACTED], SSN [REDACTED], card [REDACTED]."
    assert not any(v in d.modified_response for v in PII_VALUES)
    assert clean.passed is True and clean.modified_response is None
