"""Presidio with no spaCy pipeline: the pattern entities on a blank pipeline (the real Presidio
runtime, in-process), and a NER entity refused at validate time by the runtime's own resolution."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crossaudit import PolicyTester
from crossaudit.kernel.builtins import PresidioConfig
from crossaudit.kernel.errors import ConfigurationError, PolicyValidationError
from crossaudit.modelserver.builtins import ModelRequiredError, model_problem, resolve_paths
from crossaudit.modelserver.builtins.presidio import _NER_IGNORED, _NER_MAPPING, NER_ONLY_ENTITIES, PresidioRuntime
from crossaudit.modelserver.pool import InProcessModels
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.builtin import PresidioEvaluator
from orchestrator.policy import load_policy
from orchestrator.policy.models import model_check
from tests.conftest import ROOT

PII_TEXT = "Mail john@example.com, phone number 212-555-1234; my ssn is 219-09-9999; card 4111 1111 1111 1111."

@pytest.fixture
def no_model(tmp_path) -> dict[str, str]:
    """Nothing configured: no pipeline setting, an empty model store, and offline (no download)."""
    return {"HF_HUB_OFFLINE": "1", "CROSSAUDIT_MODEL_STORE": str(tmp_path / "empty-store")}


PII_POLICY = """\
name: pii
description: redact PII
version: "1.0"
evaluators:
  - name: pii_detector
    type: builtin
    config:
      model: presidio
      entities: {entities}
rules:
  - name: pii_protection
    evaluator: pii_detector
    threshold: 0.8
    action: modify
    action_config:
      strategy: redact
"""


def test_pattern_entities_resolve_to_the_blank_pipeline_and_ner_ones_are_refused(no_model: dict[str, str]) -> None:
    cfg = PresidioConfig(model="presidio", entities=["EMAIL", "SSN", "CREDIT_CARD", "IBAN_CODE", "DATE_TIME"])
    assert resolve_paths(cfg, no_model).spacy_model_path is None
    assert model_problem(cfg, no_model) is None

    enterprise = PresidioConfig(model="presidio", entities=["PERSON", "EMAIL", "SSN", "CREDIT_CARD"])
    with pytest.raises(ModelRequiredError) as info:
        resolve_paths(enterprise, no_model)
    err = info.value
    assert isinstance(err, ConfigurationError) and err.field == "entities"
    assert "entity PERSON needs a spaCy pipeline with a named-entity recognizer" in err.message
    for fix in ("spacy_model_path", "CROSSAUDIT_SPACY_MODEL", "crossaudit models import", "crossaudit models pull"):
        assert fix in err.message
    assert "EMAIL_ADDRESS, US_SSN, CREDIT_CARD need no model" in err.message
    assert "reachable" not in err.message  # nothing was tried over a network
    problem = model_problem(PresidioConfig(model="presidio", entities=["LOCATION", "NRP"]), no_model)
    assert problem is not None and "entities LOCATION, NRP need" in problem.message

    # a pipeline from the operator setting, named nowhere in the config, makes PERSON available
    with_env = resolve_paths(enterprise, {"CROSSAUDIT_SPACY_MODEL": "/models/spacy"})
    assert with_env.spacy_model_path == "/models/spacy"
    assert model_problem(enterprise, {"CROSSAUDIT_SPACY_MODEL": "/models/spacy"}) is None


@pytest.mark.parametrize("language", ["en", "es", "de", "it"])
def test_ner_only_entities_are_what_presidio_finds_only_by_ner(language: str) -> None:
    """Checked against Presidio's own registry: no pattern recognizer claims these, and every
    other entity the runtime's NER mapping yields (DATE_TIME) also has one."""
    import spacy
    from presidio_analyzer import RecognizerRegistry
    from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine

    engine = SpacyNlpEngine(
        models=[{"lang_code": language, "model_name": "blank"}],
        ner_model_configuration=NerModelConfiguration(
            model_to_presidio_entity_mapping=_NER_MAPPING, labels_to_ignore=list(_NER_IGNORED)
        ),
    )
    engine.nlp = {language: spacy.blank(language)}
    registry = RecognizerRegistry(supported_languages=[language])
    registry.load_predefined_recognizers(languages=[language], nlp_engine=engine)
    by_ner: set[str] = set()
    by_pattern: set[str] = set()
    for recognizer in registry.recognizers:
        (by_ner if type(recognizer).__name__ == "SpacyRecognizer" else by_pattern).update(recognizer.supported_entities)
    assert by_ner - by_pattern == NER_ONLY_ENTITIES == {"PERSON", "LOCATION", "NRP"}


