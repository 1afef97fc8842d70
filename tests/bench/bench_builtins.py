"""Builtins at bert-base size: torch in-process vs the model server (ONNX + micro-batching), and a
toxicity + PII + language decision at an open-loop 10 requests/s. Side by side in one run.

Part 1 builds a bert-base-sized Detoxify checkpoint (12 layers, hidden 768, 12 heads, intermediate
3072: Detoxify ``original``'s shape, random weights, so accuracy is meaningless and speed is real),
exports it to ONNX (fp32 + int8) with :func:`crossaudit.modelserver.export.export_detoxify`, then
drives three sides at concurrency 1, 8 and 32, one text per call:

- torch in-process: ``detoxify.Detoxify`` from the checkpoint, called directly from N threads
  (the baseline issue 9 measured: every call its own forward pass);
- the model server serving the fp32 export through the real pool (gRPC over a unix socket) with
  its default micro-batching (``BatchLimits``), and the same for the int8 export.

Sides alternate in rounds at each level so that load from other jobs hits all of them alike. Part 2
runs a policy with detoxify (ONNX via the model server), presidio (pattern entities, blank
pipeline: no spaCy model) and langdetect through the Engine and the model-server pool, requests
sent on a fixed schedule (open loop, latency counted from the scheduled send, so a backlog shows).

Every loop is bounded in count and time. Targets are printed as ratios; nothing is asserted.
Results also go to ``results.json`` in a temp directory named in the output (and one JSON line).
``CROSSAUDIT_BENCH_TINY=1``: a 2-layer model, for a quick dry run of the harness only.
``CROSSAUDIT_BENCH_SCALE``: multiplies the call counts and durations (default 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

SCALE = float(os.environ.get("CROSSAUDIT_BENCH_SCALE", "1"))
TINY = os.environ.get("CROSSAUDIT_BENCH_TINY") == "1"
CONCURRENCY = (1, 8, 32)
TEXTS = {1: 40, 8: 128, 32: 192}  # per side and level, split over ROUNDS
ROUNDS = 2
ROUND_BUDGET_S = 20.0 * SCALE  # no new call starts after this, per side and round
CALL_TIMEOUT_S = 60.0
RATE = 10.0  # part 2: requests/s, open loop
DURATION_S = 30.0 * SCALE
DECISION_TIMEOUT_S = 10.0
TARGET_TPS_RATIO = 3.0  # server texts/s at concurrency 8 >= 3x torch in-process
TARGET_P50_RATIO = 0.6  # server single-call p50 <= 0.6x torch in-process
TARGET_DECISION_P50_MS, TARGET_DECISION_P95_MS = 60.0, 150.0
# Detoxify ``original``'s shape (bert-base); ``build_tiny_detoxify`` fills it with random weights.
BERT_BASE_SHAPE = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072}

# Realistic chat-answer lengths (about 15-45 words); the random-weight model's tiny vocabulary
# maps unknown words to [UNK], one token per word or punctuation mark.
SAMPLES = (
    "Thanks for reaching out! Your order shipped yesterday and should arrive within three business days.",
    "Honestly, you are an idiot if you think this will be refunded, and I hate dealing with people like you.",
    "Renewable energy sources such as wind and solar have become cheaper than coal in most markets, although "
    "storage and grid upgrades remain expensive and slow to build.",
    "Sure, here is a short summary of the meeting: the budget was approved, the launch moves to May, and the "
    "design review is next week.",
    "I cannot help with that request, but I can point you to the official documentation for the feature.",
    "What a nice day! Hello world, this is a good example of a friendly reply that says thank you twice, thank you.",
    "The function returns None when the list is empty; otherwise it returns the first element whose score is "
    "above the threshold, or raises ValueError if the threshold is negative, which callers must handle.",
    "Please stop sending me these messages, they are bad and you are wasting everyone's time here.",
)
DECISION_RESPONSES = (
    *SAMPLES[:4],
    "Contact John at john@example.com, SSN 219-09-9999, card 4111 1111 1111 1111, for the refund.",
    "Eres una persona horrible y nadie quiere hablar contigo nunca más, de verdad.",
    "Ceci est une réponse en français, polie et utile, sur la météo de demain à Paris.",
    SAMPLES[6],
)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _load() -> str:
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg()) + f" (1/5/15 min, {os.cpu_count()} cores)"


# --- part 1: detoxify, three sides -----------------------------------------------------------


class Side:
    """One way of scoring a text, with the latencies and wall time it accumulated per level."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.lat: dict[int, list[float]] = {}
        self.wall: dict[int, float] = {}
        self.errors: dict[int, int] = {}

    def add(self, c: int, lat: list[float], wall: float, errors: int) -> None:
        self.lat.setdefault(c, []).extend(lat)
        self.wall[c] = self.wall.get(c, 0.0) + wall
        self.errors[c] = self.errors.get(c, 0) + errors

    def tps(self, c: int) -> float:
        return len(self.lat[c]) / self.wall[c] if self.wall.get(c) else 0.0

    def summary(self, c: int) -> dict[str, float]:
        xs = self.lat.get(c, [])
        return {"p50_ms": round(statistics.median(xs), 2) if xs else float("nan"),
                "p99_ms": round(_pct(xs, 0.99), 2), "texts_per_s": round(self.tps(c), 2), "n": len(xs),
                "errors": self.errors.get(c, 0)}


