"""The rough edges of a real server and its CLI: ``Health/List`` answers (no ERROR traceback in the
log), the start line says where the data lives, YAML syntax errors come back in plain words at
line:column, list commands print tables and every record timestamp is ISO-8601 UTC."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crossaudit import Client
from crossaudit.v1 import policy_pb2, policy_pb2_grpc
from tests.e2e.conftest import ROOT, ServerProcess, key
from tests.e2e.policies import KEYWORDS

pytestmark = pytest.mark.e2e

ISO_MILLIS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ISO_SECONDS = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b")
BAD_INDENT = 'name: p\ndescription: d\nversion: "1"\nrules:\n  - name: r\n    evaluator: e\n     threshold: 0.5\n'
BAD_INDENT_SAYS = ":7:6: YAML syntax: a mapping value is not allowed here (check the indentation of this line)"


def cli(server: ServerProcess, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env |= {"CROSSAUDIT_SERVER": server.address, "CROSSAUDIT_API_KEY": key("acme")}
    res = subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in res.stdout + res.stderr
    return res


def test_health_list_answers_every_service_without_a_traceback(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        listed = health.List(health_pb2.HealthListRequest(), timeout=10)  # no key: health is public
        check = health.Check(health_pb2.HealthCheckRequest(service="crossaudit.v1.InfoService"), timeout=10)
    statuses = {name: s.status for name, s in listed.statuses.items()}
    assert statuses[""] == health_pb2.HealthCheckResponse.SERVING
    assert statuses["crossaudit.v1.InfoService"] == check.status == health_pb2.HealthCheckResponse.SERVING
    assert {"crossaudit.v1.PolicyService", "crossaudit.v1.EvaluationService"} <= set(statuses)
    log = server.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-2000:]


def test_the_start_line_says_where_the_data_lives(server: ServerProcess) -> None:
    data = (server.data_dir / "data").resolve()
    assert f"data dir {data}," in server.start_line, server.start_line
    assert f"store sqlite {data / 'crossaudit.db'}," in server.start_line, server.start_line
    assert (data / "crossaudit.db").is_file()


def test_yaml_syntax_errors_are_plain_words_from_the_server_and_the_cli(server: ServerProcess, tmp_path: Path) -> None:
    with grpc.insecure_channel(server.address) as channel:  # the server's own answer, no client-side parsing
        answer = policy_pb2_grpc.PolicyServiceStub(channel).ValidatePolicy(
            policy_pb2.ValidatePolicyRequest(content=BAD_INDENT, filename="p.yaml"),
            metadata=(("authorization", f"Bearer {key('acme')}"),),
            timeout=10,
        )
    assert not answer.valid
    assert [(i.line, i.column, i.message) for i in answer.issues] == [
        (7, 6, "YAML syntax: a mapping value is not allowed here (check the indentation of this line)")
    ]
    (tmp_path / "p.yaml").write_text(BAD_INDENT)
    for args in (("policy", "deploy", "p.yaml"), ("policy", "validate", "p.yaml")):
        res = cli(server, *args, cwd=tmp_path)
        assert res.returncode == 1 and "p.yaml" + BAD_INDENT_SAYS in res.stdout + res.stderr, res
        assert "while parsing" not in res.stdout + res.stderr


def test_lists_are_tables_and_timestamps_iso_8601(server: ServerProcess, tmp_path: Path) -> None:
    with Client(server.address, api_key=key("acme")) as c:
        c.deploy_policy(KEYWORDS, environment="staging")
        decision = c.evaluate("keywords", "p", "bad", environment="staging", timeout=30)
    [review_id] = decision.review_ids

    reviews = json.loads(cli(server, "review", "list", "--json").stdout)
    (review,) = (r for r in reviews if r["id"] == review_id)
    assert ISO_MILLIS.match(review["created_at"]) and review["resolved_at"] is None
    assert isinstance(review["policy_revision"], int)
    resolved = json.loads(cli(server, "review", "resolve", review_id, "--state", "approved", "--json").stdout)
    assert ISO_MILLIS.match(resolved["resolved_at"]) and resolved["resolved_at"] >= resolved["created_at"]

    policies = json.loads(cli(server, "policy", "list", "--json").stdout)
    (keywords,) = (p for p in policies if p["name"] == "keywords")
    assert ISO_MILLIS.match(keywords["deployments"][0]["deployed_at"])
    assert set(keywords) == {"name", "latest_version", "deployments"}  # the shape --json always had
    decisions = json.loads(cli(server, "audit", "list", "--json").stdout)
    (record,) = (d for d in decisions if d["decision_id"] == decision.decision_id)
    assert ISO_MILLIS.match(record["created_at"])
    got = json.loads(cli(server, "audit", "get", decision.decision_id).stdout)
    assert got["created_at"] == record["created_at"] and isinstance(got["policy_revision"], int)

    table = cli(server, "review", "list", "--state", "any").stdout
    (row,) = (line for line in table.splitlines() if review_id in line)
    assert "approved" in row and len(ISO_SECONDS.findall(row)) == 2  # created and resolved
    assert table.splitlines()[1].split("┃")[1].strip() == "Review"  # a rich table's header
    audit = cli(server, "audit", "list").stdout
    (row,) = (line for line in audit.splitlines() if decision.decision_id in line)
    assert "failed flag" in row and ISO_SECONDS.search(row)
    assert cli(server, "webhooks", "list").stdout == "no deliveries\n"
