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
