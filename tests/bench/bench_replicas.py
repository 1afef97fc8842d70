"""Decisions/s with 1, 2 and 3 replicas sharing one PostgreSQL, next to one replica on SQLite.

Same run, same 10-rule policy with cached evaluator results (so what is measured is the service,
the engine and the store, not the sandbox), clients spread over the replicas with gRPC's
round_robin. Also prints PostgreSQL's commits and inserted rows per decision (pg_stat_database
deltas), for the capacity model in docs/capacity.md, and how long a deploy on one replica takes
to be served by another. On a 2-core machine every replica, the
clients and PostgreSQL share the same two cores, so more replicas cannot add throughput here:
the ceiling is the CPU, and the figures show the cost of sharing state, not a scale-out.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from crossaudit.sdk.client import AsyncClient
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules
from tests.pgserver import PgServer, binaries

CLIENTS = 16
WARMUP = 50
DURATION_S = 8.0
MAX_CALLS = 20_000  # bound per level
RESPONSE = "A perfectly ordinary answer about renewable energy sources and their trade-offs."


def _pg_counters(url: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]), int(row[1])


async def _load(target: str) -> tuple[int, float, float]:
    """(decisions, seconds, p50 ms) of CLIENTS concurrent callers for DURATION_S."""
    latencies: list[float] = []
    async with AsyncClient(target, api_key=key("acme")) as c:
        for _ in range(WARMUP):
            await c.evaluate("ten-rules-cached", "p", RESPONSE, timeout=10)
        stop = time.perf_counter() + DURATION_S
        per_client = MAX_CALLS // CLIENTS

        async def worker() -> None:
            for _ in range(per_client):
                if time.perf_counter() > stop:
                    return
                t0 = time.perf_counter()
                await c.evaluate("ten-rules-cached", "p", RESPONSE, timeout=10)
                latencies.append((time.perf_counter() - t0) * 1000)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
        wall = time.perf_counter() - t0
    return len(latencies), wall, statistics.median(latencies)


def main() -> None:
    if binaries() is None:
        print("PostgreSQL is not installed (make postgres): skipped")
        return
    root = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    pg = PgServer().start()
    rows: list[tuple[str, float, float, str]] = []
    propagation: list[float] = []
    try:
        sqlite = ServerProcess(root / "sqlite")
        sqlite.start()
        try:
            asyncio.run(_deploy(sqlite.address))
            n, wall, p50 = asyncio.run(_load(sqlite.address))
            rows.append(("1 replica, SQLite", n / wall, p50, "-"))
        finally:
            sqlite.stop()
        url = pg.database()
        servers: list[ServerProcess] = []
        try:
            for count in (1, 2, 3):
                while len(servers) < count:
                    s = ServerProcess(root / f"pg{len(servers)}", extra=("--store", url))
                    s.start()
                    servers.append(s)
                if count == 1:
                    asyncio.run(_deploy(servers[0].address))
                if count == 3:
                    propagation = asyncio.run(_propagation(servers[0].address, servers[2].address))
                target = ",".join(s.address for s in servers)
                commits0, rows0 = _pg_counters(url)
                n, wall, p50 = asyncio.run(_load(target))
                commits1, rows1 = _pg_counters(url)
                per = f"{(commits1 - commits0) / n:.2f} commits, {(rows1 - rows0) / n:.2f} rows"
                rows.append((f"{count} replica(s), PostgreSQL", n / wall, p50, per))
        finally:
            for s in servers:
                s.stop()
    finally:
        pg.stop()
    base = rows[0][1]
    print(
        f"deploy on replica A -> served by replica C after: {', '.join(f'{t * 1000:.0f} ms' for t in propagation)}"
        " (bound: deployment_recheck_s = 1 s)"
    )
    print(f"{CLIENTS} clients, {DURATION_S:g} s per level, 10-rule policy, cached evaluator results")
    print(f"{'setup':<28} {'decisions/s':>12} {'vs SQLite':>10} {'p50 ms':>8}  PostgreSQL per decision")
    for name, rate, p50, per in rows:
        print(f"{name:<28} {rate:>12.0f} {rate / base:>9.2f}x {p50:>8.2f}  {per}")


async def _propagation(first: str, other: str, rounds: int = 5) -> list[float]:
    """Seconds from a deploy answered by ``first`` until ``other`` serves the new version."""
    out = []
    async with AsyncClient(first, api_key=key("acme")) as a, AsyncClient(other, api_key=key("acme")) as b:
        for r in range(rounds):
            policy = ten_rules(cached=True).replace('version: "1.0"', f'version: "2.{r}"')
            await a.deploy_policy(policy)
            t0 = time.perf_counter()
            for _ in range(1000):  # bounded: 10 s at most
                d = await b.evaluate("ten-rules-cached", "p", RESPONSE, timeout=10)
                if d.policy_version == f"2.{r}":
                    break
                await asyncio.sleep(0.01)
            out.append(time.perf_counter() - t0)
    return out


async def _deploy(address: str) -> None:
    async with AsyncClient(address, api_key=key("acme")) as c:
        await c.deploy_policy(ten_rules(cached=True))


if __name__ == "__main__":
    main()
