"""``crossaudit policy analyze NAME[@VERSION] --server`` and ``policy diff --symbolic`` of stored
versions, through the real CLI against a real server (docs/analysis.md)."""

from __future__ import annotations

import json

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, key, run_cli

pytestmark = pytest.mark.e2e

POLICY = """\
name: analyzed
description: one rule shadowed by a stricter one on the same score
version: "{version}"
evaluators:
  - name: scorer
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 1.0}}
rules:
  - {{name: strict_first, evaluator: scorer, threshold: {threshold}, action: block, priority: 100}}
  - {{name: dead_second, evaluator: scorer, threshold: 0.3, action: block, priority: 50}}
"""


def test_a_deployed_policy_and_its_stored_versions(server: ServerProcess) -> None:
    with Client(server.address, api_key=key("globex")) as globex:
        globex.deploy_policy(POLICY.format(version="1.0", threshold=0.5), environment="production")
        globex.deploy_policy(POLICY.format(version="1.1", threshold=0.72), environment="production")
    res = run_cli("policy", "analyze", "analyzed", "--server", "--fail-on", "warning", "--json", server=server)
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["source"] == "analyzed@2" and [f["kind"] for f in doc["findings"]] == ["never-decides"]
    assert run_cli("policy", "analyze", "analyzed@1", "--server", server=server).returncode == 0  # warnings only
    res = run_cli("policy", "diff", "analyzed@1", "analyzed@2", "--symbolic", server=server)
    assert res.returncode == 1, res.stderr
    assert "scorer's score in [0.5, 0.72)" in res.stdout
    missing = run_cli("policy", "analyze", "no_such_policy", "--server", server=server)
    assert missing.returncode == 2 and "no_such_policy" in missing.stderr
