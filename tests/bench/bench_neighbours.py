"""Noisy neighbours: another tenant's p50 while one tenant loads the server, side by side in one
run against a real server (process sandbox, loopback). Not a test: it asserts nothing.

- idle: globex alone, one call at a time (a one-rule policy over a trivial custom evaluator);
- cpu: the same while acme keeps FLOOD concurrent calls whose custom code burns CPU;
- audit: the same while acme keeps AUDIT_CLIENTS concurrent calls whose evaluator returns ~0.9 MB
  of violations with raw audit on, so each record is cut to limits.max_audit_bytes_per_decision
  (acme writing audit at the most its per-decision quota allows, until its daily quota refuses).

The flood runs in a process of its own so that its client CPU is not the measuring client's.
Targets (issue 20): each ratio to idle at most 2x. ``cpu`` is also measured with
limits.max_concurrent_evaluations at twice the machine's cores, beside the default.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from crossaudit import AsyncClient
from crossaudit.kernel.errors import CrossAuditError
from tests.bench import report
from tests.e2e.conftest import TENANT_KEYS, ServerProcess
from tests.e2e.policies import bulky, burner, trivial

SAMPLES = 40  # globex calls per phase
FLOOD = 120  # acme's concurrent CPU-burning calls
AUDIT_CLIENTS = 16  # acme's concurrent audit-heavy calls
RAMP_S = 3.0  # the flood runs this long before globex measures
LOAD_LIMIT_S = 300.0  # a flood process never outlives this

def _flood(address: str, policy: str, clients: int, stop: Any) -> None:
    """acme's load, in its own process: ``clients`` calls kept in flight until ``stop``."""

    async def run() -> None:
        deadline = time.monotonic() + LOAD_LIMIT_S
        async with AsyncClient(address, api_key=TENANT_KEYS["acme"]) as acme:

            async def one(i: int) -> None:
                while not stop.is_set() and time.monotonic() < deadline:
                    try:
                        await acme.evaluate(policy, "p", f"r{i}", timeout=60)
                    except CrossAuditError:  # refused (quota, deadline): keep the pressure on
                        await asyncio.sleep(0.05)

            await asyncio.gather(*(one(i) for i in range(clients)))

    asyncio.run(run())


async def _victim(address: str) -> list[float]:
    out = []
    async with AsyncClient(address, api_key=TENANT_KEYS["globex"]) as globex:
        for i in range(SAMPLES):
            t0 = time.perf_counter()
            await globex.evaluate("quick", "p", f"g{i}", timeout=60)
            out.append((time.perf_counter() - t0) * 1000)
    return out


def _phase(address: str, policy: str | None, clients: int) -> list[float]:
    if policy is None:
        return asyncio.run(_victim(address))
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_flood, args=(address, policy, clients, stop), daemon=True)
    proc.start()
    try:
        time.sleep(RAMP_S)
        return asyncio.run(_victim(address))
    finally:
        stop.set()
        proc.join(90)
        if proc.is_alive():
            proc.kill()
            proc.join(10)


def _server(tmp: Path, *extra: str) -> ServerProcess:
    srv = ServerProcess(tmp, extra=extra)
    srv.start()

    async def deploy() -> None:
        async with (
            AsyncClient(srv.address, api_key=TENANT_KEYS["acme"]) as acme,
            AsyncClient(srv.address, api_key=TENANT_KEYS["globex"]) as globex,
        ):
            await globex.deploy_policy(trivial("quick"), environment="production")
            await acme.deploy_policy(burner("burn", 0.5, evaluator="burner", rule="burned"), environment="production")
            await acme.deploy_policy(bulky(), environment="production")
            for _ in range(5):  # warm the sandboxes
                await globex.evaluate("quick", "p", "r", timeout=60)
            await acme.evaluate("burn", "p", "r", timeout=60)
            await acme.evaluate("bulky", "p", "r", timeout=60)

    asyncio.run(deploy())
    return srv


def main() -> None:
    cores = os.cpu_count() or 1
    print(f"another tenant's p50 (globex, {SAMPLES} sequential calls) beside acme's load; {cores} cores:")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            ("default", ()),
            (f"slots={2 * cores}", ("--set", f"limits.max_concurrent_evaluations={2 * cores}")),
        ]
        for label, extra in runs:
            srv = _server(Path(tmp) / label, *extra)
            try:
                idle = _phase(srv.address, None, 0)
                cpu = _phase(srv.address, "burn", FLOOD)
                phases = [("idle", idle), (f"cpu ({FLOOD} burning)", cpu)]
                if label == "default":
                    phases.append(
                        (
                            f"audit ({AUDIT_CLIENTS} at the per-decision cap)",
                            _phase(srv.address, "bulky", AUDIT_CLIENTS),
                        )
                    )
                base = statistics.median(idle)
                for name, lat in phases:
                    p50 = statistics.median(lat)
                    key = f"neighbours.{label}.{name.split()[0]}"
                    report.record(key, f"{label}: {name}", lat, sum(lat) / 1000, unit="calls/s", concurrency=1)
                    figures[key] = p50 / base
                    print(
                        f"  {label:10s} {name:40s} p50 {p50:8.1f} ms  p95 {report.percentile(lat, 0.95):8.1f} ms"
                        f"  {p50 / base:5.1f}x idle",
                        flush=True,
                    )
            finally:
                srv.stop()
    report.ratio("ratio.neighbours.cpu", figures["neighbours.default.cpu"])
    report.ratio("ratio.neighbours.audit", figures["neighbours.default.audit"])
    report.ratio(f"ratio.neighbours.cpu.slots{2 * cores}", figures[f"neighbours.slots={2 * cores}.cpu"])


if __name__ == "__main__":
    main()
