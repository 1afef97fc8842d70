"""The live answer's p50 at 16 concurrent clients with a shadow candidate at ``--sample 0.1``,
side by side with shadow off, in one run on one server (docs/rollout.md; target: at most 5% added).

Two policies with the same text but their name: ``shadow-off`` answers alone, ``shadow-on`` has a
threshold-only candidate shadowing it. Rounds alternate between them (off, on, off, ..., on, off)
and the figure is the median over the shadow-on rounds of their p50 divided by the mean p50 of
the two shadow-off rounds around them, so that a drift of the machine falls on both sides.
Two variants: evaluator results cached (what is measured is the service, the engine and the
store) and not cached (every live decision runs both evaluators in the process sandbox). Either
way a sampled shadow of this threshold-only candidate reuses the live verdicts and calls no
evaluator: what it costs is the engine's work on recorded results, the diff and its write.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from crossaudit.sdk.client import AsyncClient
from tests.bench import report
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules

CLIENTS = 16
SAMPLE = 0.1
ROUNDS = 5  # shadow-on rounds, each between two shadow-off rounds
ROUND_S = 3.0
WARMUP = 64
MAX_CALLS_PER_ROUND = 20_000  # bound
RESPONSES = [f"An ordinary answer number {i} about renewable energy and its trade-offs." for i in range(16)]
WARM_SAMPLES = 8 * len(RESPONSES)  # the shadow's own cache has seen every response (cached variant) ...
MAX_WARM_ROUNDS = 10  # ... within this many rounds


def _policies(cached: bool) -> tuple[str, str, str]:
    """(shadow-off policy, shadow-on policy, its candidate: the same with a threshold moved)."""
    text = ten_rules(cached=cached)
    name = "ten-rules-cached" if cached else "ten-rules"
    off = text.replace(f"name: {name}", "name: shadow-off")
    on = text.replace(f"name: {name}", "name: shadow-on")
    return off, on, on.replace("threshold: 0.5", "threshold: 0.6")


async def _round(c: AsyncClient, policy: str, latencies: list[float]) -> tuple[int, float]:
    stop = time.perf_counter() + ROUND_S
    per_client = MAX_CALLS_PER_ROUND // CLIENTS
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        for i in range(per_client):
            if time.perf_counter() > stop:
                return
            t0 = time.perf_counter()
            await c.evaluate(policy, "p", RESPONSES[(w * per_client + i) % len(RESPONSES)], timeout=30)
            latencies.append((time.perf_counter() - t0) * 1000)
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(CLIENTS)))
    return done, time.perf_counter() - t0


async def _measure(address: str, cached: bool) -> tuple[dict[str, tuple[list[float], float, int]], float]:
    """Each mode's (latencies, wall seconds, decisions), and the median of the per-round p50 ratios."""
    off, on, candidate = _policies(cached)
    async with AsyncClient(address, api_key=key("acme")) as c:
        await c.deploy_policy(off)
        await c.deploy_policy(on)
        await c.deploy_policy(candidate, shadow=SAMPLE)
        for i in range(WARMUP):
            await c.evaluate("shadow-off", "p", RESPONSES[i % len(RESPONSES)], timeout=30)
        for _ in range(MAX_WARM_ROUNDS):  # warm the shadow's engine too: its first calls are not the steady state
            await _round(c, "shadow-on", [])
            if (await c.shadow_report("shadow-on")).candidate.evaluated >= WARM_SAMPLES:
                break
        warm = (await c.shadow_report("shadow-on")).candidate
        out: dict[str, tuple[list[float], float, int]] = {"shadow-off": ([], 0.0, 0), "shadow-on": ([], 0.0, 0)}
        p50s: dict[str, list[float]] = {"shadow-off": [], "shadow-on": []}
        # off, on, off, on, ..., off: each shadow-on round sits between two shadow-off rounds
        for policy in ["shadow-off", "shadow-on"] * ROUNDS + ["shadow-off"]:
            lat, wall, n = out[policy]
            mine: list[float] = []
            got, took = await _round(c, policy, mine)
            lat += mine
            p50s[policy].append(statistics.median(mine))
            out[policy] = (lat, wall + took, n + got)
        await asyncio.sleep(2.0)  # let the shadow queue drain before the report
        shadow = (await c.shadow_report("shadow-on")).candidate
    evaluated = shadow.evaluated - warm.evaluated
    print(
        f"  shadow-on's candidate: {evaluated} evaluated of {out['shadow-on'][2]} measured live decisions "
        f"({evaluated / max(1, out['shadow-on'][2]):.1%} sampled), {shadow.dropped - warm.dropped} dropped, "
        f"{shadow.errors} errors, {shadow.pass_to_fail + shadow.fail_to_pass} flips"
    )
    off, on = p50s["shadow-off"], p50s["shadow-on"]
    paired = [on[i] / ((off[i] + off[i + 1]) / 2) for i in range(len(on))]  # drift falls on both sides
    noise = [off[i + 1] / off[i] for i in range(len(off) - 1)]
    print(
        f"  per-round p50, shadow-on / its neighbouring shadow-off rounds: {', '.join(f'{r:.3f}' for r in paired)} "
        f"(median {statistics.median(paired):.3f}x); shadow-off round to round: "
        f"{', '.join(f'{r:.3f}' for r in noise)}"
    )
    return out, statistics.median(paired)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    print(f"{CLIENTS} clients, {ROUNDS} shadow-on rounds of {ROUND_S:g} s between shadow-off ones, sample {SAMPLE}")
    print(f"{'variant':<10} {'mode':<12} {'decisions/s':>12} {'p50 ms':>8} {'p95 ms':>8} {'p50 vs off':>11}")
    for variant, cached in (("cached", True), ("uncached", False)):
        srv = ServerProcess(root / variant)
        srv.start()
        try:
            results, paired = asyncio.run(_measure(srv.address, cached))
        finally:
            srv.stop()
        base = statistics.median(results["shadow-off"][0])
        for mode, (lat, wall, _) in results.items():
            s = report.record(
                f"shadow.{variant}.{mode}.c{CLIENTS}",
                f"{variant}, {mode}",
                lat,
                wall,
                unit="decisions/s",
                concurrency=CLIENTS,
                group="shadow",
            )
            print(
                f"{variant:<10} {mode:<12} {s.throughput:>12.0f} {s.p50_ms:>8.2f} {s.p95_ms:>8.2f} "
                f"{s.p50_ms / base:>10.3f}x"
            )
        # the target's figure: per-round ratios against the neighbouring rounds (robust to the machine's drift)
        report.ratio(f"ratio.shadow.{variant}.c{CLIENTS}", paired)


if __name__ == "__main__":
    main()
