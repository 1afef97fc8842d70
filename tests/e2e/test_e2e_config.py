"""The layered configuration through a real ``crossaudit serve``: a config file and environment
variables set limits that the real gRPC path enforces, ``--log-format json`` writes one JSON
object per line naming the decision, and /metrics (scraped over HTTP) shows bounded tenant
labels, result-cache hits and misses, and LLM tokens and cost from a local OpenAI-compatible
stub on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crossaudit import Client
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import evaluation_pb2_grpc as ev_grpc
from tests.e2e.conftest import ROOT, TENANT_KEYS, ServerProcess, key
from tests.openai_stub import OpenAIStub

pytestmark = pytest.mark.e2e

TIMEOUT_S = 60.0
REQUEST_LIMIT = 64 * 1024  # from the environment, over the file's 1 MiB
PROMPT_TOKENS, COMPLETION_TOKENS = 1_200, 300
PRICE_PROMPT, PRICE_COMPLETION = 2.0, 10.0  # USD per million tokens, from the file

CONFIG = f"""
limits:
  max_request_bytes: 1048576             # overridden by CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES
  max_inflight_evaluations_per_tenant: 8
metrics_limits:
  max_tenant_labels: 1                   # acme is seen first; globex is counted as "other"
llm_prices:
  judge-1: {{prompt: {PRICE_PROMPT}, completion: {PRICE_COMPLETION}}}
"""
KEYS = f"""
llm_base_url_hosts: ["127.0.0.1"]
tenants:
  acme: [{TENANT_KEYS["acme"]}]
  globex: [{TENANT_KEYS["globex"]}]
"""


def judge_policy(url: str) -> str:
    return f"""
version: "1.0"
name: judged
description: an LLM judge, cached
evaluators:
  - name: judge
    type: llm
    config: {{provider: openai_compatible, model: judge-1, base_url: "{url}"}}
rules:
  - {{name: safe_enough, evaluator: judge, threshold: 0.5, action: warn}}
