"""A policy's decision as formulas over a :class:`~crossaudit.analysis.values.World`.

Mirrors ``orchestrator/engine/engine.py`` step by step: the plan (the engine's own :func:`plan`),
the stage filter (:func:`applies_at`), conditions (with ``previous_rule`` reading the earlier
rule's symbolic result), thresholds (static, or dynamic: linear in trust and sensitivity plus the
first matching time range, clamped), the evaluators' verdicts (one score per evaluator, shared),
the fallback evaluator in place of the ones that gave none, consensus and disagreement, the
no-verdict action (:func:`no_verdict_action`), stops (a failed ``block``, a ``warn`` without
``continue_processing``; a rule with no verdict never stops), and the decision (passed, the most
severe action, first in order on a tie, and the modified response's inputs).

``knockout``: a Bool per rule that, when true, makes the rule as if disabled (the question "does
this rule ever change the decision?" compares the policy with itself minus one rule, on one input).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import z3

from crossaudit.analysis.values import Encoder, Val, World, constant_val, real
from crossaudit.kernel.dsl import ConsensusStrategy, ModifyConfig, Policy, Rule, Stage, WarnConfig
from crossaudit.kernel.results import Action
from orchestrator.engine.consensus import SPREAD_TOLERANCE
from orchestrator.engine.engine import no_verdict_action, plan
from orchestrator.engine.thresholds import in_time_range

ACTIONS = list(Action)
CODE = {a: i for i, a in enumerate(ACTIONS)}
STATUSES = ("skipped", "pass", "fail", "error", "timeout")
RESULT_FIELDS = ("score", "passed", "status", "action", "threshold")


def action_val(a: Action) -> z3.ArithRef:
    return z3.IntVal(CODE[a])


def severity(code: z3.ArithRef) -> z3.ArithRef:
    out: z3.ArithRef = z3.IntVal(0)
    for a in ACTIONS:
        out = z3.If(code == CODE[a], z3.IntVal(a.severity), out)
    return out


@dataclass
class RuleOut:
    """One rule's symbolic result."""

    rule: Rule
    stage_ok: z3.BoolRef
    reached: z3.BoolRef  # in the plan for the stage, not knocked out, not stopped before
    cond: z3.BoolRef  # its conditions hold
    ran: z3.BoolRef  # reached and conditions hold
    verdict: z3.BoolRef  # ran and some evaluator (or the fallback) answered
    passed: z3.BoolRef
    action: z3.ArithRef  # the applied action's code (meaningful when not passed)
    status: z3.ArithRef  # index into STATUSES
    score: z3.ArithRef
    threshold: z3.ArithRef
    split: z3.BoolRef  # a disagreement sent to review
    stops: z3.BoolRef
    fallback_used: z3.BoolRef
    own_fail: z3.BoolRef  # its verdict fails (whatever stops it)
    severity: z3.ArithRef  # of its applied action
    slot_fallback: list[z3.BoolRef] = field(default_factory=list)
    no_verdict_action: Action | None = None


@dataclass
class DecisionOut:
    passed: z3.BoolRef
    action: z3.ArithRef
    unredacted: z3.BoolRef
    edits: dict[str, z3.BoolRef]  # modify edit kinds (evaluators + config) by key -> applied


