"""Profile the server under the gRPC benchmark's load: ``python -m tests.bench.profile_grpc``.

Starts a server (separate process, loopback, process sandbox), deploys the 10-rule cached
policy, drives it from ``CLIENTS`` concurrent clients and attaches py-spy (a sampling profiler:
it reads the process from outside, so the server runs unmodified) for ``SECONDS``. Prints the
share of samples per frame, inclusive and self, and writes the collapsed stacks (flamegraph
input) to ``--out``. How the figures were read: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crossaudit.sdk.client import AsyncClient
from orchestrator.policy import load_policy
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import ten_rules

CLIENTS = 16
SECONDS = 20  # sampled
RATE_HZ = 250  # samples per second
MAX_REQUESTS = 200_000  # bounds the load loop whatever the speed
RESPONSE = "A perfectly ordinary answer about renewable energy sources and their trade-offs."


async def _load(address: str, stop_at: float) -> int:
    text = ten_rules(cached=True)
    policy = load_policy(text)
    clients = [AsyncClient(address, api_key=key("acme")) for _ in range(CLIENTS)]
    done = 0
    try:
        await clients[0].deploy_policy(text)

        async def worker(c: AsyncClient) -> None:
            nonlocal done
            while time.monotonic() < stop_at and done < MAX_REQUESTS:
                await c.evaluate(policy.name, "prompt", RESPONSE, timeout=10.0)
                done += 1

        await asyncio.gather(*(worker(c) for c in clients))
    finally:
        for c in clients:
            await c.close()
    return done


def _summarise(collapsed: Path, top: int) -> None:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    print(f"{total} samples")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"\n-- top {top} frames by {title} share --")
        for frame, n in counter.most_common(top):
            print(f"{100 * n / total:6.1f}%  {frame}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="profile.collapsed")
    ap.add_argument("--seconds", type=int, default=SECONDS)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--idle", action="store_true", help="include idle (waiting) samples")
    ap.add_argument("--gil", action="store_true", help="only samples holding the GIL (the serial part)")
    ap.add_argument("--native", action="store_true", help="include C/Cython frames (grpc's core)")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp), sandbox="process") as srv:
        assert srv.proc is not None
        warm_stop = time.monotonic() + 3
        asyncio.run(_load(srv.address, warm_stop))
        cmd = [py_spy, "record", "--pid", str(srv.proc.pid), "--rate", str(RATE_HZ), "--format", "raw"]
        cmd += ["--duration", str(args.seconds), "--output", args.out]
        if not args.native:  # native unwinding needs the process paused per sample
            cmd.append("--nonblocking")
        cmd += [flag for flag, on in (("--idle", args.idle), ("--gil", args.gil), ("--native", args.native)) if on]
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        t0 = time.monotonic()
        n = asyncio.run(_load(srv.address, time.monotonic() + args.seconds))
        print(f"{n} decisions in {time.monotonic() - t0:.1f} s under the profiler ({CLIENTS} clients)")
        spy.wait(timeout=args.seconds + 30)
    _summarise(Path(args.out), args.top)


if __name__ == "__main__":
    main()
