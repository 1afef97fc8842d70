"""CLI start-up, as a user pays it: each command a whole process, median of 10, beside
``python -c pass`` in the same run (and ``CROSSAUDIT_BENCH_BASELINE=<worktree>``: an older tree's
CLI measured alternately with this one's).

Targets (issue 38): ``--version`` and ``--help`` at most 0.15 s, ``policy validate`` of a small
policy at most 0.6 s. Figures to read, not assertions."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.bench import report

ROOT = Path(__file__).resolve().parents[2]
RUNS = 10  # each command, alternately per tree
POLICY = ROOT / "policies" / "guide" / "07_example_basic_content_safety.yaml"
COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "crossaudit --version": ["-m", "crossaudit.cli", "--version"],
    "crossaudit --help": ["-m", "crossaudit.cli", "--help"],
    "crossaudit policy validate": ["-m", "crossaudit.cli", "policy", "validate", str(POLICY)],
}
TARGETS_S = {"crossaudit --version": 0.15, "crossaudit --help": 0.15, "crossaudit policy validate": 0.6}


def _env(tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's Python runs it: bytecode cached
    if tree is not None:
        env.update(PYTHONPATH=str(tree), PYTHONSAFEPATH="1")
    return env


def _once(args: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, check=False)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    if not POLICY.exists():
        raise SystemExit(f"{POLICY} is missing")
    baseline = os.environ.get("CROSSAUDIT_BENCH_BASELINE", "")
    trees: list[tuple[str, Path | None, Path]] = [("this tree", None, ROOT)]
    if baseline:
        b = Path(baseline).resolve()
        trees.insert(0, ("baseline", b, b))
    times: dict[tuple[str, str], list[float]] = {}
    for _label, tree, cwd in trees:  # warm the bytecode caches once
        for args in COMMANDS.values():
            _once(args, _env(tree), cwd)
    for _ in range(RUNS):
        for label, tree, cwd in trees:
            for name, args in COMMANDS.items():
                times.setdefault((label, name), []).append(_once(args, _env(tree), cwd))
    print(f"whole processes, median of {RUNS} (alternating trees), bytecode cached")
    for label, _, _ in trees:
        print(f"\n{label}:")
        base = statistics.median(times[(label, "python -c pass")])
        for name in COMMANDS:
            med = statistics.median(times[(label, name)])
            bound = TARGETS_S.get(name)
            verdict = "" if bound is None else f"   target <= {bound:.2f} s: {'met' if med <= bound else 'MISSED'}"
            print(f"  {name:30} {med:6.3f} s  (x{med / base:.1f} python -c pass){verdict}")
            if label == "this tree" and bound is not None:
                key = "cli." + name.split()[-1].lstrip("-")
                report.ratio(key + ".s", med)
