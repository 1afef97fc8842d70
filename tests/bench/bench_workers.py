"""``crossaudit serve --workers 2`` against ``--workers 1``: decisions/s at 16 client processes,
the cached 10-rule policy (process sandbox; cached results, so what is measured is the service,
not the sandbox), and where the CPU went.

Both servers run side by side (each idle while the other is measured) and their windows
alternate, so the machine's noise hits both alike. The clients are 16 separate processes, each
with its own channel (so the kernel spreads their connections over the workers) calling Evaluate
back to back for the window. CPU over each window, from /proc: the server (supervisor, workers and
their sandbox agents, reaped children included) and the client processes.

Run: ``python -m tests.bench workers``. Every loop is bounded in count and time; asserts nothing.
``CROSSAUDIT_BENCH_SCALE`` multiplies the durations.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

from crossaudit.sdk.client import AsyncClient
from tests.bench import report
from tests.bench.bench_capacity import _cmdline, _processes, memory_mib, own_cpu_s, server_parts, tree_cpu_s
from tests.bench.bench_grpc import RESPONSE, TIMEOUT_S
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules

SCALE = float(os.environ.get("CROSSAUDIT_BENCH_SCALE", "1"))
CLIENTS = 16  # client processes
WORKERS = (1, 2)
ROUNDS = 2  # windows per server, alternating
WARMUP_S = 3.0 * SCALE
WINDOW_S = 8.0 * SCALE
MAX_CALLS_PER_CLIENT = 100_000  # bound besides the window
POLICY = ten_rules(cached=True)
NAME = "ten-rules-cached"


def _client(address: str, seconds: float) -> list[float]:
    """One client process: Evaluate back to back for ``seconds``; the latencies (ms)."""

    async def run() -> list[float]:
        lat: list[float] = []
        client = AsyncClient(address, api_key=key("acme"))
        try:
            stop = time.perf_counter() + seconds
            for _ in range(MAX_CALLS_PER_CLIENT):
                t0 = time.perf_counter()
                if t0 > stop:
                    break
                d = await client.evaluate(NAME, "prompt", RESPONSE, timeout=TIMEOUT_S)
                assert len(d.rules) == 10 and not d.errored_rules, d.errored_rules
                lat.append((time.perf_counter() - t0) * 1000)
        finally:
            await client.close()
        return lat

    return asyncio.run(run())


class Side:
    def __init__(self, workers: int, srv: ServerProcess) -> None:
        self.workers = workers
        self.srv = srv
        self.latencies: list[float] = []
        self.wall_s = 0.0
        self.server_cpu_s = 0.0
        self.client_cpu_s = 0.0
        self.memory: dict[str, list[dict[str, float]]] = {}

    def read_memory(self) -> None:
        """RSS/PSS (MiB) of the serving processes by role, after the load: the process that
        serves (the supervisor too, with workers), and each server's sandbox agents."""
        root = self.srv.pid
        children = {pid for pid, (ppid, _) in _processes().items() if ppid == root}
        servers = [root] if self.workers == 1 else [p for p in children if _spawned(p)]
        self.memory = {"server process" if self.workers == 1 else "worker": [memory_mib(p) for p in servers]}
        if self.workers > 1:
            self.memory["supervisor"] = [memory_mib(root)]
        agents = [p for s in servers for p in server_parts(s).get("process sandbox", [])]
        self.memory["process sandbox agents"] = [memory_mib(p) for p in agents]

    def window(self, pool: multiprocessing.pool.Pool, clients: list[int], seconds: float, keep: bool) -> None:
        s0, c0, t0 = tree_cpu_s(self.srv.pid), own_cpu_s(clients), time.perf_counter()
        results = pool.starmap(_client, [(self.srv.address, seconds)] * CLIENTS, chunksize=1)
        s1, c1, t1 = tree_cpu_s(self.srv.pid), own_cpu_s(clients), time.perf_counter()
        if keep:
            self.latencies += [x for r in results for x in r]
            self.wall_s += t1 - t0
            self.server_cpu_s += s1 - s0
            self.client_cpu_s += c1 - c0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall_s


def main() -> None:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        servers = [
            ServerProcess(Path(tmp) / f"w{n}", extra=("--workers", str(n), "--log-level", "WARNING")) for n in WORKERS
        ]
        try:
            sides = []
            for n, srv in zip(WORKERS, servers, strict=True):
                srv.start()
                sides.append(Side(n, srv))
            with ctx.Pool(CLIENTS) as pool:
                clients = [p.pid for p in pool._pool]  # type: ignore[attr-defined]
                for side in sides:
                    asyncio.run(_deploy(side.srv.address))
                    side.window(pool, clients, WARMUP_S, keep=False)
                for r in range(ROUNDS):
                    for side in sides:
                        side.window(pool, clients, WINDOW_S, keep=True)
                        if r == ROUNDS - 1:
                            side.read_memory()  # at once: idle pools shrink while the other side runs
        finally:
            for srv in servers:
                srv.stop()
    one, two = sides
    cores = len(os.sched_getaffinity(0))
    print(f"  {CLIENTS} client processes, cached 10-rule policy, {cores} cores, {ROUNDS} x {WINDOW_S:g} s windows each")
    for side in sides:
        n, wall = len(side.latencies), side.wall_s
        total = side.server_cpu_s + side.client_cpu_s
        p50, p99 = statistics.median(side.latencies), report.percentile(side.latencies, 0.99)
        print(
            f"  --workers {side.workers}: {side.rate:7.0f} decisions/s   p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   "
            f"server CPU {side.server_cpu_s / wall:4.2f} cores ({1000 * side.server_cpu_s / n:.2f} ms/decision), "
            f"clients {side.client_cpu_s / wall:4.2f} cores "
            f"({100 * side.server_cpu_s / total:.0f}% / {100 * side.client_cpu_s / total:.0f}% of the CPU used)"
        )
        print("    memory: " + "; ".join(f"{part} {_mib(parts)}" for part, parts in side.memory.items()))
        report.record(
            f"workers.w{side.workers}.c{CLIENTS}",
            f"--workers {side.workers}, 16 client processes, cached 10 rules",
            side.latencies,
            side.wall_s,
            unit="decisions/s",
            concurrency=CLIENTS,
            group="workers",
            server_cpu_cores=side.server_cpu_s / side.wall_s,
            client_cpu_cores=side.client_cpu_s / side.wall_s,
            server_cpu_ms_per_decision=1000 * side.server_cpu_s / n,
            memory_mib=side.memory,
        )
    ratio = two.rate / one.rate
    report.ratio("ratio.workers.c16", ratio)
    print(f"  --workers 2 / --workers 1: {ratio:.2f}x decisions/s")


def _spawned(pid: int) -> bool:
    return any("spawn_main" in a for a in _cmdline(pid))


def _mib(parts: list[dict[str, float]]) -> str:
    rss, pss = sum(p.get("rss", 0.0) for p in parts), sum(p.get("pss", 0.0) for p in parts)
    return f"{len(parts)} x, RSS {rss:.0f} MiB, PSS {pss:.0f} MiB"


async def _deploy(address: str) -> None:
    async with AsyncClient(address, api_key=key("acme")) as c:
        await c.deploy_policy(POLICY)
