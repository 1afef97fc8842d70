"""Recorded LLM answers and repeated runs for the CLI (``crossaudit policy test``, ``crossaudit eval``).

* :func:`add_cassette_arguments` adds ``--record DIR``, ``--replay DIR`` (exclusive) and ``--repeat N``.
* :func:`cassette_from_args` installs the recorder or replayer
  (:mod:`orchestrator.evaluators.cassette`) for the LLM calls made in this process while the
  ``with`` block runs; a recording is written when the block ends without an exception (one
  file per policy version, atomically), never a partial one after a failure.
* :func:`check_policy` refuses, before anything runs, a policy version the replay directory has
  no cassette for (:class:`~crossaudit.kernel.errors.CassetteMismatchError`: exit 2).
* :func:`repeat_count` is ``--repeat`` (1 without it); :class:`RepeatReport` turns N runs of each
  case into pass rates, pass^N (every run passed) and flaky rules (an outcome that varied).

The file format is described in ``docs/cassettes.md``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from crossaudit.kernel.dsl import Policy
from orchestrator.evaluators.cassette import Cassette, installed

__all__ = [
    "MAX_REPEAT",
    "Cassette",
    "RepeatReport",
    "add_cassette_arguments",
    "cassette_from_args",
    "check_policy",
    "miss_summary",
    "repeat_count",
]

MAX_REPEAT = 100  # --repeat's upper bound: each run of each case may call a paid LLM
MAX_MISSES_SHOWN = 5  # unrecorded requests named in the run's summary (the rest are counted)
PASS_OUTCOME = "pass"


def _repeat(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= n <= MAX_REPEAT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_REPEAT}")
    return n


def add_cassette_arguments(parser: argparse.ArgumentParser) -> None:
    """``--record DIR`` | ``--replay DIR``, and ``--repeat N``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--record",
        metavar="DIR",
        help="record each LLM judge's answers into DIR (one JSON file per policy version)",
    )
    group.add_argument(
        "--replay",
        metavar="DIR",
        help="answer every LLM call from the cassettes in DIR, with no network; an unrecorded request fails",
    )
    parser.add_argument(
        "--repeat",
        metavar="N",
        type=_repeat,
        default=1,
        help=f"run each case N times (1..{MAX_REPEAT}) and report pass rates, pass^N and flaky rules",
    )


def repeat_count(args: argparse.Namespace) -> int:
    """How many times each case runs (``--repeat``, 1 without it)."""
    return int(getattr(args, "repeat", None) or 1)


@contextlib.contextmanager
def cassette_from_args(args: argparse.Namespace) -> Iterator[Cassette | None]:
    """The cassette ``--record``/``--replay`` ask for, installed for the block (None: neither).
    A recording is saved when the block ends normally."""
    record, replay = getattr(args, "record", None), getattr(args, "replay", None)
    if not record and not replay:
        yield None
        return
    cassette = Cassette.recorder(str(record)) if record else Cassette.replayer(str(replay))
    with installed(cassette):
        yield cassette
    cassette.save()


def check_policy(cassette: Cassette | None, policy: Policy) -> None:
    """Up front: a replay refuses a policy version its directory holds no cassette for."""
    if cassette is not None:
        cassette.check(policy)


def miss_summary(cassette: Cassette | None) -> str | None:
    """One paragraph naming the unrecorded requests of a replay, or None when there were none."""
    if cassette is None or cassette.miss_count == 0:
        return None
    shown = [f"  evaluator {m.evaluator!r}: {m.digest}" for m in cassette.misses[:MAX_MISSES_SHOWN]]
    more = cassette.miss_count - len(shown)
    tail = [f"  ... and {more} more"] if more > 0 else []
    return "\n".join(
        [f"{cassette.miss_count} LLM request(s) were not recorded in --replay {cassette.directory}:", *shown, *tail]
    )


# --- repeated runs ------------------------------------------------------------------------


@dataclass
class Tally:
    """The outcomes of one thing (a case, a rule on a case) over the runs."""

    runs: int = 0
    passed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, outcome: str) -> None:
        self.runs += 1
        self.passed += outcome == PASS_OUTCOME
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    @property
    def pass_rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    @property
    def pass_all(self) -> bool:
        """pass^N: every run passed."""
        return self.runs > 0 and self.passed == self.runs

    @property
    def flaky(self) -> bool:
        return len(self.outcomes) > 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "passed": self.passed,
            "pass_rate": round(self.pass_rate, 6),
            "pass_all": self.pass_all,
            "flaky": self.flaky,
            "outcomes": dict(sorted(self.outcomes.items())),
        }


class RepeatReport:
    """N runs of each case: per case and per rule the pass rate, pass^N and whether it is flaky.

    A case's outcome is ``pass`` when it passed (its judge's verdict), else what it got; a rule's
    outcome on a case is its status (``pass``, ``fail``, ``error``, ``timeout``, ``skipped``). A
    rule is flaky when its outcome on some case varied between runs. Per rule over all cases:
    ``pass_rate`` over every (case, run), ``pass_all`` the fraction of cases where every run passed."""

    def __init__(self, repeat: int) -> None:
        self.repeat = repeat
        self.cases: dict[str, Tally] = {}
        self.rules: dict[str, dict[str, Tally]] = {}  # rule -> case -> tally

    def add(self, case: str, outcome: str, rules: Mapping[str, str]) -> None:
        self.cases.setdefault(case, Tally()).add(outcome)
        for rule, status in rules.items():
            self.rules.setdefault(rule, {}).setdefault(case, Tally()).add(status)

    def rule_summary(self, rule: str) -> dict[str, Any]:
        per_case = self.rules[rule]
        runs = sum(t.runs for t in per_case.values())
        passed = sum(t.passed for t in per_case.values())
        flaky_cases = sorted(c for c, t in per_case.items() if t.flaky)
        return {
            "rule": rule,
            "runs": runs,
            "passed": passed,
            "pass_rate": round(passed / runs, 6) if runs else 0.0,
            "pass_all": round(sum(t.pass_all for t in per_case.values()) / len(per_case), 6),
            "flaky": bool(flaky_cases),
            "flaky_cases": flaky_cases,
            "cases": {c: t.as_dict() for c, t in sorted(per_case.items())},
        }

    @property
    def flaky_rules(self) -> list[str]:
        return sorted(r for r, cases in self.rules.items() if any(t.flaky for t in cases.values()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "repeat": self.repeat,
            "cases": {c: t.as_dict() for c, t in self.cases.items()},
            "rules": [self.rule_summary(r) for r in sorted(self.rules)],
            "flaky_rules": self.flaky_rules,
        }

    def lines(self) -> list[str]:
        """The report as text, one line per case and per rule."""
        n = self.repeat
        out = [f"repeated {n} times:"]
        for c, t in self.cases.items():
            flag = "  FLAKY" if t.flaky else ""
            out.append(f"  case {c}: passed {t.passed}/{t.runs} ({t.pass_rate:.0%}), pass^{n} {t.pass_all}{flag}")
        for r in sorted(self.rules):
            s = self.rule_summary(r)
            flag = f"  FLAKY on {', '.join(s['flaky_cases'])}" if s["flaky"] else ""
            out.append(
                f"  rule {r}: passed {s['passed']}/{s['runs']} ({s['pass_rate']:.0%}), "
                f"pass^{n} on {s['pass_all']:.0%} of cases{flag}"
            )
        return out
