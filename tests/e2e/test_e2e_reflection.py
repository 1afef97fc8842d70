"""A client with no generated code (reflection + descriptor_pool) drives the real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import KEYWORDS, UPLOAD_CODE

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).with_name("reflection_client.py")


def test_reflection_only_client(server: ServerProcess) -> None:
    job = {
        "address": server.address,
        "api_key": key("acme"),
        "policy": KEYWORDS,
        "policy_name": "keywords",
        "code": UPLOAD_CODE,
        "invalid_policy": "name: x\ndescription: d\nversion: '1'\nrules:\n  - name: r\n    threshold: 3\n",
    }
    # -I: isolated, so neither the repository nor the tests are importable by the script
    proc = subprocess.run(
        [sys.executable, "-I", str(SCRIPT)], input=json.dumps(job), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["imported_project_modules"] == []
    assert {
        "crossaudit.v1.PolicyService",
        "crossaudit.v1.EvaluationService",
        "crossaudit.v1.EvaluatorService",
        "crossaudit.v1.ReviewService",
        "grpc.health.v1.Health",
    } <= set(r["services"])
    assert r["deploy"]["version"]["version"] >= 1
    ev = r["evaluate"]
    assert ev["action"] == "ACTION_FLAG" and ev["passed"] is False and len(ev["decision_id"]) == 36
    assert [x["rule"] for x in ev["rules"]] == ["no_bad", "no_worse"]
    assert ev["rules"][0]["outcome"]["params"]["severity"] == "high"
    assert len(ev["review_ids"]) == 1
    stream = {x["request_id"]: x["decision"] for x in r["stream"]}
    assert stream["fine"]["passed"] is True and stream["worse"]["action"] == "ACTION_REQUIRE_REVIEW"
    assert r["upload"][-1]["evaluator"]["name"] == "reflected" and len(r["upload"][-1]["evaluator"]["id"]) == 36
    assert ev["review_ids"][0] in {x["id"] for x in r["reviews"]["reviews"]}
    assert r["invalid"]["code"] == "INVALID_ARGUMENT" and "rules[0].threshold" in r["invalid"]["details"]
    assert r["unauthenticated"]["code"] == "UNAUTHENTICATED"
