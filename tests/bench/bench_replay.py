"""``policy replay`` throughput (docs/replay.md), through a real server (process sandbox, SQLite):
DECISIONS retained decisions of a policy with two custom evaluators and three rules (recorded with
``cache_results``, so recording them is quick), replayed

- under a threshold-only change: every verdict is the recorded one, no evaluator runs (the
  target: at least 2,000 decisions/s), and
- under a change of both evaluators' code (a comment) without the result cache: every evaluator
  runs again in the sandbox for each decision, a full re-evaluation of the most recent
  FULL_DECISIONS of the same decisions (the sandbox's pace makes all of them minutes),

side by side in one run. The figure is replayed decisions over the wall time of the whole
Replay call (candidate validated, records paged, inputs decrypted, evaluated, compared); the
latencies are each page's time per decision, from the progress events. Beside it, decisions per
CPU-second of the server process (from /proc; the sandbox's processes not included): on a
shared, loaded machine the wall figure measures the neighbours too.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
from pathlib import Path

from crossaudit import Client
from crossaudit.sdk.client import ReplayOptions
from tests.bench import report
from tests.e2e.conftest import TENANT_KEYS, ServerProcess, key
from tests.security.test_webhook_backlog import cpu_seconds

DECISIONS = 5_000
FULL_DECISIONS = 500
OPERATOR_KEY_ENV = "REPLAY_BENCH_OPERATOR_KEY"

POLICY = """
name: replayed
description: two custom evaluators, three rules
version: "1"
settings: {{cache_results: {cache}}}
evaluators:
  - name: length
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": min(1.0, len(response) / 200)}}  {mark}
  - name: words
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 0.0 if "refund" in response else 1.0}}  {mark}
rules:
  - {{name: long_enough, evaluator: length, threshold: {threshold}, action: warn}}
  - {{name: no_refunds, evaluator: words, threshold: 0.5, action: block}}
  - {{name: both, evaluators: [{{name: length, weight: 1}}, {{name: words, weight: 1}}], threshold: 0.5, action: flag}}
"""


def policy(threshold: float = 0.4, mark: str = "", cache: bool = True) -> str:
    return POLICY.format(threshold=threshold, mark=f"# {mark}" if mark else "", cache=str(cache).lower())


def _replay(c: Client, srv: ServerProcess, candidate: str, name: str, label: str, limit: int) -> report.Scenario:
    pages: list[tuple[float, int]] = []  # (time, records read) at each progress event
    cpu0 = cpu_seconds(srv.pid)
    t0 = time.perf_counter()
    r = c.replay_policy(
        candidate,
        "replayed",
        ReplayOptions(limit=limit),
        progress=lambda p: pages.append((time.perf_counter(), p.read)),
    )
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(srv.pid) - cpu0
    assert r.replayed == limit, (r.replayed, r.not_replayable)
    latencies, last_t, last_n = [], t0, 0
    for t, n in pages:
        latencies += [(t - last_t) * 1000 / max(1, n - last_n)] * (n - last_n)
        last_t, last_n = t, n
    print(
        f"  {label}: {r.replayed:,} decisions in {wall:.2f}s ({r.replayed / wall:,.0f}/s; "
        f"{r.replayed / cpu:,.0f} per server CPU-second), {r.flips:,} flipped, {r.evaluator_runs:,} calls"
    )
    s = report.record(
        name, label, latencies, wall, unit="decisions/s", concurrency=1, group="replay", per_cpu_s=r.replayed / cpu
    )
    s.samples = r.replayed
    return s


def main() -> None:
    keys = (
        f"tenants:\n  acme:\n    keys: [{TENANT_KEYS['acme']}]\n    retention: {{inputs: 7d}}\n"
        f"  globex: [{TENANT_KEYS['globex']}]\n"
    )
    env = {OPERATOR_KEY_ENV: base64.b64encode(os.urandom(32)).decode()}
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(
            Path(tmp), keys_text=keys, env=env, extra=("--set", f"retention.operator_key_env={OPERATOR_KEY_ENV}")
        ) as srv,
        Client(srv.address, api_key=key("acme")) as c,
    ):
        c.deploy_policy(policy())
        items = (
            {"prompt": "p", "response": ("refund " if i % 7 == 0 else "") + "x" * (i % 150)} for i in range(DECISIONS)
        )
        t0 = time.perf_counter()
        failed = [a for a in c.evaluate_many("replayed", items) if isinstance(a, Exception)]
        assert not failed, failed[:3]
        print(f"  recorded {DECISIONS:,} retained decisions in {time.perf_counter() - t0:.1f}s")
        print(f"  load average before replaying: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        fast = _replay(
            c, srv, policy(threshold=0.3), "replay.threshold", "threshold-only change (recorded verdicts)", DECISIONS
        )
        full = _replay(
            c,
            srv,
            policy(mark="changed", cache=False),
            "replay.full",
            "code change, no cache (every evaluator runs again)",
            FULL_DECISIONS,
        )
    report.ratio("ratio.replay_threshold_vs_full", fast.throughput / full.throughput)
    print(f"  threshold-only replay is {fast.throughput / full.throughput:.1f}x a full re-evaluation")


if __name__ == "__main__":
    main()
