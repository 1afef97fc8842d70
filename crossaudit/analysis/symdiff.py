"""``crossaudit policy diff OLD NEW --symbolic``: the inputs on which two versions decide differently.

Both versions are encoded over one :class:`~crossaudit.analysis.values.World` (an evaluator's
score, a context field, the stage: the same input for both). The decisions differ where their
``passed``, action or modified response differ. Regions are found one at a time: a model of "they
differ" fixes a *region*: both outcomes, which evaluators answered (and which said
``passed: false``), the stage, and which conditions hold. The region is described in words (each
answering evaluator's score range within it, the conditions that hold), its witness is evaluated by
the engine under both versions, and it is excluded before the next one is asked for. No region at
all is a proof: "equivalent". Each rule present in both is compared the same way (one region each).
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

    def skeleton(self, model: z3.ModelRef) -> list[z3.BoolRef]:
        out: list[z3.BoolRef] = [self.world.stage == model.eval(self.world.stage, model_completion=True)]
        for ok, _s, pf, to in self.world.evaluators.values():
            for b in (ok, pf, to):
                out.append(b == model.eval(b, model_completion=True))
        for _text, atom in self.atoms:
            out.append(atom == model.eval(atom, model_completion=True))
        return out

    def outcome(self, model: z3.ModelRef, enc: PolicyEncoding) -> tuple[dict[str, Any], list[z3.BoolRef]]:
        d = enc.decision
        passed = z3.is_true(model.eval(d.passed, model_completion=True))
        action = model.eval(d.action, model_completion=True).as_long()
        edits = {k: z3.is_true(model.eval(e, model_completion=True)) for k, e in d.edits.items()}
        unredacted = z3.is_true(model.eval(d.unredacted, model_completion=True))
        fixed = [d.passed == passed, d.action == action, d.unredacted == unredacted]
        fixed += [e == edits[k] for k, e in d.edits.items()]
        summary = {"passed": passed, "action": ACTIONS[action].value, "modified": not unredacted and any(edits.values())}
        return summary, fixed

    def region(self, kind: str, model: z3.ModelRef, where: list[z3.BoolRef], old: dict[str, Any], new: dict[str, Any]) -> Region:
        sk = self.skeleton(model)
        when: list[str] = []
        scores: dict[str, dict[str, Any]] = {}
        stage = model.eval(self.world.stage, model_completion=True).as_long()
        if stage:
            when.append(f"the request names the {('input', 'output')[stage - 1]} stage")
        for name, (ok, s, pf, to) in sorted(self.world.evaluators.items()):
            if not z3.is_true(model.eval(ok, model_completion=True)):
                what = "times out" if z3.is_true(model.eval(to, model_completion=True)) else "gives no verdict"
                when.append(f"{name} {what}")
                scores[name] = {"verdict": False}
                continue
            if z3.is_true(model.eval(pf, model_completion=True)):
                when.append(f"{name} says passed: false")
            lo = self.checker.bound(kind, s, *where, *sk, maximize=False)
            hi = self.checker.bound(kind, s, *where, *sk, maximize=True)
            if lo is None or hi is None:
                continue
            scores[name] = {"min": lo[0], "min_included": lo[1], "max": hi[0], "max_included": hi[1]}
            if not (lo == (0.0, True) and hi == (1.0, True)):
                when.append(f"{name}'s score in {'[' if lo[1] else '('}{_fmt(lo[0])}, {_fmt(hi[0])}{']' if hi[1] else ')'}")
        for text, atom in self.atoms:
            if z3.is_true(model.eval(atom, model_completion=True)):
                when.append(text)
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
            answer, model = self.checker.check("diff", differs, *excluded)
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
            sk = self.skeleton(model)
            self.report.equivalent = False
            self.report.regions.append(self.region("diff", model, [differs, *f_old, *f_new], old, new))
            excluded.append(z3.Not(z3.And(*f_old, *f_new, *sk)))

    def rule_outcomes(self) -> None:
        names_a, names_b = set(self.a.rules), set(self.b.rules)
        for name in sorted(names_a - names_b):
            self.report.rules.append(RuleChange(rule=name, change="removed"))
        for name in sorted(names_b - names_a):
            self.report.rules.append(RuleChange(rule=name, change="added"))
        for name in sorted(names_a & names_b):
            ra, rb = self.a.rules[name], self.b.rules[name]
            differs = z3.Or(ra.status != rb.status, z3.And(z3.Not(ra.passed), ra.action != rb.action))
            answer, model = self.checker.check("diff (rules)", differs)
            if answer != "sat" or model is None:
                continue
            pair = []
            for r in (ra, rb):
                st = model.eval(r.status, model_completion=True).as_long()
                pair.append({"status": STATUSES[st], "action": ACTIONS[model.eval(r.action, model_completion=True).as_long()].value
                             if not z3.is_true(model.eval(r.passed, model_completion=True)) else None})  # fmt: skip
            fixed = [ra.status == model.eval(ra.status), rb.status == model.eval(rb.status)]
            region = self.region("diff (rules)", model, [differs, *fixed], pair[0], pair[1])
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
