"""Run every benchmark module (``tests/bench/bench_*.py``), each exposing ``main()``.

Benchmarks print figures and ratios measured side by side in one run; they assert nothing
about absolute speed (shared, noisy machines). ``python -m tests.bench NAME`` runs one;
``--out DIR`` writes the run's ``results.json`` and ``results.png`` there (``make bench``:
docs/bench). Every target is printed beside its measured figure at the end.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

import tests.bench as pkg
from tests.bench import report


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench")
    ap.add_argument("names", nargs="*", help="run the benchmarks whose module names contain one of these")
    ap.add_argument("--out", type=Path, help="write results.json and results.png to this directory")
    args = ap.parse_args(argv)
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_"))
    wanted = [n for n in names if not args.names or any(a in n for a in args.names)]
    for name in wanted:
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(f"tests.bench.{name}").main()
    print("\n=== targets (one run, this machine) ===")
    print("\n".join(report.target_lines()))
    if args.out is not None:
        data, png = report.write(args.out)
        print(f"\nwrote {data} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
