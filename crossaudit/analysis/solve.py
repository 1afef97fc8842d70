"""One place that asks the solver: per-query limits, "unknown" on a timeout, tidy witnesses.

Every query has a wall-clock timeout (``SolverLimits.query_timeout_s``, default 5 s): a query the
solver does not settle in time is ``unknown``, which the analysis reports as such, never as proved.
``rlimit`` (z3's deterministic resource count, 0 = none) bounds a query in steps instead of time:
what tests use to make a query give up reproducibly.

A satisfiable query's model is a witness the engine then evaluates. The solver is free to pick
values on the very edge of a comparison (a score equal to a computed threshold) or kinds the engine
reads differently from the model's simplifications (a string that reads as a number), so the
witness is first asked for with *tidy* preferences (evaluators that answer without an explicit
``passed: false``, values of the plain kinds: no string that reads as a number or an address, no
number where a text operator reads, computed comparisons at least 1e-6 off their edge); only when
none exists is it asked for without them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

import z3

from crossaudit.analysis.values import World

Answer = Literal["sat", "unsat", "unknown"]
MARGIN = z3.RealVal("1/1000000")
MODELS_KEPT = 8  # models a satisfiable query may be answered from without solving


@dataclass(frozen=True)
class SolverLimits:
    query_timeout_s: float = 5.0
    rlimit: int = 0


@dataclass
class Timings:
    """Solver time and query count by finding kind (what the benchmark reports)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    queries: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def to_json(self) -> dict[str, dict[str, float]]:
        return {k: {"seconds": round(self.seconds[k], 4), "queries": self.queries[k]} for k in sorted(self.seconds)}


class Checker:
    """Asks the solver: a fresh solver per query, the inputs' domain asserted in each (measured
    faster than one incremental solver with push and pop, whose incremental mode gives up much of
    z3's preprocessing)."""

    def __init__(self, world: World, limits: SolverLimits, timings: Timings | None = None) -> None:
        self.world = world
        self.limits = limits
        self.timings = timings or Timings()
        self._conjunctions: dict[int, tuple[int, z3.BoolRef, list[z3.BoolRef]]] = {}
        self._models: list[z3.ModelRef] = []  # the latest models, most recent first

    def _solver(self) -> z3.Solver:
        s = z3.Solver()
        s.set("timeout", max(1, int(self.limits.query_timeout_s * 1000)))
        if self.limits.rlimit:
            s.set("rlimit", self.limits.rlimit)
        s.add(self.conjunction(self.world.domain))
        return s

    def _known(self, formulas: tuple[z3.BoolRef, ...]) -> z3.ModelRef | None:
        """A model found before in which ``formulas`` (and the whole domain) hold: a satisfiable
        query answered without the solver (a rule that runs in one witness runs)."""
        goal = z3.And(self.conjunction(self.world.domain), *formulas)
        for model in self._models:
            if z3.is_true(model.eval(goal, model_completion=True)):
                return model
        return None

    def conjunction(self, formulas: list[z3.BoolRef]) -> z3.BoolRef:
        """``And(*formulas)`` of a list that only grows, built once per length: handing the solver
        one term instead of a thousand saves most of the Python side of a query."""
        key = id(formulas)
        hit = self._conjunctions.get(key)
        if hit is None or hit[0] != len(formulas) or hit[2] is not formulas:
            hit = self._conjunctions[key] = (
                len(formulas),
                z3.And(*formulas) if formulas else z3.BoolVal(True),
                formulas,
            )
        return hit[1]

    def check(self, kind: str, *formulas: z3.BoolRef, tidy: bool = False) -> tuple[Answer, z3.ModelRef | None]:
        """Whether ``formulas`` can all hold over the inputs, with a model; ``tidy``: a witness is wanted,
        tidy when one exists (module docstring). A proof (unsat) needs no tidy attempt."""
        t0 = time.perf_counter()
        try:
            if not tidy:
                known = self._known(formulas)
                if known is not None:
                    return "sat", known
            s = self._solver()
            s.add(*formulas)
            answer = s.check()
            if answer != z3.sat:
                return ("unsat", None) if answer == z3.unsat else ("unknown", None)
            model = s.model()
            if tidy:  # the same question with the tidy preferences: that model if there is one
                s.push()
                s.add(*self.world.tidy)
                for lhs, rhs in self.world.margins:
                    s.add(z3.Or(lhs - rhs >= MARGIN, rhs - lhs >= MARGIN))
                if s.check() == z3.sat:
                    model = s.model()
            self._models.insert(0, model)
            del self._models[MODELS_KEPT:]
            return "sat", model
        finally:
            self.timings.seconds[kind] += time.perf_counter() - t0
            self.timings.queries[kind] += 1

    def bound(self, kind: str, term: z3.ArithRef, *formulas: z3.BoolRef, maximize: bool) -> tuple[float, bool] | None:
        """The supremum (or infimum) of ``term`` where ``formulas`` hold, and whether it is attained;
        None when the solver cannot say in time."""
        t0 = time.perf_counter()
        try:
            o = z3.Optimize()
            o.set("timeout", max(1, int(self.limits.query_timeout_s * 1000)))
            o.add(*self.world.domain, *formulas)
            h = o.maximize(term) if maximize else o.minimize(term)
            if o.check() != z3.sat:
                return None
            value = o.upper(h) if maximize else o.lower(h)
            exact = _rational(value)
            if exact is None:  # "9/20 + -1*epsilon": the bound is approached, not reached
                terms = [t.strip() for t in str(value).split("+")]
                rest = [t for t in terms if "epsilon" not in t and "oo" not in t]
                base = _rational_text(rest[0]) if len(rest) == 1 else 0.0 if not rest else None
                return (base, False) if base is not None else None
            s = self._solver()
            s.add(*formulas, term == z3.RealVal(str(value)))
            attained = s.check() == z3.sat
            return exact, attained
        finally:
            self.timings.seconds[kind] += time.perf_counter() - t0
            self.timings.queries[kind] += 1


def _rational(value: z3.ExprRef) -> float | None:
    if z3.is_rational_value(value):
        return float(value.numerator_as_long()) / float(value.denominator_as_long())
    if z3.is_int_value(value):
        return float(value.as_long())
    return None


def _rational_text(text: str) -> float | None:
    try:
        if "/" in text:
            n, d = text.split("/")
            return float(n) / float(d)
        return float(text)
    except ValueError:
        return None
