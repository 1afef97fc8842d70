"""The decision log's two costs (docs/evidence.md):

1. ``verify`` throughput: records per second that ``crossaudit audit verify`` checks (rows read,
   leaf documents rebuilt, leaves hashed, the tree rebuilt, each checkpoint's signature and root
   checked): ``--store`` on an SQLite store, its workers on every core (target: at least 50,000
   records/s); one process reading the same store (the work a server does to stream a log to
   ``verify``); and an exported bundle, offline.
2. The server CPU a decision costs with the log on, side by side with it off: two servers on
   the same machine, one with ``evidence.log=false``, loaded in alternating rounds by 16
   clients with the cached 10-rule policy; the figure is the server process's CPU seconds
   (user + system, from /proc) per decision, the median over the log-on rounds of each round's
   value divided by the mean of the log-off rounds around it. Target: at most 5% added.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from crossaudit.evidence.bundle import verify_bundle
from crossaudit.evidence.export import export_chunks
from crossaudit.evidence.notes import generate_private_pem, load_signing_key
from crossaudit.evidence.verify import ChunkVerifier
from crossaudit.governance.evidence import EvidenceLog, verify_store
from crossaudit.sdk.client import AsyncClient
from crossaudit.service.config import EvidenceConfig
from crossaudit.store import SQLiteStore
from tests.bench import report
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules
from tests.records import audit_record

RECORDS = 100_000
WRITERS = 64  # concurrent writers while filling the store (group commit batches them)
CHECKPOINT_EVERY = 1_000  # as the server's default evidence.checkpoint_every
CLIENTS = 16
ROUNDS = 5  # log-on rounds, each between two log-off rounds
ROUND_S = 3.0
WARMUP = 200
MAX_CALLS_PER_ROUND = 20_000
RESPONSES = [f"An ordinary answer number {i} about renewable energy and its trade-offs." for i in range(16)]


def _rules() -> list[dict]:
    """A 10-rule record's rules, as the service writes them (two evaluators each)."""
    return [
        {
            "rule": f"rule_{i}",
            "status": "pass",
            "passed": True,
            "score": 1.0,
            "threshold": 0.5,
            "action": None,
            "latency_ms": 0.4,
            "fallback_used": False,
            "reason": "",
            "evaluators": [
                {
                    "evaluator": "kw",
                    "kind": "custom",
                    "status": "ok",
                    "score": 1.0,
                    "latency_ms": 0.3,
                    "attempts": 1,
                    "cached": True,
                    "error_type": None,
                    "violations": 0,
                }
            ],
        }
        for i in range(10)
    ]


async def _fill(path: Path) -> EvidenceLog:
    store = SQLiteStore(path)
    key = load_signing_key(generate_private_pem(), "crossaudit", "bench")
    log = EvidenceLog(store, EvidenceConfig(), key=key)
    rules = _rules()
    receipt = {
        "format": "crossaudit.receipt/v1",
        "engine": {"name": "crossaudit", "version": "bench"},
        "evaluators": [{"rule": f"rule_{i}", "evaluator": "kw", "kind": "custom"} for i in range(10)],
    }
    done = 0

    async def writer(w: int) -> None:
        nonlocal done
        for i in range(w, RECORDS, WRITERS):
            await store.record_decision(
                audit_record(tenant="acme", rules=rules, receipt=receipt, created_at=1_000_000.0 + i), []
            )
            done += 1
            if done % CHECKPOINT_EVERY == 0:
                await log.checkpoint("acme")

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    await log.checkpoint("acme")
    return log


async def _verify_store(log: EvidenceLog) -> tuple[int, float, int]:
    verifier = EvidenceLog(log.store, EvidenceConfig(), key=None, trusted=log.trusted)
    t0 = time.perf_counter()
    checker = ChunkVerifier(verifier.trusted)
    async for chunk in verifier.read("acme", outside=True):
        checker.feed(chunk)
    r = checker.finish()
    assert r.ok, r.findings[:3]
    return r.records, time.perf_counter() - t0, r.checkpoints


