"""``crossaudit policy diff OLD NEW --symbolic``: the inputs on which two versions decide differently.

Both versions are encoded over one :class:`~crossaudit.analysis.values.World` (an evaluator's
score, a context field, the stage: the same input for both). The decisions differ where their
``passed``, action or modified response differ. A *region* is one pair of outcomes (old's
passed, action and modified response; new's): the regions are found one at a time, each excluded
before the next is asked for. A region is described in words: the discrete facts of its witness
that hold throughout it (which evaluators answer or say ``passed: false``, the stage, which
conditions hold) and, for each evaluator that answers throughout it, its score's range over the
region (the bounds, and whether each is reached). The witness is evaluated by the engine under both
versions. No region at all is a proof: "equivalent". Each rule present in both versions is
compared the same way (one region each: where its status or action differs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

from crossaudit.analysis.encode import ACTIONS, STATUSES, PolicyEncoding
from crossaudit.analysis.findings import observable_differs
from crossaudit.analysis.solve import Checker, SolverLimits, Timings
from crossaudit.analysis.values import World
from crossaudit.analysis.witness import Runner, claimed, witness_from
from crossaudit.kernel.dsl import Policy

MAX_REGIONS = 20


@dataclass
class Region:
    old: dict[str, Any]
    new: dict[str, Any]
    when: list[str]
    scores: dict[str, dict[str, Any]]
    witness: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new, "when": self.when, "scores": self.scores,
                "witness": self.witness, "engine": self.engine}  # fmt: skip


@dataclass
class RuleChange:
    rule: str
    change: str  # added | removed | outcome
    region: Region | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "change": self.change, "region": self.region.to_json() if self.region else None}


@dataclass
class DiffReport:
    old: str
    new: str
    equivalent: bool | None = None  # None: the solver could not say within its limit
    regions: list[Region] = field(default_factory=list)
    rules: list[RuleChange] = field(default_factory=list)
    truncated: bool = False
    bugs: list[str] = field(default_factory=list)
    not_modelled: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: Timings = field(default_factory=Timings)

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "equivalent": self.equivalent,
            "regions": [r.to_json() for r in self.regions],
            "rules": [r.to_json() for r in self.rules],
            "truncated": self.truncated,
            "not_modelled": self.not_modelled,
            "analysis_bugs": self.bugs,
            "seconds": round(self.seconds, 3),
            "solver": self.timings.to_json(),
        }


def _fmt(x: float) -> str:
    return f"{x:.6g}"


class _Diff:
    def __init__(self, old: Policy, new: Policy, labels: tuple[str, str], limits: SolverLimits) -> None:
        self.old, self.new = old, new
        self.world = World()
        self.a = PolicyEncoding(old, self.world, "old")
        self.b = PolicyEncoding(new, self.world, "new")
        self.checker = Checker(self.world, limits)
        self.runner = Runner()
        self.names = sorted({e.name for e in old.evaluators} | {e.name for e in new.evaluators})
        self.report = DiffReport(old=labels[0], new=labels[1], timings=self.checker.timings)
        self.atoms = self._atoms()
        self.defs = self.a.defs + self.b.defs

    def _atoms(self) -> list[tuple[str, z3.BoolRef]]:
        """The conditions of both versions, by their text (what a region says holds or not)."""
        seen: dict[str, z3.BoolRef] = {}
        for enc in (self.a, self.b):
            for rule in enc.order:
                for c in rule.conditions:
                    text = f"{c.field} {c.operator.value} {c.value!r}"
                    if c.previous_rule is None and text not in seen:
                        seen[text] = enc.enc.check(c, enc.value(c.field))
        return list(seen.items())

    def literals(self, model: z3.ModelRef) -> list[tuple[str, z3.BoolRef]]:
        """What the witness ``model`` says of the discrete inputs, each with its words."""
        out: list[tuple[str, z3.BoolRef]] = []
        stage = model.eval(self.world.stage, model_completion=True).as_long()
        stages = ("no stage is named", "the request names the input stage", "the request names the output stage")
        out.append((stages[stage],
                    self.world.stage == stage))  # fmt: skip
        for name, (ok, _s, pf, to) in sorted(self.world.evaluators.items()):
            if not z3.is_true(model.eval(ok, model_completion=True)):
                timed = z3.is_true(model.eval(to, model_completion=True))
                out.append((f"{name} gives no verdict", z3.Not(ok)))
                out.append((f"{name} times out" if timed else f"{name} errors", to if timed else z3.Not(to)))
                continue
            out.append((f"{name} answers", ok))
            said = z3.is_true(model.eval(pf, model_completion=True))
            out.append((f"{name} says passed: false" if said else f"{name} does not say passed: false",
                        pf if said else z3.Not(pf)))  # fmt: skip
        for text, atom in self.atoms:
            holds = z3.is_true(model.eval(atom, model_completion=True))
            out.append((text if holds else f"not ({text})", atom if holds else z3.Not(atom)))
        return out

    def outcome(self, model: z3.ModelRef, enc: PolicyEncoding) -> tuple[dict[str, Any], list[z3.BoolRef]]:
        d = enc.decision
        passed = z3.is_true(model.eval(d.passed, model_completion=True))
        action = model.eval(d.action, model_completion=True).as_long()
        edits = {k: z3.is_true(model.eval(e, model_completion=True)) for k, e in d.edits.items()}
        unredacted = z3.is_true(model.eval(d.unredacted, model_completion=True))
        fixed = [d.passed == passed, d.action == action, d.unredacted == unredacted]
        fixed += [e == edits[k] for k, e in d.edits.items()]
        summary = {
            "passed": passed,
            "action": ACTIONS[action].value,
            "modified": not unredacted and any(edits.values()),
        }
        return summary, fixed

    def region(
        self,
        kind: str,
        model: z3.ModelRef,
        where: list[z3.BoolRef],
        old: dict[str, Any],
        new: dict[str, Any],
        focus: set[str] | None = None,
    ) -> Region:
        """The region ``where`` (both outcomes fixed) in words: what holds throughout it (of the
        witness's discrete facts, those the region forces), and each evaluator's score range over
        it where the region forces that evaluator to answer."""
        when: list[str] = []
        forced: set[str] = set()
        for text, lit in self.literals(model):
            if text == "no stage is named":
                continue
            if focus is not None and not any(text.startswith(f) for f in focus):
                continue  # a rule's region: only its evaluators and conditions
            if self.checker.check(kind, *where, z3.Not(lit), self.checker.conjunction(self.defs))[0] == "unsat":
                forced.add(text)
                if not text.endswith((" answers", "does not say passed: false")):
                    when.append(text)
        scores: dict[str, dict[str, Any]] = {}
        for name, (_ok, s, _pf, _to) in sorted(self.world.evaluators.items()):
            if f"{name} answers" not in forced or (focus is not None and name not in focus):
                continue
            lo = self.checker.bound(kind, s, *where, self.checker.conjunction(self.defs), maximize=False)
            hi = self.checker.bound(kind, s, *where, self.checker.conjunction(self.defs), maximize=True)
            if lo is None or hi is None or lo[0] > hi[0] or (lo[0] == hi[0] and not (lo[1] and hi[1])):
                continue  # not settled in time (an optimizer that gave up answers no consistent range)
            scores[name] = {"min": lo[0], "min_included": lo[1], "max": hi[0], "max_included": hi[1]}
            if not (lo == (0.0, True) and hi == (1.0, True)):
                when.append(
                    f"{name}'s score in {'[' if lo[1] else '('}{_fmt(lo[0])}, {_fmt(hi[0])}{']' if hi[1] else ')'}"
                )
        region = Region(old=old, new=new, when=when, scores=scores)
        self.reproduce(model, region, kind)
        return region

    def reproduce(self, model: z3.ModelRef, region: Region, kind: str) -> None:
        w = witness_from(model, self.world, self.names)
        d1, seen1 = self.runner.check(self.old, w, claimed(model, self.a))
        d2, seen2 = self.runner.check(self.new, w, claimed(model, self.b))
        if d1 or d2:
            self.report.bugs.append(f"{kind}: witness {w.describe()} not reproduced: "
                                    + "; ".join([f"old {x}" for x in d1] + [f"new {x}" for x in d2]))  # fmt: skip
            return
        region.witness, region.engine = w.to_json(), {"old": seen1, "new": seen2}

    def decisions(self, max_regions: int) -> None:
        differs = observable_differs(self.a, self.b)
        excluded: list[z3.BoolRef] = []
        while True:
            answer, model = self.checker.check(
                "diff", differs, *excluded, self.checker.conjunction(self.defs), tidy=True
            )
            if answer == "unknown":
                self.report.equivalent = None
                return
            if answer == "unsat" or model is None:
                self.report.equivalent = not self.report.regions
                return
            if len(self.report.regions) >= max_regions:
                self.report.truncated = True
                return
            old, f_old = self.outcome(model, self.a)
            new, f_new = self.outcome(model, self.b)
            self.report.equivalent = False
            self.report.regions.append(self.region("diff", model, [differs, *f_old, *f_new], old, new))
            excluded.append(z3.Not(z3.And(*f_old, *f_new)))

    def rule_outcomes(self) -> None:
        names_a, names_b = set(self.a.rules), set(self.b.rules)
        for name in sorted(names_a - names_b):
            self.report.rules.append(RuleChange(rule=name, change="removed"))
        for name in sorted(names_b - names_a):
            self.report.rules.append(RuleChange(rule=name, change="added"))
        for name in sorted(names_a & names_b):
            ra, rb = self.a.rules[name], self.b.rules[name]
            differs = z3.Or(ra.status != rb.status, z3.And(z3.Not(ra.passed), ra.action != rb.action))
            answer, model = self.checker.check("diff (rules)", differs, self.checker.conjunction(self.defs), tidy=True)
            if answer != "sat" or model is None:
                continue
            pair = []
            for r in (ra, rb):
                st = model.eval(r.status, model_completion=True).as_long()
                code = model.eval(r.action, model_completion=True).as_long()
                pair.append({"status": STATUSES[st], "action": ACTIONS[code].value
                             if not z3.is_true(model.eval(r.passed, model_completion=True)) else None})  # fmt: skip
            fixed = [ra.status == model.eval(ra.status), rb.status == model.eval(rb.status)]
            conds = (*ra.rule.conditions, *rb.rule.conditions)
            focus = {*ra.rule.evaluator_names, *rb.rule.evaluator_names, "the request names"}
            focus |= {f"{c.field} " for c in conds} | {f"not ({c.field} " for c in conds}
            region = self.region("diff (rules)", model, [differs, *fixed], pair[0], pair[1], focus)
            self.report.rules.append(RuleChange(rule=name, change="outcome", region=region))


def symbolic_diff(
    old: Policy,
    new: Policy,
    labels: tuple[str, str] = ("old", "new"),
    limits: SolverLimits | None = None,
    max_regions: int = MAX_REGIONS,
) -> DiffReport:
    t0 = time.perf_counter()
    d = _Diff(old, new, labels, limits or SolverLimits())
    d.decisions(max_regions)
    d.rule_outcomes()
    d.report.not_modelled = sorted(set(d.world.free_notes.values()))
    d.report.seconds = time.perf_counter() - t0
    return d.report
