"""A builtin evaluator (langdetect in its model server) chained to a sandboxed custom one."""

from __future__ import annotations

import pytest

from crossaudit import Client
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
