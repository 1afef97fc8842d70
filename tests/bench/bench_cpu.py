"""Server CPU per decision and single-call latency against their floors, in one run (issue 25).

A real server (separate process, loopback, process sandbox, SQLite) and a cached 10-rule
policy, so what is measured is everything but the sandbox:

- **CPU per decision**: the server's CPU seconds (``/proc/<pid>/stat``) over the decisions it
  answers in a window under 16 clients, beside a bare grpc.aio server's CPU per call (the health
  service alone: ``tests/bench/bare_grpc.py``) under the same clients for the same time; windows
  alternate. Target: at most 1.2 ms per decision; the ratio to the bare call is printed.
- **p50 at 1 client**: Evaluate rounds alternate with health-check rounds on the same server.
  Target: Evaluate p50 at most 3x the health round trip.
- **By layer**: py-spy (``--gil``: samples holding the interpreter lock, the serial part) under
  the 16-client load; each sample goes to the layer of its deepest project frame (none: grpc's
  core and asyncio's loop, the transport), printed as a share and as ms of CPU per decision.

``CROSSAUDIT_BENCH_BASELINE=<source tree>`` (a git worktree of an older commit) measures that
tree's server too, started with it first on ``PYTHONPATH``, in rounds alternating with this
tree's: before and after in one sitting, on one machine.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crossaudit.sdk.client import AsyncClient
from orchestrator.policy import load_policy
from tests.bench import report
from tests.bench.bare_grpc import READY
from tests.bench.bench_capacity import own_cpu_s
from tests.e2e.conftest import ServerProcess, key, start_process
from tests.e2e.policies import ten_rules

CLIENTS = 16
WINDOW_S = 4.0  # one CPU window under CLIENTS clients
MAX_CALLS = 100_000  # bounds a window's load loop whatever the speed
ROUNDS = 4  # CPU windows and p50 rounds per server, alternating (and which side goes first)
P50_CALLS = 150  # per 1-client round and kind
WARMUP = 50
PROFILE_S = 8  # py-spy window
PROFILE_HZ = 250
TIMEOUT_S = 10.0
RESPONSE = "A perfectly ordinary answer about renewable energy sources and their trade-offs."
CPU_TARGET_MS = 1.2
P50_TARGET_RATIO = 3.0

# Layers by the path of a sample's deepest project frame, first match wins; a sample with no
# project frame is the transport (grpc's Cython core, asyncio's loop, the SDK is not in the server).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("prometheus_client/", "crossaudit/service/metrics.py")),
    ("engine", ("orchestrator/",)),
    (
        "audit record build/encode",
        (
            "crossaudit/governance/records.py",
            "crossaudit/evidence/",
            "crossaudit/governance/evidence.py",
            "crossaudit/governance/retention.py",
            "crossaudit/outbox/",
            "crossaudit/store/base.py",
        ),
    ),
    ("store hand-off and transaction", ("crossaudit/store/", "concurrent/futures/", "sqlite3/")),
    ("response/request conversion", ("crossaudit/api/convert.py", "crossaudit/service/servicers.py")),
    ("decode, auth, admission", ("crossaudit/service/", "crossaudit/kernel/")),
)
TRANSPORT = "transport (grpc core, asyncio loop)"

Call = Callable[[], Awaitable[object]]


@dataclass
class Side:
    """One server under test and what was measured on it."""

    name: str
    server: ServerProcess
    cpu_ms: list[float] = field(default_factory=list)  # per decision, one a window
    evaluate: list[float] = field(default_factory=list)  # 1-client latencies (ms)
    health: list[float] = field(default_factory=list)
    layers: dict[str, float] = field(default_factory=dict)  # share of lock-holding samples


def _cpu_s(pid: int) -> float:
    return own_cpu_s([pid])


async def _window(calls: list[Call], pid: int) -> float:
    """Server CPU ms per call, ``len(calls)`` callers for WINDOW_S."""
    done = 0
    stop_at = time.monotonic() + WINDOW_S

    async def worker(call: Call) -> None:
        nonlocal done
        while time.monotonic() < stop_at and done < MAX_CALLS:
            await call()
            done += 1

    c0 = _cpu_s(pid)
    await asyncio.gather(*(worker(c) for c in calls))
    return 1000 * (_cpu_s(pid) - c0) / max(1, done)


async def _latencies(call: Call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _health_call(ch: grpc.aio.Channel) -> Call:
    stub = health_pb2_grpc.HealthStub(ch)
    req = health_pb2.HealthCheckRequest(service="")
    return lambda: stub.Check(req, timeout=TIMEOUT_S)


async def _measure(sides: list[Side], bare_address: str, bare_pid: int) -> list[float]:
    """Alternating CPU windows (each side, then the bare server) and 1-client rounds; returns
    the bare server's CPU ms per call, one per round."""
    text = ten_rules(cached=True)
    name = load_policy(text).name
    bare: list[float] = []
    clients = {s.name: [AsyncClient(s.server.address, api_key=key("acme")) for _ in range(CLIENTS)] for s in sides}
    channels = {s.name: grpc.aio.insecure_channel(s.server.address) for s in sides}
    bare_channels = [grpc.aio.insecure_channel(bare_address) for _ in range(CLIENTS)]
    try:
        evaluates: dict[str, list[Call]] = {}
        for s in sides:
            await clients[s.name][0].deploy_policy(text)

            def call(c: AsyncClient) -> Call:
                return lambda: c.evaluate(name, "prompt", RESPONSE, timeout=TIMEOUT_S)

            evaluates[s.name] = [call(c) for c in clients[s.name]]
            await _latencies(evaluates[s.name][0], WARMUP)
            await _latencies(_health_call(channels[s.name]), WARMUP)
        bare_calls = [_health_call(ch) for ch in bare_channels]
        await _latencies(bare_calls[0], WARMUP)
        for r in range(ROUNDS):
            order = sides if r % 2 == 0 else sides[::-1]  # neither side always goes first
            for s in order:
                s.cpu_ms.append(await _window(evaluates[s.name], s.server.pid))
            bare.append(await _window(bare_calls, bare_pid))
            for s in order:
                s.health += await _latencies(_health_call(channels[s.name]), P50_CALLS)
                s.evaluate += await _latencies(evaluates[s.name][0], P50_CALLS)
        return bare
    finally:
        for cs in clients.values():
            for c in cs:
                await c.close()
        for ch in (*channels.values(), *bare_channels):
            await ch.close()