class PolicyEncoding:
    """``policy`` over ``world``; ``knockout`` (rule name -> Bool) disables rules symbolically."""

    def __init__(self, policy: Policy, world: World, tag: str, knockout: dict[str, z3.BoolRef] | None = None):
        self.policy = policy
        self.w = world
        self.tag = tag
        self.enc = Encoder(world)
        self.knockout = knockout or {}
        self.order = plan(policy)
        self.rules: dict[str, RuleOut] = {}
        self.assumed: list[str] = []
        self.defs: list[z3.BoolRef] = []  # the definitions of the named constants (a query about the rules needs them)
        self._sink: list[z3.BoolRef] | None = None  # where definitions go (None: defs)
        stopped: z3.BoolRef = z3.BoolVal(False)
        for rule in self.order:
            out = self._rule(rule, stopped)
            self.rules[rule.name] = out
            stopped = self.define(f"stopped_after[{rule.name}]", z3.Or(stopped, out.stops))
        self.decision = self._decision()

    # -- pieces -------------------------------------------------------------------------------

    def define(self, name: str, term: z3.ExprRef) -> z3.ExprRef:
        """A named constant equal to ``term`` (its definition joins ``defs``): the decision's
        chains over many rules stay small terms, which the solver handles far better than one
        deeply nested expression."""
        const = z3.Const(f"{self.tag}:{name}", term.sort())
        (self.defs if self._sink is None else self._sink).append(const == term)
        return const

    def stage_ok(self, rule: Rule) -> z3.BoolRef:
        s = self.w.stage
        if rule.stage is Stage.BOTH:
            return z3.BoolVal(True)
        return z3.Or(s == 0, s == (1 if rule.stage is Stage.INPUT else 2))

    def previous(self, dep: str, key: str) -> Val:
        """What ``previous_rule.<dep>.<key>`` reads (missing when ``dep`` is not in the plan for
        the stage, or knocked out)."""
        name = f"{self.tag}:previous_rule.{dep}.{key}"
        out = self.rules.get(dep)
        if out is None:  # disabled (validation refuses this) or after the reader: never there
            return constant_val(name, z3.BoolVal(False), present=False)
        there = out.stage_ok if dep not in self.knockout else z3.And(out.stage_ok, z3.Not(self.knockout[dep]))
        if key == "score":
            return constant_val(name, out.score, z3.And(there, out.verdict))
        if key == "passed":
            return constant_val(name, out.passed, there)
        if key == "threshold":
            return constant_val(name, out.threshold, z3.And(there, out.ran))
        if key == "status":
            text = z3.StringVal(STATUSES[0])
            for i, st in enumerate(STATUSES):
                text = z3.If(out.status == i, z3.StringVal(st), text)
            return constant_val(name, text, there)
        if key == "action":
            text = z3.StringVal("")
            for a in ACTIONS:
                text = z3.If(out.action == CODE[a], z3.StringVal(a.value), text)
            return constant_val(name, text, z3.And(there, z3.Not(out.passed)))
        names = tuple(out.rule.evaluator_names) + (
            (out.rule.fallback.evaluator,) if out.rule.fallback and out.rule.fallback.evaluator else ()
        )
        answered = z3.Or(*[self.w.evaluator(n)[0] for n in names]) if names else z3.BoolVal(False)
        return self.w.detail(names, key, z3.And(there, out.ran, answered))

    def value(self, path: str) -> Val:
        parts = path.split(".")
        if parts[0] == "previous_rule" and len(parts) >= 3:
            return self.previous(parts[1], ".".join(parts[2:]))
        return self.w.field(path)

    def threshold(self, rule: Rule) -> z3.ArithRef:
        if rule.threshold != "dynamic":
            return real(float(rule.threshold))
        cfg = rule.threshold_config
        assert cfg is not None
        value: z3.ArithRef = real(cfg.base_threshold)
        if cfg.user_trust_modifier:
            value = value + real(cfg.user_trust_modifier) * self._unit("user.trust_score", "user.trusted")
        if cfg.content_sensitivity_modifier:
            value = value + real(cfg.content_sensitivity_modifier) * self._unit(
                "content.sensitivity", "content.sensitive"
            )
        if cfg.time_of_day_modifier:
            hour, minute = self.w.field("time.hour"), self.w.field("time.minute")
            minute_of_day = z3.ToInt(hour.num) * 60 + z3.ToInt(minute.num)
            delta: z3.ArithRef = z3.RealVal(0)
            for spec, mod in reversed(list(cfg.time_of_day_modifier.items())):  # the first match applies
                delta = z3.If(_in_range(spec, minute_of_day), real(mod), delta)
            value = value + delta
        return z3.If(value < 0, z3.RealVal(0), z3.If(value > 1, z3.RealVal(1), value))

    def _unit(self, score_path: str, flag_path: str) -> z3.ArithRef:
        """trust / sensitivity: the number at ``score_path`` clamped to [0, 1], else 1 when
        ``flag_path`` is true, else 0 (orchestrator/engine/thresholds.py ``_unit``)."""
        v, flag = self.w.field(score_path), self.w.field(flag_path)
        clamped = z3.If(v.num < 0, z3.RealVal(0), z3.If(v.num > 1, z3.RealVal(1), v.num))
        flagged = z3.If(z3.And(flag.isbool, flag.boolean), z3.RealVal(1), z3.RealVal(0))
        return z3.If(v.isnum, clamped, flagged)

    # -- one rule -----------------------------------------------------------------------------

    # Long: the rule's verdict in the engine's order of steps (_run_rule, _with_fallback, _verdict,
    # _errored, _stops), kept in one place to be read beside the engine's.
    def _rule(self, rule: Rule, stopped: z3.BoolRef) -> RuleOut:
        w = self.w
        stage_ok = self.stage_ok(rule)
        ko = self.knockout.get(rule.name, z3.BoolVal(False))
        reached = z3.And(stage_ok, z3.Not(ko), z3.Not(stopped))
        cond = (
            z3.And(*[self.enc.check(c, self.value(c.field)) for c in rule.conditions])
            if rule.conditions
            else z3.BoolVal(True)
        )
        ran = z3.And(reached, cond)
        t = self.threshold(rule)
        weights = [(e.name, e.weight) for e in rule.evaluators] if rule.evaluators else [(rule.evaluator or "", 1.0)]
        fb = rule.fallback.evaluator if rule.fallback and rule.fallback.evaluator else None
        fb_ok, fb_s, fb_pf, _fb_to = (
            w.evaluator(fb) if fb else (z3.BoolVal(False), z3.RealVal(0), z3.BoolVal(False), None)
        )
        slots = [w.evaluator(n) for n, _ in weights]
        any_errored = z3.Or(*[z3.Not(ok) for ok, *_ in slots])
        use_fb = [z3.And(z3.Not(ok), fb_ok) for ok, *_ in slots] if fb else [z3.BoolVal(False) for _ in slots]
        ans = [z3.Or(ok, u) for (ok, *_), u in zip(slots, use_fb, strict=True)]
        score_i = [z3.If(u, fb_s, s) for (_, s, _, _), u in zip(slots, use_fb, strict=True)]
        pf_i = [z3.If(u, fb_pf, pf) for (_, _, pf, _), u in zip(slots, use_fb, strict=True)]
        vote = [z3.And(a, s >= t, z3.Not(p)) for a, s, p in zip(ans, score_i, pf_i, strict=True)]
        computed = rule.threshold == "dynamic"
        for s in score_i:
            if computed:
                w.margins.append((s, t))
        has_verdict = z3.Or(*ans)
        split: z3.BoolRef = z3.BoolVal(False)
        if len(weights) == 1:
            score, passed_v = score_i[0], vote[0]
        else:
            score, passed_v = self._consensus(rule, weights, ans, score_i, vote, t)
            if rule.on_disagreement is not None and rule.on_disagreement.reviews:
                split = self._split(ans, score_i, vote, rule.on_disagreement.min_spread)
        verdict = z3.And(ran, has_verdict)
        nv_action, _how = no_verdict_action(rule)
        errored = z3.And(ran, z3.Not(has_verdict))
        split = z3.And(verdict, split)
        own_fail = z3.And(cond, stage_ok, has_verdict, z3.Or(split, z3.Not(passed_v)))
        passed = z3.If(
            verdict, z3.And(z3.Not(split), passed_v), z3.If(errored, z3.BoolVal(nv_action is None), z3.BoolVal(True))
        )
        action = z3.If(
            split,
            action_val(Action.REQUIRE_REVIEW),
            z3.If(verdict, action_val(rule.action), action_val(nv_action or Action.ALLOW)),
        )
        timed_out = z3.And(*[z3.Or(ok, to) for ok, _, _, to in slots])
        status = z3.If(
            z3.Not(ran),
            z3.IntVal(0),
            z3.If(verdict, z3.If(passed, z3.IntVal(1), z3.IntVal(2)), z3.If(timed_out, z3.IntVal(4), z3.IntVal(3))),
        )
        n = rule.name
        ran, verdict, split = (
            self.define(f"ran[{n}]", ran),
            self.define(f"verdict[{n}]", verdict),
            self.define(f"split[{n}]", split),
        )
        passed, action = self.define(f"passed[{n}]", passed), self.define(f"action[{n}]", action)
        sev = self.define(f"severity[{n}]", severity(action))
        stops_kind = self._stop_kind(rule)
        stops = z3.And(verdict, z3.Not(passed), z3.Not(split), z3.BoolVal(stops_kind))
        return RuleOut(
            rule=rule,
            stage_ok=stage_ok,
            reached=reached,
            cond=cond,
            ran=ran,
            verdict=verdict,
            passed=passed,
            action=action,
            status=status,
            score=score,
            threshold=t,
            split=split,
            stops=stops,
            fallback_used=z3.And(ran, any_errored, fb_ok) if fb else z3.BoolVal(False),
            own_fail=own_fail,
            severity=sev,
            slot_fallback=use_fb,
            no_verdict_action=nv_action,
        )

    def _stop_kind(self, rule: Rule) -> bool:
        if rule.action is Action.BLOCK:
            return self.policy.settings.stop_on_block
        if rule.action is Action.WARN and isinstance(rule.typed_action_config, WarnConfig):
            return not rule.typed_action_config.continue_processing
        return False

    def _consensus(
        self,
        rule: Rule,
        weights: list[tuple[str, float]],
        ans: list[z3.BoolRef],
        score_i: list[z3.ArithRef],
        vote: list[z3.BoolRef],
        t: z3.ArithRef,
    ) -> tuple[z3.ArithRef, z3.BoolRef]:
        strategy = rule.consensus_strategy or ConsensusStrategy.WEIGHTED_AVERAGE
        ws = [real(w) for _, w in weights]
        total = sum(float(w) for _, w in weights) or 1.0
        ballot = [z3.If(a, s, z3.RealVal(0)) for a, s in zip(ans, score_i, strict=True)]
        avg = z3.Sum(*[b * w for b, w in zip(ballot, ws, strict=True)]) / real(total)
        if strategy is ConsensusStrategy.WEIGHTED_AVERAGE:
            self.w.margins.append((avg, t))
            return avg, avg >= t
        if strategy is ConsensusStrategy.UNANIMOUS:
            low = ballot[0]
            for b in ballot[1:]:
                low = z3.If(b < low, b, low)
            return low, z3.And(*vote)
        yes = z3.Sum(*[z3.If(v, w, z3.RealVal(0)) for v, w in zip(vote, ws, strict=True)])
        return avg, yes > real(total) / 2

    @staticmethod
    def _split(
        ans: list[z3.BoolRef], score_i: list[z3.ArithRef], vote: list[z3.BoolRef], min_spread: float
    ) -> z3.BoolRef:
        yes = z3.Or(*[z3.And(a, v) for a, v in zip(ans, vote, strict=True)])
        no = z3.Or(*[z3.And(a, z3.Not(v)) for a, v in zip(ans, vote, strict=True)])
        bound = real(min_spread) - real(SPREAD_TOLERANCE)
        pairs = [
            z3.And(ans[i], ans[j], score_i[i] - score_i[j] >= bound)
            for i in range(len(ans))
            for j in range(len(ans))
            if i != j
        ]
        spread = z3.Or(*pairs) if pairs else z3.BoolVal(min_spread <= 0)
        return z3.And(yes, no, spread)

    # -- the decision -------------------------------------------------------------------------

    def without(self, rule: str) -> tuple[DecisionOut, list[z3.BoolRef]]:
        """The decision as if ``rule``'s result were not there (for a rule that stops nothing and
        that no rule reads: the decision of the policy without it), and the definitions it needs."""
        self._sink = []
        try:
            return self._decision(without=rule), self._sink
        finally:
            self._sink = None

    def _decision(self, without: str | None = None) -> DecisionOut:
        passed = []
        worst: z3.ArithRef = action_val(Action.ALLOW)
        unredacted: list[z3.BoolRef] = []
        edits: dict[str, list[z3.BoolRef]] = {}
        for rule in self.order:
            if rule.name == without:
                continue
            out = self.rules[rule.name]
            failed = z3.And(out.ran, z3.Not(out.passed))
            benign = z3.Or(out.action == CODE[Action.CONTINUE], out.action == CODE[Action.ALLOW])
            passed.append(z3.Or(z3.Not(failed), benign))
            tag = f"-without-{without}" if without else ""
            sev = out.severity
            worst_sev = self.define(f"worst_severity_before[{rule.name}]{tag}", severity(worst))
            worst = self.define(
                f"worst_after[{rule.name}]{tag}", z3.If(z3.And(failed, sev > worst_sev), out.action, worst)
            )
            if rule.action is Action.MODIFY:
                unredacted.append(z3.And(out.ran, z3.Not(out.verdict)))
                edits.setdefault(edit_key(rule), []).append(z3.And(out.verdict, z3.Not(out.passed), z3.Not(out.split)))
        return DecisionOut(
            passed=z3.And(*passed) if passed else z3.BoolVal(True),
            action=worst,
            unredacted=z3.Or(*unredacted) if unredacted else z3.BoolVal(False),
            edits={k: z3.Or(*v) for k, v in edits.items()},
        )


