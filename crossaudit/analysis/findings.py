"""``crossaudit policy analyze``: what can be proved about one policy, each finding with a witness
the real engine reproduces where one exists (docs/analysis.md lists every kind).

Kinds (stable identifiers of the JSON output), by severity:

- error: ``conditions-never-hold``, ``regex-never-matches``, ``previous-rule-never-set`` (a
  positive condition), ``never-runs``, ``consensus-cannot-pass``;
- warning: ``never-decides``, ``condition-always-holds``, ``inert-threshold``,
  ``consensus-cannot-fail``, ``disagreement-impossible``, ``fallback-never-used``,
  ``on-error-never-used``, ``never-runs-at-stage``, ``previous-rule-never-set`` (a negative
  condition: it always holds);
- info: ``threshold-zero-sometimes``, ``records-only``, and ``unknown`` (a query the solver did
  not settle within its limit: nothing is claimed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

from crossaudit.analysis.encode import CODE, DecisionOut, PolicyEncoding, RuleOut
from crossaudit.analysis.solve import Checker, SolverLimits, Timings
from crossaudit.analysis.values import NEGATIVE, World
from crossaudit.analysis.witness import Runner, claimed, witness_from
from crossaudit.kernel.dsl import Condition, Operator, Policy, Rule, Stage
from crossaudit.kernel.results import Action
from orchestrator.engine.engine import no_verdict_action

SEVERITIES = ("info", "warning", "error")
STAGE_NAMES = {0: "no stage", 1: "the input stage", 2: "the output stage"}


@dataclass
class Finding:
    kind: str
    severity: str
    rules: list[str]
    message: str
    proved: bool = True  # False for ``unknown``
    witness: dict[str, Any] | None = None
    witness_text: str = ""
    engine: dict[str, Any] | None = None  # what the engine decided on the witness (reproduced)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "rules": self.rules,
            "message": self.message,
            "proved": self.proved,
            "witness": self.witness,
            "engine": self.engine,
        }


@dataclass
class AnalysisReport:
    policy: str
    version: str
    findings: list[Finding] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)  # witnesses the engine did not reproduce
    not_modelled: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: Timings = field(default_factory=Timings)

    def at_least(self, severity: str) -> list[Finding]:
        floor = SEVERITIES.index(severity)
        return [f for f in self.findings if SEVERITIES.index(f.severity) >= floor]

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "version": self.version,
            "findings": [f.to_json() for f in self.findings],
            "counts": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
            "not_modelled": self.not_modelled,
            "analysis_bugs": self.bugs,
            "seconds": round(self.seconds, 3),
            "solver": self.timings.to_json(),
        }


def _cond_text(c: Condition) -> str:
    return f"{c.field} {c.operator.value} {c.value!r}"


class _Analysis:
    def __init__(self, policy: Policy, limits: SolverLimits) -> None:
        self.policy = policy
        self.world = World()
        self.enc = PolicyEncoding(policy, self.world, "p")
        # the same policy again, any one rule knockable: "does this rule ever change the decision?"
        self.ko = {r.name: z3.Bool(f"knockout[{r.name}]") for r in self.enc.order}
        self.enc_ko = PolicyEncoding(policy, self.world, "k", knockout=self.ko)
        self.checker = Checker(self.world, limits)
        self.runner = Runner()
        self.report = AnalysisReport(policy=policy.name, version=policy.version, timings=self.checker.timings)
        self.read = {dep for r in self.enc.order for dep in r.depends_on}
        self.staged = any(r.stage is not Stage.BOTH for r in self.enc.order)

    # -- helpers ------------------------------------------------------------------------------

    def add(self, kind: str, severity: str, rules: list[str], message: str) -> Finding:
        f = Finding(kind=kind, severity=severity, rules=rules, message=message)
        self.report.findings.append(f)
        return f

    def unknown(self, kind: str, rules: list[str], question: str) -> None:
        secs = self.checker.limits.query_timeout_s
        self.add(
            "unknown", "info", rules, f"{kind}: could not decide {question} within the solver's limit ({secs:g} s)"
        )
        self.report.findings[-1].proved = False

    def attach(self, finding: Finding, kind: str, *formulas: z3.BoolRef, pair: PolicyEncoding | None = None,
               knocked: str | None = None) -> None:  # fmt: skip
        """A witness of ``formulas`` for ``finding``, checked by the engine (on the policy, and
        with ``knocked`` disabled when ``pair`` is the knockout encoding)."""
        defs = [self.checker.conjunction(e.defs) for e in (self.enc, pair) if e is not None]
        answer, model = self.checker.check(f"{kind} (witness)", *formulas, *defs, tidy=True)
        if answer != "sat" or model is None:
            return
        w = witness_from(model, self.world, [e.name for e in self.policy.evaluators])
        diffs, seen = self.runner.check(self.policy, w, claimed(model, self.enc))
        if pair is not None and knocked is not None and not diffs:
            other = self.policy.model_copy(deep=True)
            next(r for r in other.rules if r.name == knocked).enabled = False
            more, _ = self.runner.check(other, w, claimed(model, pair))
            diffs += [f"without {knocked}: {d}" for d in more]
        if diffs:
            self.report.bugs.append(
                f"{kind} {finding.rules}: witness {w.describe()} not reproduced: " + "; ".join(diffs)
            )
            return
        finding.witness, finding.witness_text, finding.engine = w.to_json(), w.describe(), seen

    # -- the checks of one rule ---------------------------------------------------------------

    def rule(self, rule: Rule) -> None:
        out = self.enc.rules[rule.name]
        if self._reads(rule, out) or self._regexes(rule) or self._conditions(rule, out):
            return  # the rule never applies: what follows would only repeat it
        answer, _ = self.checker.check("never-runs", out.ran, self.checker.conjunction(self.enc.defs))
        if answer == "unknown":
            self.unknown("never-runs", [rule.name], f"whether {rule.name} ever runs")
            return
        if answer == "unsat":
            f = self.add("never-runs", "error", [rule.name],
                         f"{rule.name} never runs: whenever its conditions hold and its stage applies, an earlier "
                         "rule has stopped processing")  # fmt: skip
            self.attach(f, "never-runs", out.cond, out.stage_ok)
            return
        if self.staged:
            self._stages(rule, out)
        self._threshold(rule, out)
        if len(rule.evaluator_names) > 1:
            self._consensus(rule, out)
        self._fallback(rule, out)
        self._decides(rule, out)

    def _reads(self, rule: Rule, out: RuleOut) -> bool:
        """``previous_rule`` reads that never see a value; True when the rule therefore never applies."""
        never = False
        for c in rule.conditions:
            if c.previous_rule is None:
                continue
            v = self.enc.value(c.field)
            answer, _ = self.checker.check(
                "previous-rule-never-set", out.reached, v.present, self.checker.conjunction(self.enc.defs)
            )
            if answer == "unknown":
                self.unknown("previous-rule-never-set", [rule.name], f"whether {c.field} is ever set")
            elif answer == "unsat":
                negative = c.operator in NEGATIVE
                never |= not negative
                self.add("previous-rule-never-set", "warning" if negative else "error", [rule.name, c.previous_rule],
                         f"{rule.name} reads {c.field}, which has no value whenever {rule.name} is reached "
                         + ("(the condition always holds)" if negative else "(the rule never applies)"))  # fmt: skip
        return never

    def _regexes(self, rule: Rule) -> bool:
        never = False
        for c in rule.conditions:
            if c.operator is not Operator.REGEX_MATCH:
                continue
            v = self.enc.value(c.field)
            answer, _ = self.checker.check("regex-never-matches", self.enc.enc.check(c, v))
            if answer == "unsat":
                never = True
                self.add("regex-never-matches", "error", [rule.name],
                         f"{rule.name}: regex {c.value!r} never matches what {c.field} can be, "
                         "so the rule never applies")  # fmt: skip
        return never

    def _conditions(self, rule: Rule, out: RuleOut) -> bool:
        if not rule.conditions:
            return False
        checks = [self.enc.enc.check(c, self.enc.value(c.field)) for c in rule.conditions]
        if rule.depends_on:  # previous_rule reads the earlier rules' results
            checks.append(z3.And(self.checker.conjunction(self.enc.defs)))
        answer, _ = self.checker.check("conditions-never-hold", out.stage_ok, *checks)
        if answer == "unknown":
            self.unknown("conditions-never-hold", [rule.name], f"whether the conditions of {rule.name} can hold")
            return False
        if answer == "unsat":
            core = [i for i in self._core(checks, out.stage_ok) if i < len(rule.conditions)]
            shown = "; ".join(_cond_text(rule.conditions[i]) for i in core)
            self.add("conditions-never-hold", "error", [rule.name],
                     f"{rule.name} never applies: its conditions contradict each other ({shown})")  # fmt: skip
            return True
        for i, c in enumerate(rule.conditions):
            others = [x for j, x in enumerate(checks) if j != i]
            given = " given the others" if len(rule.conditions) > 1 else ""
            answer, _ = self.checker.check("condition-always-holds", out.stage_ok, *others, z3.Not(checks[i]))
            if answer == "unsat":
                self.add("condition-always-holds", "warning", [rule.name],
                         f"{rule.name}: condition {_cond_text(c)} always holds{given}: it is redundant")  # fmt: skip
            elif answer == "unknown":
                self.unknown("condition-always-holds", [rule.name], f"whether {_cond_text(c)} always holds")
        return False

    def _core(self, checks: list[z3.BoolRef], *base: z3.BoolRef) -> list[int]:
        """The indices of a subset of ``checks`` that cannot hold together (z3's unsat core)."""
        s = z3.Solver()
        s.set("timeout", max(1, int(self.checker.limits.query_timeout_s * 1000)))
        s.add(*self.world.domain, *base)
        marks = [z3.Bool(f"__c{i}") for i in range(len(checks))]
        for m, c in zip(marks, checks, strict=True):
            s.add(z3.Implies(m, c))
        if s.check(*marks) != z3.unsat:
            return list(range(len(checks)))
        core = {str(m) for m in s.unsat_core()}
        return [i for i, m in enumerate(marks) if str(m) in core]

    def _stages(self, rule: Rule, out: RuleOut) -> None:
        for code, label in STAGE_NAMES.items():
            applies = rule.stage is Stage.BOTH or code == 0 or (code == 1) == (rule.stage is Stage.INPUT)
            if not applies:
                continue
            answer, _ = self.checker.check(
                "never-runs-at-stage", out.ran, self.world.stage == code, self.checker.conjunction(self.enc.defs)
            )
            if answer == "unsat":
                self.add("never-runs-at-stage", "warning", [rule.name],
                         f"{rule.name} never runs at {label}, although its stage "
                         f"({rule.stage.value}) includes it")  # fmt: skip

    def _threshold(self, rule: Rule, out: RuleOut) -> None:
        if rule.threshold != "dynamic" and float(rule.threshold) > 0:
            return  # a static threshold above 0 fails a score of 0: nothing to ask the solver
        answer, _ = self.checker.check(
            "inert-threshold", out.ran, out.threshold > 0, self.checker.conjunction(self.enc.defs)
        )
        if answer == "unknown":
            self.unknown("inert-threshold", [rule.name], f"whether the threshold of {rule.name} can fail a score")
            return
        if answer == "unsat":
            f = self.add("inert-threshold", "warning", [rule.name],
                         f"{rule.name}: its threshold is 0 wherever it runs, so no score fails it: only an explicit "
                         "passed: false or an evaluator error can")  # fmt: skip
            evs = [self.world.evaluator(n) for n in rule.evaluator_names]
            answered = [ok for ok, _s, _pf, _to in evs] + [z3.Not(pf) for _ok, _s, pf, _to in evs]
            zero = [s == 0 for _ok, s, _pf, _to in evs]
            if (
                self.checker.check(
                    "inert-threshold (witness)", out.ran, *answered, *zero, self.checker.conjunction(self.enc.defs)
                )[0]
                == "sat"
            ):
                answered += zero  # a score of 0 passes, where one can reach the rule
            self.attach(f, "inert-threshold", out.ran, *answered)
            return
        if rule.threshold == "dynamic":
            answer, _ = self.checker.check(
                "threshold-zero-sometimes", out.ran, out.threshold <= 0, self.checker.conjunction(self.enc.defs)
            )
            if answer == "sat":
                f = self.add("threshold-zero-sometimes", "info", [rule.name],
                             f"{rule.name}: its dynamic threshold reaches 0 for some requests, "
                             "where no score fails it")  # fmt: skip
                self.attach(f, "threshold-zero-sometimes", out.ran, out.threshold <= 0)

    def _consensus(self, rule: Rule, out: RuleOut) -> None:
        all_ok = [self.world.evaluator(n)[0] for n in rule.evaluator_names]
        answer, _ = self.checker.check(
            "consensus-cannot-pass", out.verdict, out.passed, self.checker.conjunction(self.enc.defs)
        )
        if answer == "unsat":
            self.add("consensus-cannot-pass", "error", [rule.name],
                     f"{rule.name}: no combination of its evaluators' verdicts passes the consensus")  # fmt: skip
        answer, _ = self.checker.check(
            "consensus-cannot-fail", out.ran, *all_ok, z3.Not(out.passed), self.checker.conjunction(self.enc.defs)
        )
        if answer == "unsat":
            self.add("consensus-cannot-fail", "warning", [rule.name],
                     f"{rule.name}: when every evaluator answers, the consensus never fails")  # fmt: skip
        if rule.on_disagreement is not None and rule.on_disagreement.reviews:
            answer, _ = self.checker.check(
                "disagreement-impossible", out.split, self.checker.conjunction(self.enc.defs)
            )
            if answer == "unsat":
                self.add("disagreement-impossible", "warning", [rule.name],
                         f"{rule.name}: on_disagreement require_review can never happen (no split vote reaches "
                         f"min_spread {rule.on_disagreement.min_spread:g})")  # fmt: skip

    def _fallback(self, rule: Rule, out: RuleOut) -> None:
        if rule.fallback is None:
            return
        if rule.fallback.evaluator:
            answer, _ = self.checker.check(
                "fallback-never-used", out.fallback_used, self.checker.conjunction(self.enc.defs)
            )
            if answer == "unsat":
                self.add("fallback-never-used", "warning", [rule.name],
                         f"{rule.name}: fallback evaluator {rule.fallback.evaluator!r} can never give the verdict "
                         "(it cannot answer when the rule's own evaluators do not)")  # fmt: skip
        if rule.fallback.on_error:
            plain = rule.model_copy(update={"fallback": rule.fallback.model_copy(update={"on_error": None})})
            if no_verdict_action(plain)[0] is no_verdict_action(rule)[0]:
                self.add("on-error-never-used", "warning", [rule.name],
                         f"{rule.name}: fallback.on_error {rule.fallback.on_error.value} is what the rule does without "
                         "it (fail-closed), so it is never what decides")  # fmt: skip
                return
            answer, _ = self.checker.check(
                "on-error-never-used", out.ran, z3.Not(out.verdict), self.checker.conjunction(self.enc.defs)
            )
            if answer == "unsat":
                self.add("on-error-never-used", "warning", [rule.name],
                         f"{rule.name}: fallback.on_error {rule.fallback.on_error.value} can never be used: "
                         "the rule always gets a verdict")  # fmt: skip

    def _independent(self, rule: Rule) -> bool:
        """No other rule's result depends on ``rule``'s: it stops nothing, and no rule reads it."""
        return rule.name not in self.read and not self.enc._stop_kind(rule)

    def _decides_alone(self, rule: Rule, out: RuleOut) -> bool:
        """A cheap proof that ``rule`` can change the decision, on the policy alone: a rule that
        stops nothing and that no rule reads leaves every other rule's result as it is when it is
        taken out, so where it fails with an action more severe than every other failed rule's,
        the decision (passed, or the action) is its own. False: not shown this way."""
        if not self._independent(rule) or rule.action in (Action.CONTINUE, Action.ALLOW):
            return False
        failed = z3.And(out.ran, z3.Not(out.passed))
        others = [
            z3.Implies(z3.And(o.ran, z3.Not(o.passed)), o.severity < out.severity)
            for name, o in self.enc.rules.items()
            if name != rule.name
        ]
        benign = z3.Or(out.action == CODE[Action.CONTINUE], out.action == CODE[Action.ALLOW])
        answer, _ = self.checker.check(
            "never-decides", failed, z3.Not(benign), *others, self.checker.conjunction(self.enc.defs)
        )
        return answer == "sat"

    def _decides(self, rule: Rule, out: RuleOut) -> None:
        benign = (Action.CONTINUE, Action.ALLOW)
        if rule.action in benign and rule.name not in self.read and (out.no_verdict_action in (None, *benign)):
            self.add("records-only", "info", [rule.name],
                     f"{rule.name}: its action is {rule.action.value} and no rule reads it: "
                     "it records, never decides")  # fmt: skip
            return
        if self._decides_alone(rule, out):
            return
        only = [self.ko[n] if n == rule.name else z3.Not(self.ko[n]) for n in self.ko]
        if self._independent(rule):  # the others' results do not depend on it: one copy of the policy
            alone, definitions = self.enc.without(rule.name)
            differs = _differs(self.enc.decision, alone)
            answer, _ = self.checker.check(
                "never-decides",
                z3.And(out.ran, z3.Not(out.passed)),
                differs,
                *definitions,
                self.checker.conjunction(self.enc.defs),
            )
        else:
            differs = observable_differs(self.enc, self.enc_ko)
            answer, _ = self.checker.check(
                "never-decides",
                *only,
                differs,
                self.checker.conjunction(self.enc.defs),
                self.checker.conjunction(self.enc_ko.defs),
            )
        if answer == "unknown":
            self.unknown("never-decides", [rule.name], f"whether {rule.name} ever changes the decision")
            return
        if answer == "sat":
            return
        f = self.add("never-decides", "warning", [rule.name],
                     f"{rule.name} never changes the decision: wherever it would fail, a stricter rule already "
                     "decided as much (or stopped processing first)")  # fmt: skip
        self.attach(f, "never-decides", *only, out.own_fail, pair=self.enc_ko, knocked=rule.name)


def observable_differs(a: PolicyEncoding, b: PolicyEncoding) -> z3.BoolRef:
    """The two decisions differ in passed, action, or the modified response."""
    return _differs(a.decision, b.decision)


def _differs(da: DecisionOut, db: DecisionOut) -> z3.BoolRef:
    parts = [da.passed != db.passed, da.action != db.action, da.unredacted != db.unredacted]
    for key in set(da.edits) | set(db.edits):
        parts.append(da.edits.get(key, z3.BoolVal(False)) != db.edits.get(key, z3.BoolVal(False)))
    return z3.Or(*parts)


def analyze(policy: Policy, limits: SolverLimits | None = None) -> AnalysisReport:
    """Every finding about ``policy`` (module docstring), each witness reproduced by the engine."""
    t0 = time.perf_counter()
    a = _Analysis(policy, limits or SolverLimits())
    for rule in a.enc.order:
        a.rule(rule)
    a.report.not_modelled = sorted(set(a.world.free_notes.values()) | set(_assumptions(policy)))
    a.report.seconds = time.perf_counter() - t0
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    a.report.findings.sort(key=lambda f: order[f.severity])
    return a.report


def _assumptions(policy: Policy) -> list[str]:
    out = [
        "custom, builtin and llm evaluators' scores are free in [0, 1] (their code, model or answer is not modelled)"
    ]
    if any(r.feedback_config and r.feedback_config.update_model for r in policy.rules):
        out.append("feedback_config: thresholds are analysed as written, before feedback moves them")
    return out