def _layer(frames: list[str]) -> str:
    for frame in reversed(frames):
        for layer, paths in LAYERS:
            if any(p in frame for p in paths):
                return layer
    return TRANSPORT


def _profile(side: Side, tmp: Path) -> None:
    """py-spy --gil on ``side``'s server under CLIENTS clients: shares of samples by layer."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("  py-spy not installed (pip install -e '.[bench]'): no breakdown by layer")
        return
    out = tmp / f"{side.name}.collapsed"
    cmd = [py_spy, "record", "--pid", str(side.server.pid), "--rate", str(PROFILE_HZ), "--format", "raw"]
    cmd += ["--duration", str(PROFILE_S), "--output", str(out), "--nonblocking", "--gil"]
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    text = ten_rules(cached=True)
    name = load_policy(text).name

    async def load() -> None:
        clients = [AsyncClient(side.server.address, api_key=key("acme")) for _ in range(CLIENTS)]
        stop_at = time.monotonic() + PROFILE_S + 1
        try:

            async def worker(c: AsyncClient) -> None:
                for _ in range(MAX_CALLS):
                    if time.monotonic() >= stop_at:
                        return
                    await c.evaluate(name, "prompt", RESPONSE, timeout=TIMEOUT_S)

            await asyncio.gather(*(worker(c) for c in clients))
        finally:
            for c in clients:
                await c.close()

    asyncio.run(load())
    try:
        spy.wait(timeout=PROFILE_S + 30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()
    if not out.exists():
        print(f"  py-spy wrote no profile of {side.name} (ptrace not permitted?): no breakdown by layer")
        return
    counts: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[_layer(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    side.layers = {layer: n / total for layer, n in counts.items()}


def _table(sides: list[Side]) -> None:
    names = [layer for layer, _ in LAYERS] + [TRANSPORT]
    head = "".join(f" | {s.name}: share, ms/decision" for s in sides)
    print(f"\nserver interpreter-lock time by layer, 16 clients (py-spy --gil){head}")
    for layer in names:
        cells = ""
        for s in sides:
            share = s.layers.get(layer, 0.0)
            cells += f" | {100 * share:5.1f}%  {share * statistics.median(s.cpu_ms):5.3f}"
        print(f"  {layer:<36}{cells}")


def _start_bare(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    cmd = [sys.executable, "-m", "tests.bench.bare_grpc"]
    proc, line = start_process(cmd, env=env, log=tmp / "bare.log", ready=READY)
    return proc, line[len(READY) :]


def main() -> None:
    baseline = os.environ.get("CROSSAUDIT_BENCH_BASELINE", "")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        specs = [("this tree", {})]
        if baseline:
            # PYTHONSAFEPATH: the server starts in this tree (cwd), which -m would put first on sys.path
            specs.insert(0, ("baseline", {"PYTHONPATH": str(Path(baseline).resolve()), "PYTHONSAFEPATH": "1"}))
        sides = []
        bare_proc, bare_address = _start_bare(tmp)
        try:
            for label, env in specs:
                d = tmp / label.replace(" ", "-")
                d.mkdir()
                srv = ServerProcess(d, sandbox="process", env=env)
                srv.start()
                sides.append(Side(label, srv))
            bare = asyncio.run(_measure(sides, bare_address, bare_proc.pid))
            for s in sides:
                _profile(s, tmp)
        finally:
            for s in sides:
                s.server.stop()
            bare_proc.terminate()
            bare_proc.wait(10)
    _print(sides, bare)


def _print(sides: list[Side], bare: list[float]) -> None:
    bare_ms = statistics.median(bare)
    print(f"cached 10-rule policy, server a separate process on loopback; {CLIENTS} clients for CPU, 1 for p50")
    print(f"bare grpc.aio server (health service alone), CPU per call: {', '.join(f'{b:.3f}' for b in bare)} ms")
    for s in sides:
        cpu = statistics.median(s.cpu_ms)
        ev, hc = statistics.median(s.evaluate), statistics.median(s.health)
        print(f"\n{s.name}:")
        print(f"  server CPU per decision: {', '.join(f'{c:.3f}' for c in s.cpu_ms)} ms (median {cpu:.3f})")
        print(
            f"  CPU per decision / bare grpc.aio CPU per call: x{cpu / bare_ms:.2f}   "
            f"target <= {CPU_TARGET_MS} ms: {'met' if cpu <= CPU_TARGET_MS else 'MISSED'}"
        )
        print(f"  1 client: Evaluate p50 {ev:.2f} ms, health check p50 {hc:.2f} ms (n={len(s.evaluate)} each)")
        print(
            f"  Evaluate p50 / health RTT: x{ev / hc:.2f}   "
            f"target <= x{P50_TARGET_RATIO:.0f}: {'met' if ev / hc <= P50_TARGET_RATIO else 'MISSED'}"
        )
    _table(sides)
    ours = sides[-1]
    report.ratio("server_cpu_ms_per_decision", statistics.median(ours.cpu_ms))
    report.ratio("ratio.cpu_vs_bare_grpc", statistics.median(ours.cpu_ms) / bare_ms)
    report.ratio("ratio.p50_vs_health.c1", statistics.median(ours.evaluate) / statistics.median(ours.health))
    report.record(
        "cpu.evaluate.c1",
        "gRPC Evaluate cached c=1 (bench_cpu)",
        ours.evaluate,
        sum(ours.evaluate) / 1000,
        unit="decisions/s",
        concurrency=1,
        group="evaluate (cached)",
    )


if __name__ == "__main__":
    main()
