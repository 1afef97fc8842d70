"""Builtins behind the real server: a builtin evaluator (langdetect in its model server) chained
to a sandboxed custom one, and Presidio with and without a spaCy pipeline from the operator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import PolicyValidationError
from crossaudit.kernel.results import Action, Status
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import MULTI_LANGUAGE

pytestmark = pytest.mark.e2e


def test_builtin_detector_drives_a_chained_rule(server: ServerProcess) -> None:
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(MULTI_LANGUAGE)
        en = c.evaluate(
            "multi-language", "p", "This answer explains how to harm the quiet weather station.", timeout=60
        )
        es = c.evaluate("multi-language", "p", "Esta respuesta explica el tiempo de hoy en la ciudad.", timeout=60)
    assert en.rule("detect_language").evaluators[0].details["detected_language"] == "en"
    assert en.rule("detect_language").evaluators[0].kind == "builtin"
    assert en.action is Action.BLOCK and en.rule("english_safety").status is Status.FAIL
    assert es.rule("detect_language").evaluators[0].details["detected_language"] == "es"
    assert es.passed and es.rule("english_safety").status is Status.SKIPPED


PII_POLICY = """\
name: pii
description: the guide's pii_detector and its redact rule
version: "1.0"
evaluators:
  - name: pii_detector
    type: builtin
    config: {{model: presidio, entities: {entities}}}
rules:
  - name: pii_protection
    evaluator: pii_detector
    threshold: 0.8
    action: modify
    action_config: {{strategy: redact}}
"""
PII_RESPONSE = "Contact John Smith at john@example.com, SSN 219-09-9999, card 4111 1111 1111 1111."


def _start(root: Path, env: dict[str, str]) -> ServerProcess:
    srv = ServerProcess(root, env={"HF_HUB_OFFLINE": "1", **env})  # CROSSAUDIT_* of this process are dropped
    srv.start()
    return srv


@pytest.fixture(scope="module")
def modelless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """No spaCy pipeline set by the operator, an empty model store (the fresh data dir), offline."""
    srv = _start(tmp_path_factory.mktemp("modelless"), {})
    try:
        yield srv
    finally:
        srv.stop()


def test_pattern_pii_redacts_without_any_model(modelless: ServerProcess) -> None:
    with Client(modelless.address, api_key=key("acme")) as c:
        c.deploy_policy(PII_POLICY.format(entities="[EMAIL, SSN, CREDIT_CARD]"))
        d = c.evaluate("pii", "p", PII_RESPONSE, timeout=120)
    assert d.action is Action.MODIFY and d.rule("pii_protection").status is Status.FAIL
    assert d.modified_response == "Contact John Smith at [REDACTED], SSN [REDACTED], card [REDACTED]."


def test_ner_entity_is_refused_at_validate_and_deploy_without_a_model(modelless: ServerProcess) -> None:
    text = PII_POLICY.format(entities="[PERSON, EMAIL, SSN, CREDIT_CARD]")
    with Client(modelless.address, api_key=key("acme")) as c:
        (issue,) = c.validate_policy(text)
        with pytest.raises(PolicyValidationError) as err:
            c.deploy_policy(text)
    assert issue.path == "evaluators[0].config.entities" and issue.line == 7
    assert "entity PERSON needs a spaCy pipeline" in issue.message
    assert "CROSSAUDIT_SPACY_MODEL" in issue.message and "crossaudit models import" in issue.message
    assert "entity PERSON needs" in str(err.value)


def test_person_comes_from_the_operators_pipeline(tmp_path: Path) -> None:
    from crossaudit.modelserver.testing import build_spacy_pipeline

    srv = _start(tmp_path / "server", {"CROSSAUDIT_SPACY_MODEL": build_spacy_pipeline(tmp_path / "pipeline")})
    try:
        with Client(srv.address, api_key=key("acme")) as c:
            c.deploy_policy(PII_POLICY.format(entities="[PERSON, EMAIL, SSN, CREDIT_CARD]"))
            d = c.evaluate("pii", "p", PII_RESPONSE, timeout=120)
    finally:
        srv.stop()
    assert d.action is Action.MODIFY
    assert d.modified_response == "Contact [REDACTED] at [REDACTED], SSN [REDACTED], card [REDACTED]."