settings: {{cache_results: true, cache_duration: 600}}
"""


@pytest.fixture(scope="module")
def stub() -> Iterator[OpenAIStub]:
    s = OpenAIStub(prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS, score=0.9)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("configured")
    (root / "crossaudit.yaml").write_text(CONFIG)
    with ServerProcess(
        root,
        keys_text=KEYS,
        extra=("--config", str(root / "crossaudit.yaml"), "--log-format", "json", "--log-level", "DEBUG"),
        env={"CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES": str(REQUEST_LIMIT)},
    ) as srv:
        yield srv


def raw_evaluate(address: str, tenant: str, prompt: str) -> grpc.RpcError | None:
    with grpc.insecure_channel(address) as channel:
        try:
            ev_grpc.EvaluationServiceStub(channel).Evaluate(
                ev_pb.EvaluateRequest(policy="judged", environment="production", prompt=prompt, response="ok"),
                metadata=(("authorization", f"Bearer {key(tenant)}"),),
                timeout=TIMEOUT_S,
            )
        except grpc.RpcError as e:
            return e
    return None


def scrape(srv: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://{srv.metrics_address}/metrics", timeout=10) as resp:
        return resp.read().decode()


def sample(body: str, name: str, labels: dict[str, str]) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    for line in body.splitlines():
        if not line.startswith(name + "{"):
            continue
        inside = line[len(name) + 1 : line.index("}")]
        have = dict(part.split("=", 1) for part in inside.split(","))
        if all(have.get(k) == json.dumps(v) for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} sample with {labels}")


def test_limit_from_the_environment_beats_the_file_on_the_real_path(
    configured: ServerProcess, stub: OpenAIStub
) -> None:
    with Client(configured.address, api_key=key("acme")) as c:
        c.deploy_policy(judge_policy(stub.url), environment="production")
    assert raw_evaluate(configured.address, "acme", "p" * (REQUEST_LIMIT // 2)) is None
    err = raw_evaluate(configured.address, "acme", "p" * (REQUEST_LIMIT + 1024))  # under the file's 1 MiB
    # any gRPC client reads the setting and its value, typed (not grpc's "larger than max")
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
    assert f"over the server's limit of {REQUEST_LIMIT} bytes (limits.max_request_bytes;" in (err.details() or "")
    assert ("crossaudit-error-type", "RequestTooLargeError") in tuple(err.trailing_metadata() or ())
    # What the operator would see for it: the value and its source.
    config = str(configured.data_dir / "crossaudit.yaml")
    show = subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", "config", "show", "--json", "--config", config],
        capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S, check=True,
        env={"PATH": "/usr/bin:/bin", "CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES": str(REQUEST_LIMIT)},
    )  # fmt: skip
    shown = json.loads(show.stdout)["settings"]
    assert shown["limits.max_request_bytes"] == {
        "value": REQUEST_LIMIT, "source": "env", "origin": "CROSSAUDIT_LIMITS__MAX_REQUEST_BYTES",
    }  # fmt: skip
    assert shown["limits.max_inflight_evaluations_per_tenant"]["source"] == "file"


def test_json_logs_metrics_tenants_cache_and_llm_tokens(configured: ServerProcess, stub: OpenAIStub) -> None:
    with Client(configured.address, api_key=key("acme")) as c:
        c.deploy_policy(judge_policy(stub.url), environment="production")
        calls = stub.calls
        first = c.evaluate("judged", "a cached question", "an answer", timeout=TIMEOUT_S)
        second = c.evaluate("judged", "a cached question", "an answer", timeout=TIMEOUT_S)
    assert stub.calls == calls + 1  # the second decision's verdict came from the result cache
    assert first.rule("safe_enough").evaluators[0].cached is False
    assert second.rule("safe_enough").evaluators[0].cached is True
    with Client(configured.address, api_key=key("globex")) as c:
        c.deploy_policy(judge_policy(stub.url), environment="production")
        c.evaluate("judged", "globex asks", "an answer", timeout=TIMEOUT_S)

    body = scrape(configured)
    decisions = {"policy": "judged", "action": "allow", "passed": "true"}
    assert sample(body, "crossaudit_decisions_total", {**decisions, "tenant": "acme"}) >= 2
    assert sample(body, "crossaudit_decisions_total", {**decisions, "tenant": "other"}) == 1  # globex, beyond 1
    assert 'tenant="globex"' not in body
    assert sample(body, "crossaudit_result_cache_hits_total", {"tenant": "acme"}) >= 1
    assert sample(body, "crossaudit_result_cache_misses_total", {"tenant": "acme"}) >= 1
    llm = {"tenant": "acme", "provider": "openai_compatible", "model": "judge-1"}
    acme_calls = sample(body, "crossaudit_llm_tokens_total", {**llm, "kind": "prompt"}) / PROMPT_TOKENS
    assert acme_calls >= 1 and acme_calls == int(acme_calls)
    assert sample(body, "crossaudit_llm_tokens_total", {**llm, "kind": "completion"}) == acme_calls * COMPLETION_TOKENS
    cost = acme_calls * (PROMPT_TOKENS * PRICE_PROMPT + COMPLETION_TOKENS * PRICE_COMPLETION) / 1e6
    assert sample(body, "crossaudit_llm_cost_usd_total", llm) == pytest.approx(cost)
    assert sample(body, "crossaudit_llm_tokens_total", {"tenant": "other", "model": "judge-1", "kind": "prompt"}) > 0
    assert "process_resident_memory_bytes " in body and "process_cpu_seconds_total " in body

    lines = [line for line in Path(configured.log).read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    mine = [r for r in records if r.get("decision_id") == first.decision_id]
    assert mine, "no log line carries the decision id"
    assert all(r["tenant"] == "acme" and r["policy"] == "judged" for r in mine)