def bench_verify(root: Path) -> None:
    t0 = time.perf_counter()
    log = asyncio.run(_fill(root / "log.sqlite"))
    print(
        f"  wrote {RECORDS:,} ten-rule records with checkpoints every {CHECKPOINT_EVERY:,} in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    n, took, cps = asyncio.run(_verify_store(log))
    print(
        f"  one process reading the store (what a server streams to verify): {n:,} records, {cps} checkpoints "
        f"in {took:.2f} s = {n / took:,.0f} records/s"
    )
    report.record(
        "evidence.verify.stream", "verify, one process", [took * 1000 / n] * n, took, unit="records", concurrency=1
    )
    t0 = time.perf_counter()
    r = verify_store(str(root / "log.sqlite"), "acme", log.trusted, "crossaudit", None)
    took = time.perf_counter() - t0
    assert r.ok and r.records == RECORDS, r.findings[:3]
    print(
        f"  audit verify --store (every core): {r.records:,} records in {took:.2f} s = "
        f"{r.records / took:,.0f} records/s"
    )
    cores = os.cpu_count() or 1
    per = [took * 1000 / r.records] * r.records
    report.record("evidence.verify.store", "audit verify --store", per, took, unit="records", concurrency=cores)

    async def chunks() -> list:
        return [c async for c in log.read("acme", details=True)]

    out = root / "bundle"
    export_chunks(asyncio.run(chunks()), out, log.key.public, log.trusted, False)  # type: ignore[union-attr]
    t0 = time.perf_counter()
    r = verify_bundle(out, log.trusted)
    took = time.perf_counter() - t0
    assert r.ok, r.findings[:3]
    print(f"  verify a bundle offline: {r.records:,} records in {took:.2f} s = {r.records / took:,.0f} records/s")
    report.record(
        "evidence.verify.bundle",
        "verify a bundle offline",
        [took * 1000 / r.records] * r.records,
        took,
        unit="records",
        concurrency=1,
    )
    asyncio.run(log.store.aclose())


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (and its reaped children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


async def _round(address: str, policy: str, pid: int) -> float:
    """CPU seconds of the server per decision over one round of CLIENTS concurrent callers."""
    async with AsyncClient(address, api_key=key("acme")) as c:
        stop = time.perf_counter() + ROUND_S
        per_client = MAX_CALLS_PER_ROUND // CLIENTS
        done = 0

        async def worker(w: int) -> None:
            nonlocal done
            for i in range(per_client):
                if time.perf_counter() > stop:
                    return
                await c.evaluate(policy, "p", RESPONSES[(w + i) % len(RESPONSES)], timeout=30)
                done += 1

        cpu0 = _cpu_s(pid)
        await asyncio.gather(*(worker(w) for w in range(CLIENTS)))
        return (_cpu_s(pid) - cpu0) / max(1, done)


async def _warm(address: str, policy: str) -> None:
    async with AsyncClient(address, api_key=key("acme")) as c:
        await c.deploy_policy(policy)
        for i in range(WARMUP):
            await c.evaluate("ten-rules-cached", "p", RESPONSES[i % len(RESPONSES)], timeout=30)


def bench_cpu(root: Path) -> None:
    policy = ten_rules(cached=True)
    on = ServerProcess(root / "on")
    off = ServerProcess(root / "off", extra=("--set", "evidence.log=false"))
    on.start()
    off.start()
    try:
        for srv in (off, on):
            asyncio.run(_warm(srv.address, policy))
        servers = {"off": off, "on": on}
        per: dict[str, list[float]] = {"off": [], "on": []}
        for mode in ["off", "on"] * ROUNDS + ["off"]:
            srv = servers[mode]
            assert srv.proc is not None
            per[mode].append(asyncio.run(_round(srv.address, "ten-rules-cached", srv.proc.pid)))
    finally:
        on.stop()
        off.stop()
    o, n = per["off"], per["on"]
    paired = [n[i] / ((o[i] + o[i + 1]) / 2) for i in range(len(n))]
    print(
        f"  server CPU per decision, log off: {statistics.median(o) * 1e3:.3f} ms, log on: "
        f"{statistics.median(n) * 1e3:.3f} ms"
    )
    print(
        f"  per round, log on / its neighbouring log-off rounds: {', '.join(f'{r:.3f}' for r in paired)} "
        f"(median {statistics.median(paired):.3f}x)"
    )
    report.ratio("ratio.evidence.cpu", statistics.median(paired))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-evidence-"))
    bench_verify(root)
    bench_cpu(root)


if __name__ == "__main__":
    main()