async def test_blank_pipeline_finds_pattern_entities_with_context(no_model: dict[str, str]) -> None:
    models = InProcessModels()
    try:
        ev = PresidioEvaluator(
            "pii",
            {"model": "presidio", "entities": ["EMAIL", "PHONE", "SSN", "CREDIT_CARD"], "confidence_threshold": 0.3},
            backend=models,
            environ=no_model,
        )
        v = await ev.evaluate(EvaluationInput("", PII_TEXT), timeout=60)
        found = {s.label: (PII_TEXT[s.start : s.end], s.score) for s in v.spans}
        assert found["EMAIL_ADDRESS"] == ("john@example.com", 1.0)
        assert found["CREDIT_CARD"] == ("4111 1111 1111 1111", 1.0)
        # context words still count without a model: "ssn" and "phone" lift the pattern scores
        assert found["US_SSN"][0] == "219-09-9999" and found["US_SSN"][1] == pytest.approx(0.85)
        assert found["PHONE_NUMBER"][0] == "212-555-1234" and found["PHONE_NUMBER"][1] == pytest.approx(0.75)
        assert v.score == 0.0 and v.passed is False
        assert models.runtime("presidio").loaded() == ["en:blank"]

        plain = "My number: 219-09-9999."  # no context word: the pattern's own score
        v = await ev.evaluate(EvaluationInput("", plain), timeout=60)
        assert [(s.label, s.score) for s in v.spans] == [("US_SSN", pytest.approx(0.5))]

        # a direct call (resolution bypassed) still refuses a NER entity on the blank pipeline
        runtime = PresidioRuntime()
        with pytest.raises(ConfigurationError, match="entity PERSON needs"):
            runtime.analyze({"model": "presidio", "entities": ["PERSON", "EMAIL"]}, "", PII_TEXT)
        with pytest.raises(ConfigurationError, match="spaCy has no language 'zz'"):
            runtime.analyze({"model": "presidio", "entities": ["EMAIL"], "language": "zz"}, "", PII_TEXT)
    finally:
        await models.aclose()


def test_validation_locates_the_ner_entity_and_keeps_pattern_policies_valid(no_model: dict[str, str]) -> None:
    check = (model_check(no_model),)
    with pytest.raises(PolicyValidationError) as info:
        load_policy(PII_POLICY.format(entities='["PERSON", "EMAIL", "SSN", "CREDIT_CARD"]'), "p.yaml", checks=check)
    (issue,) = info.value.issues
    assert str(issue).startswith("p.yaml:9:17: evaluators[0].config.entities: presidio: entity PERSON needs")
    load_policy(PII_POLICY.format(entities='["EMAIL", "SSN", "CREDIT_CARD"]'), "p.yaml", checks=check)
    with_model = (model_check({"CROSSAUDIT_SPACY_MODEL": "/models/spacy"}),)
    load_policy(PII_POLICY.format(entities='["PERSON", "EMAIL"]'), "p.yaml", checks=with_model)
    load_policy(PII_POLICY.format(entities='["PERSON", "EMAIL"]'), "p.yaml")  # documents alone: no check


def test_policy_tester_refuses_the_guide_enterprise_policy_without_a_model(no_model: dict[str, str]) -> None:
    path = ROOT / "policies/guide/08_example_enterprise.yaml"
    with pytest.raises(PolicyValidationError) as info:
        PolicyTester(path, env=no_model)
    (issue,) = info.value.issues
    entities_line = next(n for n, line in enumerate(path.read_text().splitlines(), 1) if '"PERSON"' in line)
    assert issue.path == "evaluators[1].config.entities" and issue.line == entities_line
    assert "entity PERSON needs a spaCy pipeline" in issue.message and "crossaudit models import" in issue.message


def test_cli_validate_warns_and_strict_fails(tmp_path, no_model: dict[str, str]) -> None:
    path = tmp_path / "pii.yaml"
    path.write_text(PII_POLICY.format(entities='["PERSON", "EMAIL"]'))
    env = {"PATH": "/usr/bin:/bin", **no_model}
    cmd = [sys.executable, "-m", "crossaudit.cli", "policy", "validate", str(path)]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert (
        "warning: no verdict here: rule 'pii_protection' (fails closed: block): "
        "evaluators[0].config.entities (pii_detector): presidio: entity PERSON needs"
    ) in plain.stdout
    strict = subprocess.run([*cmd, "--strict"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
                            check=False)  # fmt: skip
    assert strict.returncode == 1 and "entity PERSON needs" in strict.stdout
