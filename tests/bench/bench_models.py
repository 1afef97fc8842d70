"""Builtin models: load time, and per-call latency in a model server vs in-process, side by side.

Models are built locally (no hub): Detoxify is a BERT in Detoxify's checkpoint format, tiny by
default or bert-base-sized (12 layers, 768 hidden: the shape of Detoxify's ``original``
model, random weights) with ``CROSSAUDIT_BENCH_BERT_BASE=1``; Presidio uses a spaCy pipeline
with an entity_ruler; langdetect its shipped profiles. Prints medians and p95; asserts nothing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CALLS = int(os.environ.get("CROSSAUDIT_BENCH_CALLS", "100"))
CONCURRENCY = 8
TEXT = ("Thanks for reaching out, John Smith. You can mail john@example.com or call 212-555-1234; "
        "honestly you are an idiot if you think this will be refunded.")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _row(label: str, xs: list[float]) -> str:
    return f"  {label:<34} median {statistics.median(xs):8.2f} ms   p95 {_pct(xs, 0.95):8.2f} ms   n={len(xs)}"


async def _latencies(backend: Any, model: str, cfg: dict[str, Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await backend.analyze(model, cfg, "", TEXT, timeout=120)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def _throughput(backend: Any, model: str, cfg: dict[str, Any], n: int) -> float:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with sem:
            await backend.analyze(model, cfg, "", TEXT, timeout=120)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - t0)


async def _bench(kinds: dict[str, dict[str, Any]]) -> None:
    from crossaudit.modelserver.pool import InProcessModels, ModelServerPool

    pool = ModelServerPool()
    local = InProcessModels()
    try:
        for model, cfg in kinds.items():
            print(f"\n[{model}]")
            t0 = time.perf_counter()
            await local.analyze(model, cfg, "", TEXT, timeout=600)
            print(f"  in-process first call (load+infer) {(time.perf_counter() - t0) * 1000:10.1f} ms")
            t0 = time.perf_counter()
            await pool.analyze(model, cfg, "", TEXT, timeout=600)
            print(f"  server start + first call          {(time.perf_counter() - t0) * 1000:10.1f} ms")
            health = await pool.health(model)
            print(f"  server: import+preload {health['load_ms']:.1f} ms; loaded {health['loaded']}")
            # interleave rounds so machine noise hits both sides alike
            inproc: list[float] = []
            served: list[float] = []
            for _ in range(4):
                inproc += await _latencies(local, model, cfg, CALLS // 4)
                served += await _latencies(pool, model, cfg, CALLS // 4)
            print(_row("in-process (thread) per call", inproc))
            print(_row("model server (gRPC, unix) per call", served))
            print(f"  overhead of the server hop: {statistics.median(served) - statistics.median(inproc):+.2f} ms "
                  f"median ({statistics.median(served) / statistics.median(inproc):.2f}x)")
            tp_local = await _throughput(local, model, cfg, CALLS)
            tp_pool = await _throughput(pool, model, cfg, CALLS)
            print(f"  throughput at concurrency {CONCURRENCY}: in-process {tp_local:.0f}/s, server {tp_pool:.0f}/s")
    finally:
        await pool.aclose()
        await local.aclose()


def main() -> None:
    from crossaudit.modelserver.testing import build_spacy_pipeline, build_tiny_detoxify

    with tempfile.TemporaryDirectory(prefix="ca-bench-models-") as tmp:
        root = Path(tmp)
        kinds: dict[str, dict[str, Any]] = {
            "langdetect": {"model": "langdetect"},
            "presidio": {"model": "presidio", "spacy_model_path": build_spacy_pipeline(root / "spacy"),
                         "entities": ["PERSON", "EMAIL", "PHONE", "SSN", "CREDIT_CARD"], "confidence_threshold": 0.3},
        }
        if all(importlib.util.find_spec(m) for m in ("torch", "detoxify")):
            base = os.environ.get("CROSSAUDIT_BENCH_BERT_BASE") == "1"
            t0 = time.perf_counter()
            tiny = build_tiny_detoxify(root / "detox", hidden_size=768 if base else 32)
            if base:  # 12 layers like bert-base: rebuild with the full depth
                import torch
                from transformers import BertConfig, BertForSequenceClassification

                cfg = BertConfig.from_pretrained(tiny.config_dir)
                cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size = 12, 12, 3072
                cfg.save_pretrained(tiny.config_dir)
                ckpt = torch.load(tiny.checkpoint, weights_only=False)
                ckpt["state_dict"] = BertForSequenceClassification(cfg).state_dict()
                torch.save(ckpt, tiny.checkpoint)
            size = os.path.getsize(tiny.checkpoint) / 1e6
            print(f"built {'bert-base-sized' if base else 'tiny'} detoxify checkpoint ({size:.1f} MB) "
                  f"in {time.perf_counter() - t0:.1f} s")
            kinds["detoxify"] = {"model": "detoxify", "checkpoint": tiny.checkpoint,
                                 "huggingface_config_path": tiny.config_dir, "categories": []}
        else:
            print("detoxify/torch not installed: detoxify skipped (make models)")
        asyncio.run(_bench(kinds))


if __name__ == "__main__":
    main()
