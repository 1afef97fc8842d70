"""What judging an answer's tool calls adds through the guard proxy (issue 36): a chat completion
with 4 tool calls, side by side with the same answer without them, against one output-stage
decision.

A real ``crossaudit serve`` decides (an agents policy: custom evaluators in the process sandbox,
evaluator results cached, so repeated answers measure everything but the sandbox); two real
``crossaudit proxy`` processes, configured alike, sit in front of two loopback upstream stubs
(each in a process of its own) that answer the same text, one with 4 tool calls (their
arguments e-mail-free, so each passes). Requests alternate between the two, so both share the
machine's moments alike. The added latency of the tool stage is p50(with calls) − p50(without);
the target (docs/agents.md) is at most 1.5× one output-stage decision (an Evaluate at
``stage: output`` of the answer's text, timed alone over gRPC), since the calls are judged
concurrently beside the output stage. Figures, not assertions.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx

from crossaudit import Client
from tests.bench import report
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.test_proxy import APP_KEY, PROXY_ENV, ProxyProcess, proxy_config
from tests.e2e.upstream_stub import UpstreamStub

RUNS = 150  # requests per side, alternating
WARMUP = 10
DECISIONS = 150  # one output-stage decision timed alone
SLOW_MS = 30.0  # the share of completions slower than this is printed: the spread is bimodal on a loaded machine
TEXT = "I will look these up and send the summary."
CALLS = [
    {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    for i, (name, args) in enumerate(
        [
            ("search_issues", {"query": "open bugs", "limit": 10}),
            ("lookup_order", {"order_id": 4711}),
            ("fetch_url", {"url": "https://example.com/status"}),
            ("send_email", {"to": "the account owner", "subject": "Status", "body": "All systems normal."}),
        ]
    )
]

POLICY = """
name: agents-bench
description: tool calls, tool results, input and output
version: "1.0"
settings:
  cache_results: true
  cache_duration: 3600
evaluators:
  - name: emails
    type: custom
    config:
      code: |
        import re

        def evaluate(prompt, response, context):
            spans = [{"start": m.start(), "end": m.end(), "label": "EMAIL_ADDRESS", "score": 1.0}
                     for m in re.finditer(r"[\\w.+-]+@[\\w-]+\\.[\\w.]+", response)]
            return {"score": 0.0 if spans else 1.0, "spans": spans}
  - name: never
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {"score": 0.0, "violations": ["destructive tool"]}
  - name: markers
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            hit = "ignore previous instructions" in response.lower()
            return {"score": 0.0 if hit else 1.0}
rules:
  - name: no_injection
    evaluator: markers
    stage: input
    action: block
  - name: no_emails_in_answers
    evaluator: emails
    stage: output
    action: modify
    action_config: {replacement_text: "[{label}]"}
  - name: no_destructive_tools
    evaluator: never
    stage: tool_call
    priority: 10
    action: block
    conditions: [{field: tool.name, operator: in, value: [delete_repository, drop_database]}]
  - name: redact_emails_in_arguments
    evaluator: emails
    stage: tool_call
    action: modify
    action_config: {replacement_text: "[{label}]"}
  - name: no_injected_tool_results
    evaluator: markers
    stage: tool_result
    action: block
"""


def _upstream(ports: multiprocessing.Queue[int], stop: Event, extra: dict[str, Any]) -> None:
    """A stub in a process of its own: the bench's reader does not share its interpreter."""
    stub = UpstreamStub()
    stub.reset(reply=TEXT, extra=extra)
    ports.put(stub.port)
    while not stop.wait(1):
        with stub.lock:
            stub.requests.clear()  # it records every request: not kept over a whole run
    stub.close()


def _ask(client: httpx.Client, url: str, calls: int) -> float:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "Status of my order, please"}]}
    t0 = time.perf_counter()
    r = client.post(url + "/chat/completions", json=body, headers={"authorization": f"Bearer {APP_KEY}"}, timeout=60)
    elapsed = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    message = r.json()["choices"][0]["message"]
    assert message["content"] == TEXT, message
    got = message.get("tool_calls") or []
    assert [c["function"] for c in got] == [c["function"] for c in CALLS[:calls]], got  # passed, unchanged
    judged = r.headers.get("x-crossaudit-tool-call-action", "")
    assert (judged.split(",") if judged else []) == ["allow"] * calls, judged
    return elapsed


