"""``crossaudit eval`` throughput: 10,000 labelled rows through a 10-rule policy of deterministic
custom evaluators (tests/e2e/policies.py ``ten_rules``), in-process as the CLI runs them
(PolicyTester, the process sandbox, the engine's batching and deadlines), measures included
(confusion matrices, 1,000 bootstrap resamples per metric, sweeps). Prints rows/s beside the
target (>= 1,000 rows/s); asserts nothing.

Two scenarios: the policy as written (every evaluator call runs in the sandbox) and with the
engine's result cache on (``cache_results``: deterministic evaluators, repeated texts answered
from the cache, as a server with the setting does). Then, only when a Detoxify model can be
built and served here (onnxruntime, tokenizers and the export extra: torch, transformers,
detoxify, onnx), the same rows through a policy with the ONNX Detoxify builtin beside the model
server's own batched figure; otherwise it says that part was skipped, and why.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench import report
from tests.e2e.policies import ten_rules

ROWS = int(os.environ.get("CROSSAUDIT_BENCH_EVAL_ROWS", "10000"))
DISTINCT = 500  # distinct responses cycled over the rows (the cache scenario's hit rate follows)
CONCURRENCY = 16
MODEL_CALLS = 400  # the model server's batched figure: this many calls at CONCURRENCY
TARGET_ROWS_PER_S = 1000  # = the eval.custom.cached target of tests/bench/report.py


def _rows() -> list[Any]:
    from crossaudit.evals.dataset import Row

    out = []
    for i in range(ROWS):
        bad = i % DISTINCT % 5 == 0
        response = f"answer {i % DISTINCT}: " + ("a forbidden word" if bad else "all fine") + " here"
        noisy = i % 97 == 0  # a few labels disagree with the evaluators: metrics below 1
        rules = {f"rule_{k}": (not (bad ^ noisy) if k % 2 else True) for k in range(10)}
        out.append(Row(i + 1, f"r{i}", "q", response, {}, not (bad ^ noisy), None, rules, {}, "bench"))
    return out


def _measure(name: str, label: str, policy: str, rows: list[Any]) -> float:
    from crossaudit.evals.report import build_report
    from crossaudit.evals.runner import LLMUsage, run_local
    from crossaudit.sdk import PolicyTester

    usage = LLMUsage()
    with PolicyTester(policy, sandbox="process", llm_usage=usage) as tester:
        tester.evaluate("warm", "up")
        t0 = time.perf_counter()
        run = run_local(tester, rows, usage=usage, concurrency=CONCURRENCY)
        evaluated = time.perf_counter() - t0
    t1 = time.perf_counter()
    rep = build_report(run, seed=0)
    measured = time.perf_counter() - t1
    wall = evaluated + measured
    errors = len(rep.errors) + sum(s.unjudged for s in rep.subjects.values())
    latencies = [o.latency_ms for o in run.outcomes]
    s = report.record(name, label, latencies, wall, unit="rows/s", concurrency=CONCURRENCY, group="eval")
    f1 = rep.subjects["rule_1"].metrics["f1"].value
    print(f"  {label}: {len(rows):,} rows in {wall:.2f}s (evaluation {evaluated:.2f}s, measures {measured:.2f}s): "
          f"{s.throughput:,.0f} rows/s (target >= {TARGET_ROWS_PER_S:,}); p50 {s.p50_ms:.2f} ms per row; "
          f"{errors} unjudged/errored; rule_1 F1 {f1:.3f}")
    return s.throughput


def _detoxify_missing() -> str | None:
    wanted = ("onnxruntime", "tokenizers", "torch", "transformers", "detoxify", "onnx")
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        return (f"{', '.join(missing)} not installed here (make models export-deps): no Detoxify model can be "
                "built and served locally, and none is downloaded")
    return None


async def _server_batched(checkpoint: str) -> float:
    from crossaudit.modelserver.pool import ModelServerPool

    pool = ModelServerPool()
    cfg = {"model": "detoxify", "checkpoint": checkpoint, "categories": []}
    try:
        await pool.analyze("detoxify", cfg, "", "warm up", timeout=600)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(i: int) -> None:
            async with sem:
                await pool.analyze("detoxify", cfg, "", f"answer {i % DISTINCT}: all fine here", timeout=120)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(MODEL_CALLS)))
        return MODEL_CALLS / (time.perf_counter() - t0)
    finally:
        await pool.aclose()


def _detoxify(rows: list[Any]) -> None:
    why = _detoxify_missing()
    if why:
        print(f"  ONNX Detoxify: skipped: {why}")
        return
    from crossaudit.modelserver.export import export_detoxify
    from crossaudit.modelserver.testing import build_tiny_detoxify

    with tempfile.TemporaryDirectory(prefix="ca-bench-eval-") as tmp:
        tiny = build_tiny_detoxify(Path(tmp) / "ckpt")
        export = export_detoxify(tiny.checkpoint, tiny.config_dir, Path(tmp) / "onnx")
        policy = f"""
name: detoxify-eval
description: one builtin rule
version: "1.0"
evaluators:
  - name: tox
    type: builtin
    config: {{model: detoxify, checkpoint: {export.directory}, categories: [toxicity]}}
rules:
  - name: rule_1
    evaluator: tox
    threshold: 0.5
    action: flag
"""
        server = asyncio.run(_server_batched(str(export.directory)))
        subset = [r.__class__(**{**r.__dict__, "rules": {"rule_1": r.rules["rule_1"]}}) for r in rows[: ROWS // 10]]
        measured = _measure("eval.detoxify", "ONNX Detoxify builtin (tiny model)", policy, subset)
        print(f"  model server batched, {CONCURRENCY} concurrent: {server:,.0f} calls/s; eval {measured:,.0f} rows/s "
              f"({measured / server:.2f}x)")


def main() -> None:
    rows = _rows()
    print(f"{ROWS:,} rows ({DISTINCT} distinct responses), 10 rules over 2 custom evaluators, process sandbox, "
          f"{CONCURRENCY} in flight; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    _measure("eval.custom", "custom evaluators, every call run", ten_rules(), rows)
    _measure("eval.custom.cached", "custom evaluators, engine cache on", ten_rules(cached=True), rows)
    _detoxify(rows)


if __name__ == "__main__":
    main()
