"""Process sandbox: warm call (pre-forked child in a warm agent) vs a cold one-shot subprocess per call.

Prints p50/p99 side by side with the ratio. Bounded loops; asserts nothing about speed.
``python -m tests.bench process_sandbox`` runs it alone.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from sandbox.base import CodeBundle
from sandbox.process.backend import ProcessSandbox

WARM_CALLS = 200
COLD_CALLS = 15
GAP_S = 0.02  # idle time between warm calls: the next child is forked ahead of demand in it
CODE = (
    "import re\n"
    "def evaluate(prompt, response, context):\n"
    "    words = [w for w in ['badword1', 'badword2'] if w in response.lower()]\n"
    "    return {'safety_score': 1.0 - 0.2 * len(words), 'violations': words, 'passed': not words}\n"
)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _warm(bundle: CodeBundle, limits: SandboxLimits, gap: float, spare: int = 1) -> list[float]:
    """Warm calls ``gap`` apart on the default pool sizing; ``spare``: ``PoolLimits.spare_size``."""
    box = ProcessSandbox(limits, pool_limits=PoolLimits(spare_size=spare))
    try:
        await box.prepare(bundle)
        await box.run(bundle, "p", "warm-up", {}, timeout=10)
        out = []
        for i in range(WARM_CALLS):
            await asyncio.sleep(gap)
            t = time.perf_counter()
            await box.run(bundle, "p", f"text badword1 {i}", {"i": i}, timeout=10)
            out.append((time.perf_counter() - t) * 1000)
        return out
    finally:
        await box.aclose()


async def _cold(bundle: CodeBundle, limits: SandboxLimits) -> list[float]:
    """A new agent subprocess (python start, imports, load, fork, call) for every call."""
    out = []
    for i in range(COLD_CALLS):
        box = ProcessSandbox(limits, pool_limits=PoolLimits(min_size=1, max_size=1))
        try:
            t = time.perf_counter()
            await box.run(bundle, "p", f"text badword1 {i}", {"i": i}, timeout=30)
            out.append((time.perf_counter() - t) * 1000)
        finally:
            await box.aclose()
    return out


async def _main() -> None:
    limits = SandboxLimits(timeout_s=30)
    rows = []
    for label, deps in (("no deps", ()), ("nltk+textblob preloaded", ("nltk", "textblob"))):
        bundle = CodeBundle(CODE, deps)
        warm_gap = await _warm(bundle, limits, GAP_S)
        warm_b2b = await _warm(bundle, limits, 0.0)
        b2b_old = await _warm(bundle, limits, 0.0, spare=0)
        cold = await _cold(bundle, limits)
        rows.append((label, warm_gap, warm_b2b, b2b_old, cold))
    print(f"{'bundle':<26}{'warm p50':>10}{'warm p99':>10}{'b2b p50':>10}{'b2b p99':>10}{'no-spare':>10}"
          f"{'cold p50':>11}{'cold p99':>11}{'cold/warm p50':>15}")  # fmt: skip
    for label, warm, b2b, old, cold in rows:
        w50, c50 = statistics.median(warm), statistics.median(cold)
        print(
            f"{label:<26}{w50:>8.2f}ms{_pct(warm, 99):>8.2f}ms{statistics.median(b2b):>8.2f}ms{_pct(b2b, 99):>8.2f}ms"
            f"{statistics.median(old):>8.2f}ms{c50:>9.1f}ms{_pct(cold, 99):>9.1f}ms{c50 / w50:>14.0f}x"
        )
    print(f"(warm: {WARM_CALLS} calls with {GAP_S * 1000:.0f} ms idle between them; b2b: back to back with the"
          f" pool's spare (PoolLimits.spare_size 1); no-spare: b2b p50 with spare_size 0, the next call waits for"
          f" the last reset; cold: {COLD_CALLS} one-shot agents)")  # fmt: skip


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
