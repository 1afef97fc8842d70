"""Evaluator provenance end to end on the process backend: real agents, the real engine and runtime.

The exploit first: custom code is the tenant's, so whatever its verdict claims (a ``provenance``
field, keys named like provenance facts, in details or at the top level) must never reach the
recorded provenance, which comes from the host side only (docs/provenance.md).
"""

from __future__ import annotations

import hashlib
import sys

import pytest

from crossaudit.kernel.limits import SandboxLimits
from crossaudit.kernel.results import Status
from orchestrator.engine.engine import Engine
from orchestrator.policy import load_policy
from orchestrator.runtime import Runtime
from sandbox.process.backend import ProcessSandbox, interpreter_identity

# Custom code that claims every provenance key, in every place a verdict can carry one.
LYING_CODE = """
def evaluate(prompt, response, context):
    claims = {"kind": "builtin", "image_id": "sha256:forged", "code_sha256": "0" * 64,
              "dependencies_sha256": "1" * 64, "sbom_sha256": "2" * 64, "backend": "docker",
              "response_id": "forged", "model_sha256": "3" * 64}
    return {"score": 0.9, "passed": True, "provenance": claims, "image_id": "sha256:forged",
            "details": {"provenance": claims, **claims}}
"""


def policy_of(code: str, *, cache: bool = False) -> object:
    indented = "\n".join("        " + line for line in code.strip().splitlines())
    settings = "settings: {cache_results: true, cache_duration: 60}\n" if cache else ""
    return load_policy(
        f"""name: P
description: provenance
version: "1.0"
evaluators:
  - name: liar
    type: custom
    config:
      code: |
{indented}
rules:
  - {{name: r, evaluator: liar, threshold: 0.5, action: block}}
{settings}"""
    )


@pytest.fixture
async def engine():
    sandbox = ProcessSandbox(SandboxLimits(timeout_s=10.0))
    eng = Engine(Runtime(sandbox))
    yield eng
    await eng.aclose()
    await sandbox.aclose()


async def test_custom_code_cannot_set_its_provenance(engine) -> None:
    decision = await engine.evaluate(policy_of(LYING_CODE), "p", "r", {}, timeout=20)
    result = decision.rule("r").evaluators[0]
    assert result.status is Status.PASS and result.score == pytest.approx(0.9)
    assert result.details["provenance"]["image_id"] == "sha256:forged"  # the claim stays what it is: content
    code = LYING_CODE.strip() + "\n"
    assert result.provenance == {
        "kind": "custom",
        "code_sha256": hashlib.sha256(code.encode()).hexdigest(),
        "bundle_sha256": engine.evaluator_for(policy_of(LYING_CODE), "liar").bundle.digest,
        "backend": "process",
        "image_id": interpreter_identity(sys.executable),
    }


async def test_a_cached_verdict_keeps_the_provenance_of_its_call(engine) -> None:
    policy = policy_of(LYING_CODE, cache=True)
    first = (await engine.evaluate(policy, "p", "same", {}, timeout=20)).rule("r").evaluators[0]
    again = (await engine.evaluate(policy, "p", "same", {}, timeout=20)).rule("r").evaluators[0]
    assert not first.cached and again.cached
    assert again.provenance == first.provenance and first.provenance["image_id"].startswith("process:")


def test_interpreter_identity_is_the_digest_of_the_interpreter_file() -> None:
    from pathlib import Path

    real = Path(sys.executable).resolve()
    assert interpreter_identity(sys.executable) == (
        f"process:{real.name}@sha256:{hashlib.sha256(real.read_bytes()).hexdigest()}"
    )
