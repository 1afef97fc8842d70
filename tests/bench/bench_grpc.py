"""Evaluate over gRPC vs in-process, same 10-rule policy, same sandbox kind, same run.

Prints p50/p99 latency and decisions/s at 1 and 16 concurrent clients, and the ratio
(gRPC / in-process): the service's overhead (transport, auth, audit write, conversion).
``CROSSAUDIT_BENCH_SANDBOX=docker`` benchmarks the docker backend instead of process.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from crossaudit.client import AsyncClient
from orchestrator.policy import load_policy
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules

CONCURRENCY = (1, 16)
WARMUP = 30
REQUESTS = {1: 300, 16: 1_600}  # bounded: total requests per level
TIMEOUT_S = 10.0
RESPONSE = "A perfectly ordinary answer about renewable energy sources and their trade-offs."


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(call, concurrency: int, total: int) -> tuple[list[float], float]:
    """``concurrency`` workers share ``total`` calls; returns latencies (ms) and wall seconds."""
    latencies: list[float] = []
    per_worker = total // concurrency

    async def worker(i: int) -> None:
        for n in range(per_worker):
            t0 = time.perf_counter()
            await call(i, n)
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return latencies, time.perf_counter() - t0


Results = dict[int, tuple[list[float], float]]


async def _grpc(address: str, cached: bool) -> Results:
    clients = [AsyncClient(address, api_key=key("acme")) for _ in range(max(CONCURRENCY))]
    text = ten_rules(cached=cached)
    name = load_policy(text).name
    try:
        await clients[0].deploy_policy(text)

        async def call(i: int, n: int) -> None:
            d = await clients[i].evaluate(name, "prompt", RESPONSE, timeout=TIMEOUT_S)
            assert len(d.rules) == 10 and not d.errored_rules, d.errored_rules

        await _drive(call, 1, WARMUP)
        return {c: await _drive(call, c, REQUESTS[c]) for c in CONCURRENCY}
    finally:
        for c in clients:
            await c.close()


async def _in_process(sandbox_kind: str, cached: bool) -> Results:
    from orchestrator.engine.engine import Engine
    from orchestrator.runtime import Runtime, make_sandbox

    policy = load_policy(ten_rules(cached=cached))
    sandbox = make_sandbox(sandbox_kind)
    runtime = Runtime(sandbox)
    engine = Engine(runtime)
    try:
        for spec in policy.evaluators:  # same preparation the service does at deploy
            await sandbox.prepare(runtime.bundle_for(spec, policy))

        async def call(i: int, n: int) -> None:
            d = await engine.evaluate(policy, "prompt", RESPONSE, {}, timeout=TIMEOUT_S)
            assert len(d.rules) == 10 and not d.errored_rules, d.errored_rules

        await _drive(call, 1, WARMUP)
        return {c: await _drive(call, c, REQUESTS[c]) for c in CONCURRENCY}
    finally:
        await engine.aclose()
        await runtime.aclose()


def _row(label: str, lat: list[float], wall: float) -> str:
    return (
        f"  {label:<12} p50 {statistics.median(lat):7.2f} ms   p99 {_pct(lat, 0.99):7.2f} ms   "
        f"{len(lat) / wall:8.0f} decisions/s   (n={len(lat)})"
    )


def main() -> None:
    kind = os.environ.get("CROSSAUDIT_BENCH_SANDBOX", "process")
    variants = (False, True)
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp), sandbox=kind)
        srv.start()
        try:
            remote = {cached: asyncio.run(_grpc(srv.address, cached)) for cached in variants}
        finally:
            srv.stop()
    local = {cached: asyncio.run(_in_process(kind, cached)) for cached in variants}
    print(f"10-rule policy, 2 custom evaluators in the {kind} sandbox; server: separate process on loopback")
    for cached in variants:
        what = (
            "evaluator results cached (measures everything but the sandbox)"
            if cached
            else "every request runs both evaluators in the sandbox"
        )
        print(f"\n{what}:")
        for c in CONCURRENCY:
            (rl, rw), (ll, lw) = remote[cached][c], local[cached][c]
            print(f"concurrency {c}:")
            print(_row("gRPC", rl, rw))
            print(_row("in-process", ll, lw))
            print(
                f"  ratio gRPC/in-process: p50 x{statistics.median(rl) / statistics.median(ll):.2f}, "
                f"p99 x{_pct(rl, 0.99) / _pct(ll, 0.99):.2f}, throughput x{(len(rl) / rw) / (len(ll) / lw):.2f}"
            )


if __name__ == "__main__":
    main()