def main() -> None:
    stop = multiprocessing.Event()
    stubs, urls = [], []
    for extra in ({"tool_calls": CALLS}, {}):
        ports: multiprocessing.Queue[int] = multiprocessing.Queue()
        p = multiprocessing.Process(target=_upstream, args=(ports, stop, extra), daemon=True)
        p.start()
        stubs.append(p)
        urls.append(f"http://127.0.0.1:{ports.get(timeout=30)}/v1")
    root = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    server = ServerProcess(root / "server")
    proxies: list[ProxyProcess] = []
    times: dict[str, list[float]] = {"tools": [], "plain": []}
    decide: list[float] = []
    try:
        server.start()
        callers = {"app": {"keys": [APP_KEY], "policies": ["agents-bench"], "default_policy": "agents-bench"}}
        for name, url in zip(times, urls, strict=True):
            proxies.append(ProxyProcess(root / name, proxy_config(server.address, url, callers), PROXY_ENV).start())
        with Client(server.address, api_key=key("acme")) as c:
            c.deploy_policy(POLICY, environment="production")
            for _ in range(WARMUP):
                c.evaluate("agents-bench", "Status of my order, please", TEXT, stage="output")
            for _ in range(DECISIONS):  # one output-stage decision, as the proxy asks for it (cached)
                t0 = time.perf_counter()
                c.evaluate("agents-bench", "Status of my order, please", TEXT, stage="output")
                decide.append((time.perf_counter() - t0) * 1000)
        sides = {"tools": (proxies[0].url, len(CALLS)), "plain": (proxies[1].url, 0)}
        t_start = time.perf_counter()
        with httpx.Client(trust_env=False) as client:  # one client: its setup is in no figure
            for _ in range(WARMUP):  # connections, the server's caches, the sandboxes
                for url, calls in sides.values():
                    _ask(client, url, calls)
            t_start = time.perf_counter()
            for _ in range(RUNS):  # alternating, so the two share the machine's moments alike
                for name, (url, calls) in sides.items():
                    times[name].append(_ask(client, url, calls))
        wall = time.perf_counter() - t_start
    finally:
        for p in proxies:
            p.stop()
        server.stop()
        stop.set()
        for s in stubs:
            s.join(10)
    one = statistics.median(decide)
    tools, plain = statistics.median(times["tools"]), statistics.median(times["plain"])
    added = tools - plain
    print(f"{RUNS} chat completions each, alternating; cached evaluators; {len(CALLS)} tool calls, all passing")
    print(f"{'answer':<22} {'p25 ms':>8} {'p50 ms':>8} {'p75 ms':>8} {'p95 ms':>8} {'> 30 ms':>8}")
    for name, label in (("plain", "without tool calls"), ("tools", f"with {len(CALLS)} tool calls")):
        s = report.record(
            f"agents.{name}", f"proxy chat completion, {label}", times[name], wall / 2,
            unit="completions/s", concurrency=1, group="agents",
        )  # fmt: skip
        q25, q75 = report.percentile(times[name], 0.25), report.percentile(times[name], 0.75)
        slow = sum(t > SLOW_MS for t in times[name]) / len(times[name])
        print(f"{label:<22} {q25:>8.1f} {s.p50_ms:>8.1f} {q75:>8.1f} {s.p95_ms:>8.1f} {slow:>8.0%}")
    print(f"one output-stage decision (Evaluate over gRPC, cached): p50 {one:.2f} ms over {DECISIONS}")
    print(f"added by the tool stage: p50 {added:+.2f} ms = {added / one:.2f}x one output-stage decision", end="")
    print(" (target <= 1.5x)")
    report.ratio("ratio.agents.tool_stage_over_output_decision", added / one)
