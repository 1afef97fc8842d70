"""Evaluate over gRPC vs in-process, same 10-rule policy, same sandbox kind, same run.

Prints p50/p99 latency and decisions/s at 1 and 16 concurrent clients, and the ratio
(gRPC / in-process): the service's overhead (transport, auth, conversion, the audit write).
gRPC and in-process rounds alternate so that machine noise hits both alike. Two variants:
every request runs both evaluators in the sandbox, and evaluator results cached (which
measures everything but the sandbox). A no-op gRPC call (health check) gives the transport
floor. ``CROSSAUDIT_BENCH_SANDBOX=docker`` benchmarks the docker backend instead of process.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crossaudit.sdk.client import AsyncClient
from orchestrator.policy import load_policy
from tests.bench import report
from tests.bench.peers import guardrails_ai as guardrails
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules

CONCURRENCY = (1, 16)
WARMUP = 30
ROUNDS = 3  # gRPC and in-process alternate this many times per level
REQUESTS = {1: 300, 16: 1_600}  # bounded: total requests per level and side
TIMEOUT_S = 10.0
RESPONSE = "A perfectly ordinary answer about renewable energy sources and their trade-offs."
Call = Callable[[int, int], Awaitable[None]]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(call: Call, concurrency: int, total: int) -> tuple[list[float], float]:
    """``concurrency`` workers share ``total`` calls; returns latencies (ms) and wall seconds."""
    latencies: list[float] = []
    per_worker = max(1, total // concurrency)

    async def worker(i: int) -> None:
        for n in range(per_worker):
            t0 = time.perf_counter()
            await call(i, n)
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return latencies, time.perf_counter() - t0


class _Side:
    def __init__(self, call: Call) -> None:
        self.call = call
        self.results: dict[int, tuple[list[float], float]] = {}

    async def round(self, concurrency: int, total: int) -> None:
        lat, wall = await _drive(self.call, concurrency, total)
        old_lat, old_wall = self.results.get(concurrency, ([], 0.0))
        self.results[concurrency] = (old_lat + lat, old_wall + wall)


async def _variant(address: str, kind: str, cached: bool) -> tuple[_Side, _Side]:
    from orchestrator.engine.engine import Engine
    from orchestrator.runtime import Runtime, make_sandbox

    text = ten_rules(cached=cached)
    policy = load_policy(text)
    clients = [AsyncClient(address, api_key=key("acme")) for _ in range(max(CONCURRENCY))]
    sandbox = make_sandbox(kind)
    runtime = Runtime(sandbox)
    engine = Engine(runtime)
    try:
        await clients[0].deploy_policy(text)
        for spec in policy.evaluators:  # the preparation the service does at deploy
            await sandbox.prepare(runtime.bundle_for(spec, policy))

        async def remote(i: int, n: int) -> None:
            d = await clients[i].evaluate(policy.name, "prompt", RESPONSE, timeout=TIMEOUT_S)
            assert len(d.rules) == 10 and not d.errored_rules, d.errored_rules

        async def local(i: int, n: int) -> None:
            d = await engine.evaluate(policy, "prompt", RESPONSE, {}, timeout=TIMEOUT_S)
            assert len(d.rules) == 10 and not d.errored_rules, d.errored_rules

        sides = _Side(remote), _Side(local)
        for side in sides:
            await _drive(side.call, 1, WARMUP)
        for c in CONCURRENCY:
            for _ in range(ROUNDS):
                for side in sides:
                    await side.round(c, REQUESTS[c] // ROUNDS)
        return sides
    finally:
        for cl in clients:
            await cl.close()
        await engine.aclose()
        await sandbox.aclose()


async def _transport_floor(address: str) -> float:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        req = health_pb2.HealthCheckRequest(service="")

        async def call(i: int, n: int) -> None:
            await stub.Check(req, timeout=TIMEOUT_S)

        await _drive(call, 1, WARMUP)
        lat, _ = await _drive(call, 1, REQUESTS[1])
        return statistics.median(lat)


def _row(label: str, lat: list[float], wall: float) -> str:
    return (
        f"  {label:<12} p50 {statistics.median(lat):7.2f} ms   p99 {_pct(lat, 0.99):7.2f} ms   "
        f"{len(lat) / wall:8.0f} decisions/s   (n={len(lat)})"
    )


def main() -> None:
    kind = os.environ.get("CROSSAUDIT_BENCH_SANDBOX", "process")
    variants = (False, True)
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp), sandbox=kind) as srv:
        floor = asyncio.run(_transport_floor(srv.address))
        results = {cached: asyncio.run(_variant(srv.address, kind, cached)) for cached in variants}
    print(f"10-rule policy, 2 custom evaluators in the {kind} sandbox; server: separate process on loopback")
    print(f"transport floor (health check round trip, 1 client): p50 {floor:.2f} ms")
    for cached in variants:
        what = "evaluator results cached (all but the sandbox)" if cached else "both evaluators run in the sandbox"
        print(f"\n{what}:")
        remote, local = results[cached]
        for c in CONCURRENCY:
            (rl, rw), (ll, lw) = remote.results[c], local.results[c]
            print(f"concurrency {c}:")
            print(_row("gRPC", rl, rw))
            print(_row("in-process", ll, lw))
            print(
                f"  ratio gRPC/in-process: p50 x{statistics.median(rl) / statistics.median(ll):.2f}, "
                f"p99 x{_pct(rl, 0.99) / _pct(ll, 0.99):.2f}, throughput x{(len(rl) / rw) / (len(ll) / lw):.2f}"
            )
            variant = "cached" if cached else "sandbox"
            for side, lat, wall in (("grpc", rl, rw), ("inprocess", ll, lw)):
                report.record(
                    f"{side}.{variant}.c{c}",
                    f"{'gRPC' if side == 'grpc' else 'in-process'} {variant} c={c}",
                    lat,
                    wall,
                    unit="decisions/s",
                    concurrency=c,
                    group=f"evaluate ({variant})",
                )
            report.ratio(f"ratio.grpc_vs_inprocess.{variant}.c{c}", (len(rl) / rw) / (len(ll) / lw))
    report.ratio("ratio.grpc_vs_inprocess.c16", report.RATIOS["ratio.grpc_vs_inprocess.cached.c16"])
    report.ratio("transport_floor_p50_ms", floor)
    _peers()


def _peers() -> None:
    """Guardrails AI (from PyPI, its own environment) with ten equivalent validators, next to
    CrossAudit's cached figures of this run."""
    print("\npeer, same run: Guardrails AI, 10 custom validators equivalent to the 10 rules, in-process")
    try:
        measured = guardrails.measure(RESPONSE, warmup=WARMUP, requests=REQUESTS)
    except (OSError, subprocess.SubprocessError) as e:  # no PyPI here: say so, measure the rest
        print(f"  Guardrails AI could not be installed or run: {e}")
        return
    for c in CONCURRENCY:
        lat, wall = measured[c]["latencies_ms"], measured[c]["wall_s"]
        peer = report.record(
            f"peer.guardrails.c{c}",
            f"Guardrails AI c={c}",
            lat,
            wall,
            unit="validations/s",
            concurrency=c,
            group="evaluate (cached)",
            version=guardrails.GUARDRAILS_VERSION,
        )
        ours_grpc, ours_local = report.SCENARIOS[f"grpc.cached.c{c}"], report.SCENARIOS[f"inprocess.cached.c{c}"]
        print(f"concurrency {c}:")
        print(_row("Guardrails", lat, wall))
        print(
            f"  CrossAudit gRPC p50 {ours_grpc.p50_ms:.2f} ms ({ours_grpc.throughput:.0f}/s), in-process p50 "
            f"{ours_local.p50_ms:.2f} ms ({ours_local.throughput:.0f}/s); Guardrails in-process / CrossAudit "
            f"gRPC: p50 x{peer.p50_ms / ours_grpc.p50_ms:.2f}, throughput x{peer.throughput / ours_grpc.throughput:.2f}"
        )


if __name__ == "__main__":
    main()
