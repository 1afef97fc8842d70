"""Retained inputs (docs/retention.md): what sealing adds to recording a decision, and how fast
replay can read retained decisions back, on SQLite and on PostgreSQL.

Recording: the same decision (3 KB of text, six evaluator results, three context fields) is
recorded with and without its sealed inputs, alternating, one at a time, so both sides see the
same machine; the ratio retained / not retained of the p50 is printed. Reading:
``Retention.load`` in batches of ``retention.max_load_ids``, decisions per second (the replay
target is 2,000 retained decisions per second with nothing re-run).
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from crossaudit.api.records import AuditRecord
from crossaudit.governance.retention import Retention
from crossaudit.governance.vault import OperatorKey, OperatorKeys
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.service.config import RetentionConfig
from crossaudit.service.grants import TenantGrants
from crossaudit.store import SQLiteStore
from crossaudit.store.base import Store, audit_size
from orchestrator.policy import load_policy
from tests.bench import report
from tests.pgserver import PgServer, binaries
from tests.records import audit_record

DECISIONS = 2_000
POLICY = load_policy('name: p\ndescription: d\nversion: "1.0"\n')
PROMPT, RESPONSE = "p" * 1_000, "r" * 2_000
CONTEXT = {"user_id": "u-1", "team": "payments", "n": 3}


def _decision(decision_id: str) -> Decision:
    rules = [
        RuleResult(
            rule=f"r{i}",
            status=Status.PASS,
            passed=True,
            score=0.9,
            threshold=0.5,
            evaluators=[EvaluatorResult(evaluator=f"e{i}", status=Status.PASS, score=0.9, identity=f"{i:064x}")],
        )
        for i in range(6)
    ]
    return Decision(
        policy="p", policy_version="1.0", passed=True, action=Action.ALLOW, rules=rules, decision_id=decision_id
    )


def _audit(decision_id: str, now: float) -> AuditRecord:
    return audit_record(
        decision_id,
        "acme",
        passed=True,
        action="allow",
        rules=[{"rule": f"r{i}", "status": "pass"} for i in range(6)],
        prompt_sha256=sha256_text(PROMPT),
        response_sha256=sha256_text(RESPONSE),
        context_sha256=sha256_text("{}"),
        created_at=now,
    )


async def _run(backend: str, open_store: Callable[[], Store]) -> None:
    store = open_store()
    keys = OperatorKeys(OperatorKey.parse(base64.b64encode(os.urandom(32)).decode(), "bench"))
    config = RetentionConfig()
    ret = Retention(store, TenantGrants(retention={"acme": 86_400.0}), config, keys=keys)
    try:
        plain: list[float] = []
        sealed: list[float] = []
        ids: list[str] = []
        wall = {"plain": 0.0, "sealed": 0.0}
        for i in range(DECISIONS):
            for kind in ("plain", "sealed"):
                decision_id = f"{kind}-{i}"
                t0 = time.perf_counter()
                now = time.time()
                rec = _audit(decision_id, now)
                retained = None
                if kind == "sealed":
                    retained = await ret.seal(
                        "acme", POLICY, _decision(decision_id), "production", PROMPT, RESPONSE, CONTEXT,
                        stage="", now=now,
                    )  # fmt: skip
                    assert retained is not None
                    rec = AuditRecord(**{**rec.__dict__, "inputs_retained_until": retained.expires_at})
                size = audit_size(rec) + (retained.size if retained else 0)
                await store.record_decision(rec, [], audit_bytes=size, retained=retained)
                took = time.perf_counter() - t0
                wall[kind] += took
                (sealed if kind == "sealed" else plain).append(took * 1000)
                if kind == "sealed":
                    ids.append(decision_id)
        report.record(f"retention.record.plain.{backend}", f"record, not retained ({backend})", plain,
                      wall["plain"], unit="decisions/s", concurrency=1, group="retention")  # fmt: skip
        report.record(f"retention.record.sealed.{backend}", f"record, inputs retained ({backend})", sealed,
                      wall["sealed"], unit="decisions/s", concurrency=1, group="retention")  # fmt: skip
        ratio = report.percentile(sealed, 0.5) / report.percentile(plain, 0.5)
        report.ratio(f"ratio.retention.record.{backend}", ratio)
        print(
            f"  {backend:10s} record p50: {report.percentile(plain, 0.5):.3f} ms plain, "
            f"{report.percentile(sealed, 0.5):.3f} ms retained ({ratio:.2f}x)",
            flush=True,
        )
        batch = config.max_load_ids
        latencies: list[float] = []
        t0 = time.perf_counter()
        for start in range(0, len(ids), batch):
            t1 = time.perf_counter()
            got = await ret.load("acme", ids[start : start + batch])
            assert len(got) == len(ids[start : start + batch])
            latencies.append((time.perf_counter() - t1) * 1000)
        loaded = time.perf_counter() - t0
        report.record(f"retention.load.{backend}", f"Retention.load, {batch} per call ({backend})", latencies,
                      loaded, unit="calls/s", concurrency=1, group="retention")  # fmt: skip
        print(f"  {backend:10s} load: {len(ids) / loaded:,.0f} decisions/s in batches of {batch}", flush=True)
    finally:
        await store.aclose()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_run("sqlite", lambda: SQLiteStore(Path(tmp) / "bench.db")))
    if binaries() is None:
        print("  postgresql: not installed, skipped")
        return
    from crossaudit.store.postgres import PostgresStore

    pg = PgServer()
    pg.start()
    try:
        url = pg.database()
        asyncio.run(_run("postgresql", lambda: PostgresStore(url)))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
