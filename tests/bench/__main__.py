"""Run every benchmark module (``tests/bench/bench_*.py``), each exposing ``main()``.

Benchmarks print figures and ratios measured side by side in one run; they assert nothing
about absolute speed (shared, noisy machines). ``python -m tests.bench NAME`` runs one.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import tests.bench as pkg


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_"))
    wanted = [n for n in names if not argv or any(a in n for a in argv)]
    for name in wanted:
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(f"tests.bench.{name}").main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