def _threads(
    call: Callable[[str], Any], concurrency: int, total: int, budget_s: float
) -> tuple[list[float], float, int]:
    """``concurrency`` threads share ``total`` calls; none starts after ``budget_s``."""
    lock = threading.Lock()
    issued, errors, lat = [0], [0], []
    t0 = time.perf_counter()
    stop = t0 + budget_s

    def worker() -> None:
        while True:
            with lock:
                if issued[0] >= total or time.perf_counter() > stop:
                    return
                i = issued[0]
                issued[0] += 1
            s = time.perf_counter()
            try:
                call(SAMPLES[i % len(SAMPLES)])
            except Exception:
                errors[0] += 1
                continue
            lat.append((time.perf_counter() - s) * 1000)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=budget_s + CALL_TIMEOUT_S)
    return lat, time.perf_counter() - t0, errors[0]


async def _tasks(
    call: Callable[[str], Awaitable[Any]], concurrency: int, total: int, budget_s: float
) -> tuple[list[float], float, int]:
    """The asyncio twin of :func:`_threads`: the same work shape, against the model server."""
    issued, errors, lat = [0], [0], []
    t0 = time.perf_counter()
    stop = t0 + budget_s

    async def worker() -> None:
        while issued[0] < total and time.perf_counter() <= stop:
            i = issued[0]
            issued[0] += 1
            s = time.perf_counter()
            try:
                await call(SAMPLES[i % len(SAMPLES)])
            except Exception:
                errors[0] += 1
                continue
            lat.append((time.perf_counter() - s) * 1000)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), budget_s + 2 * CALL_TIMEOUT_S)
    return lat, time.perf_counter() - t0, errors[0]


def _diagnostics(torch_model: Any, export_dir: str) -> dict[str, dict[str, float]]:
    """Compute alone, no server and no concurrency: one text, and the 8 samples as one padded batch.

    Separates what the server adds (batch wait, gRPC hop) from what ONNX Runtime itself costs, and
    shows the batched ceiling each engine reaches on this CPU (texts/s of one batch of 8).
    """
    from crossaudit.modelserver.builtins.detoxify import _OnnxDetoxify

    engines: dict[str, Any] = {"torch": torch_model}
    for precision in ("fp32", "int8"):
        engines[f"onnx {precision}"] = _OnnxDetoxify.load(export_dir, precision)
    out: dict[str, dict[str, float]] = {}
    for label, engine in engines.items():
        engine.predict([SAMPLES[0]])  # first-call allocations
        single = []
        for i in range(16):
            t0 = time.perf_counter()
            engine.predict([SAMPLES[i % len(SAMPLES)]] if label != "torch" else SAMPLES[i % len(SAMPLES)])
            single.append((time.perf_counter() - t0) * 1000)
        batch = []
        for _ in range(4):
            t0 = time.perf_counter()
            engine.predict(list(SAMPLES))
            batch.append((time.perf_counter() - t0) * 1000)
        b = statistics.median(batch)
        out[label] = {"single_p50_ms": round(statistics.median(single), 2), "batch8_p50_ms": round(b, 2),
                      "batch8_texts_per_s": round(8000 / b, 1)}
    return out