def edit_key(rule: Rule) -> str:
    """What a failed ``modify`` rule contributes to the modified response: its evaluators (whose
    spans or violations are redacted) and how (strategy, replacement, preserve_meaning)."""
    cfg = rule.typed_action_config if isinstance(rule.typed_action_config, ModifyConfig) else ModifyConfig()
    names = sorted(
        set(rule.evaluator_names) | ({rule.fallback.evaluator} if rule.fallback and rule.fallback.evaluator else set())
    )
    return json.dumps([names, cfg.strategy.value, cfg.replacement_text, cfg.preserve_meaning])


def _in_range(spec: str, minute_of_day: z3.ArithRef) -> z3.BoolRef:
    """orchestrator/engine/thresholds.py ``in_time_range`` as a formula (checked against it at import)."""
    start_s, end_s = spec.split("-")
    start = int(start_s.split(":")[0]) * 60 + int(start_s.split(":")[1])
    end = int(end_s.split(":")[0]) * 60 + int(end_s.split(":")[1])
    if start == end:
        return z3.BoolVal(True)
    if start < end:
        return z3.And(minute_of_day >= start, minute_of_day < end)
    return z3.Or(minute_of_day >= start, minute_of_day < end)


assert in_time_range("22:00-06:00", 23 * 60) and not in_time_range("09:00-17:00", 17 * 60)  # the same reading