async def _part1(model: Any, export_dir: str) -> tuple[list[Side], dict[str, Any]]:
    from crossaudit.modelserver.pool import ModelServerPool

    torch_side, fp32, int8 = Side("torch in-process"), Side("server ONNX fp32"), Side("server ONNX int8")
    pool = ModelServerPool()
    cfgs = {s.label: {"model": "detoxify", "checkpoint": export_dir, "precision": p, "categories": []}
            for s, p in ((fp32, "fp32"), (int8, "int8"))}

    def server_call(label: str) -> Callable[[str], Awaitable[Any]]:
        return lambda text: pool.analyze("detoxify", cfgs[label], "", text, timeout=CALL_TIMEOUT_S)

    try:
        t0 = time.perf_counter()
        await pool.analyze("detoxify", cfgs[fp32.label], "", SAMPLES[0], timeout=180)
        await pool.analyze("detoxify", cfgs[int8.label], "", SAMPLES[0], timeout=180)
        print(f"model server start + load of both exports: {time.perf_counter() - t0:.1f} s")
        for side in (fp32, int8):  # warm: first calls and first batch shapes
            await _tasks(server_call(side.label), 8, 16, 30)
        await asyncio.to_thread(_threads, model.predict, 2, 4, 30)
        for c in CONCURRENCY:
            per_round = max(c, TEXTS[c] // ROUNDS)
            for _ in range(ROUNDS):
                torch_side.add(c, *await asyncio.to_thread(_threads, model.predict, c, per_round, ROUND_BUDGET_S))
                for side in (fp32, int8):
                    side.add(c, *await _tasks(server_call(side.label), c, per_round, ROUND_BUDGET_S))
            print(f"  concurrency {c} done; {_load()}", flush=True)
        health = await pool.health("detoxify")
    finally:
        await pool.aclose()
    return [torch_side, fp32, int8], health


# --- part 2: a decision with three builtins -----------------------------------------------------

POLICY = """\
name: builtins-bench
description: toxicity, PII and language together, no LLM
version: "1.0"
evaluators:
  - name: toxicity
    type: builtin
    config: {{model: detoxify, checkpoint: {checkpoint}, precision: {precision}, categories: [toxicity]}}
  - name: pii
    type: builtin
    config: {{model: presidio, entities: [EMAIL, SSN, CREDIT_CARD]}}
  - name: language
    type: builtin
    config: {{model: langdetect}}
rules:
  - {{name: toxicity, evaluator: toxicity, threshold: 0.5, action: warn}}
  - {{name: pii, evaluator: pii, threshold: 0.8, action: modify, action_config: {{strategy: redact}}}}
  - {{name: language, evaluator: language, threshold: 0.5, action: continue}}
"""


async def _part2(export_dir: str, store: str, precisions: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    from crossaudit.modelserver.pool import ModelServerPool
    from orchestrator.engine.engine import Engine
    from orchestrator.policy import load_policy
    from orchestrator.runtime import Runtime, make_sandbox

    # No spaCy pipeline anywhere (an empty model store, offline): presidio serves its pattern entities.
    env = {"PATH": os.environ.get("PATH", ""), "HF_HUB_OFFLINE": "1", "CROSSAUDIT_MODEL_STORE": store}
    pool = ModelServerPool()
    sandbox = make_sandbox("process")
    engine = Engine(Runtime(sandbox, env=env, model_backend=pool))
    out: dict[str, dict[str, Any]] = {}
    try:
        for precision in precisions:
            policy = load_policy(POLICY.format(checkpoint=json.dumps(export_dir), precision=precision), env=env)
            t0 = time.perf_counter()
            for i in range(8):  # warm-up: starts the three servers and loads the models, sequentially
                d = await engine.evaluate(policy, "q", DECISION_RESPONSES[i % len(DECISION_RESPONSES)], {},
                                          timeout=180)
            if d.errored_rules:  # the harness must work before it is timed (not a speed check)
                raise RuntimeError(f"warm-up decision errored: {d.errored_rules}: {d.rules}")
            print(f"  [{precision}] servers warm in {time.perf_counter() - t0:.1f} s; sending {RATE:.0f}/s "
                  f"for {DURATION_S:.0f} s", flush=True)
            load_before = os.getloadavg()[0]
            out[precision] = await _open_loop(engine, policy)
            out[precision]["load1"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        out["_batches"] = {"detoxify": (await pool.health("detoxify"))["batch_sizes"],
                           "presidio": (await pool.health("presidio"))["batch_sizes"]}
    finally:
        await engine.aclose()
        await sandbox.aclose()
        await pool.aclose()
    return out


async def _open_loop(engine: Any, policy: Any) -> dict[str, Any]:
    """Send ``RATE`` decisions a second for ``DURATION_S`` on a fixed schedule, whatever the answers' pace."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    evaluator_ms: dict[str, list[float]] = {}
    errors = [0]

    async def one(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        try:
            d = await engine.evaluate(policy, "q", DECISION_RESPONSES[i % len(DECISION_RESPONSES)], {},
                                      timeout=DECISION_TIMEOUT_S)
        except Exception:
            errors[0] += 1
            return
        lat.append((loop.time() - at) * 1000)  # from the scheduled send: a backlog counts
        errors[0] += bool(d.errored_rules)
        for r in d.rules:
            for e in r.evaluators:
                evaluator_ms.setdefault(r.rule, []).append(e.latency_ms)

    n = int(RATE * DURATION_S)
    start = loop.time() + 0.1
    await asyncio.wait_for(asyncio.gather(*(one(i, start + i / RATE) for i in range(n))),
                           DURATION_S + DECISION_TIMEOUT_S + 30)
    return {
        "p50_ms": round(statistics.median(lat), 2) if lat else float("nan"),
        "p95_ms": round(_pct(lat, 0.95), 2), "p99_ms": round(_pct(lat, 0.99), 2),
        "max_ms": round(max(lat, default=float("nan")), 2), "n": len(lat), "errors": errors[0],
        "evaluator_p50_ms": {k: round(statistics.median(v), 2) for k, v in evaluator_ms.items()},
        "evaluator_p95_ms": {k: round(_pct(v, 0.95), 2) for k, v in evaluator_ms.items()},
    }


# --- main -----------------------------------------------------------------------------------------


def _ratio(value: float, target: float, better: str) -> str:
    met = value >= target if better == "higher" else value <= target
    return f"{value:.2f}x (target {'>=' if better == 'higher' else '<='} {target}x: {'met' if met else 'MISSED'})"


def main() -> None:
    from crossaudit.modelserver.builtins.detoxify import _import_detoxify
    from crossaudit.modelserver.export import export_detoxify
    from crossaudit.modelserver.testing import build_tiny_detoxify

    results: dict[str, Any] = {"load_start": os.getloadavg(), "cores": os.cpu_count(), "tiny": TINY}
    print(_load())
    with tempfile.TemporaryDirectory(prefix="ca-bench-builtins-models-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        shape: dict[str, Any] = {} if TINY else dict(BERT_BASE_SHAPE)
        tiny = build_tiny_detoxify(root / "ckpt", **shape)
        print(f"built {'a 2-layer' if TINY else 'a bert-base-sized'} Detoxify checkpoint "
              f"({os.path.getsize(tiny.checkpoint) / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        export = export_detoxify(tiny.checkpoint, tiny.config_dir, root / "onnx")
        sizes = ", ".join(f"{k} {os.path.getsize(v) / 1e6:.0f} MB" for k, v in export.files.items())
        print(f"exported to ONNX ({sizes}) in {time.perf_counter() - t0:.1f} s")

        import torch
        from tokenizers import Tokenizer

        dd = _import_detoxify()  # detoxify's own loader, reading the local HF directory (no hub)
        model = dd.Detoxify("original", checkpoint=tiny.checkpoint, huggingface_config_path=tiny.config_dir)
        print(f"torch in-process: detoxify.Detoxify, torch {torch.__version__}, {torch.get_num_threads()} intra-op "
              f"threads; server: default ModelServerLimits (2 workers, BatchLimits max 16 / 5 ms)")
        tok = Tokenizer.from_file(os.path.join(export.directory, "tokenizer.json"))
        lengths = [len(tok.encode(t).ids) for t in SAMPLES]  # one by one: a batch pads
        print(f"texts: {len(SAMPLES)} samples cycled, {min(lengths)}-{max(lengths)} tokens "
              f"(mean {statistics.mean(lengths):.0f})")
        print("\n[0] compute alone (this process, sequential, no server): p50 ms")
        diag = _diagnostics(model, export.directory)
        results["compute_alone"] = diag
        for label, m in diag.items():
            print(f"  {label:<10} one text {m['single_p50_ms']:7.1f}   batch of 8 {m['batch8_p50_ms']:7.1f} "
                  f"= {m['batch8_texts_per_s']:5.1f} texts/s")
        print(f"  {_load()}")
        print("\n[1] Detoxify, one text per call: torch in-process vs model server (ONNX + micro-batching)")
        sides, health = asyncio.run(_part1(model, export.directory))
        del model
        results["detoxify"] = {s.label: {str(c): s.summary(c) for c in CONCURRENCY} for s in sides}
        results["detoxify_server_batches"] = health["batch_sizes"]
        print(f"\n  {'side':<18} {'conc':>4} {'p50 ms':>9} {'p99 ms':>9} {'texts/s':>9} {'n':>5} {'err':>4}")
        for c in CONCURRENCY:
            for s in sides:
                m = s.summary(c)
                print(f"  {s.label:<18} {c:>4} {m['p50_ms']:>9.1f} {m['p99_ms']:>9.1f} {m['texts_per_s']:>9.1f} "
                      f"{m['n']:>5} {m['errors']:>4}")
        print(f"  server batch sizes (size: batches): {health['batch_sizes']}")
        torch_side = sides[0]
        targets: dict[str, Any] = {}
        print("\n  targets:")
        for s in sides[1:]:
            tps = s.tps(8) / (torch_side.tps(8) or float("nan"))  # nan, not a crash, if a side all failed
            p50 = s.summary(1)["p50_ms"] / (torch_side.summary(1)["p50_ms"] or float("nan"))
            targets[s.label] = {"tps_ratio_c8": round(tps, 2), "p50_ratio_c1": round(p50, 2)}
            print(f"  {s.label}: texts/s at concurrency 8 vs torch {_ratio(tps, TARGET_TPS_RATIO, 'higher')}; "
                  f"p50 at concurrency 1 vs torch {_ratio(p50, TARGET_P50_RATIO, 'lower')}")
        results["detoxify_targets"] = targets
        print(f"  {_load()}")

        print(f"\n[2] {_load()}; (part 1's own threads raise the 1-minute figure for a while)")
        print(f"[2] decision: detoxify (ONNX, model server) + presidio (EMAIL, SSN, CREDIT_CARD; no spaCy model) + "
              f"langdetect, no LLM, open loop {RATE:.0f} requests/s")
        decisions = asyncio.run(_part2(export.directory, str(root / "store"), ("fp32", "int8")))
        batches = decisions.pop("_batches")
        results["decision"] = decisions
        results["decision_server_batches"] = batches
        for precision, m in decisions.items():
            ok50, ok95 = m["p50_ms"] <= TARGET_DECISION_P50_MS, m["p95_ms"] <= TARGET_DECISION_P95_MS
            print(f"  detoxify {precision}: p50 {m['p50_ms']:.1f} ms (target <= {TARGET_DECISION_P50_MS:.0f}: "
                  f"{'met' if ok50 else 'MISSED'}), p95 {m['p95_ms']:.1f} ms (target <= "
                  f"{TARGET_DECISION_P95_MS:.0f}: {'met' if ok95 else 'MISSED'}), p99 {m['p99_ms']:.1f}, "
                  f"max {m['max_ms']:.1f}; n={m['n']}, errors {m['errors']}; load1 {m['load1'][0]} -> {m['load1'][1]}")
            print("    per evaluator p50/p95 ms: " + ", ".join(
                f"{k} {m['evaluator_p50_ms'][k]:.1f}/{m['evaluator_p95_ms'][k]:.1f}" for k in m["evaluator_p50_ms"]))
        print(f"  server batch sizes (size: batches): {batches}")
    results["load_end"] = os.getloadavg()
    print(f"\n{_load()}")
    path = os.path.join(tempfile.mkdtemp(prefix="ca-bench-builtins-"), "results.json")
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"results: {path}")
    print("RESULT_JSON " + json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    main()
