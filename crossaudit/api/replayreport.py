"""What a replay found: a recorded decision against the candidate's, and the report adding them up.

Pure data and arithmetic (no store, no engine), so the CLI renders the same report the server
computed and the comparison is tested on its own.

- A decision is *changed* when the candidate's ``passed`` or ``action`` differs from the
  recorded one; these are the flips ``--fail-on-flips`` counts. ``pass_to_fail`` and
  ``fail_to_pass`` count the ``passed`` changes; ``action_changes`` counts each
  ``recorded->candidate`` pair of actions (``warn->block``), so one decision may be in both.
- Per rule: ``pass_to_fail`` / ``fail_to_pass`` of the rule's own verdict, and ``score_shifts``
  where both have a score and it moved by more than :data:`SCORE_EPSILON`. A rule only the
  candidate has is ``added`` (its failures are counted as pass→fail of an implicit pass), one
  only the record has is ``removed`` (its recorded failures count as fail→pass).
- Decisions that could not be replayed are counted by reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crossaudit.kernel.results import Decision, Status

SCORE_EPSILON = 1e-9  # scores closer than this are the same score (float noise, not a shift)


@dataclass
class Bucket:
    """How many decisions fell in one category, and the first few of their ids."""

    count: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, decision_id: str, max_samples: int) -> None:
        self.count += 1
        if len(self.samples) < max_samples:
            self.samples.append(decision_id)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "samples": list(self.samples)}


@dataclass
class RuleDiff:
    rule: str
    change: str = "same"  # same | added | removed (the rule's presence in the two versions)
    compared: int = 0  # decisions where the rule was compared
    pass_to_fail: Bucket = field(default_factory=Bucket)
    fail_to_pass: Bucket = field(default_factory=Bucket)
    score_shifts: Bucket = field(default_factory=Bucket)
    total_shift: float = 0.0  # sum of (candidate - recorded) over score_shifts
    max_shift: float = 0.0  # the largest |candidate - recorded|

    @property
    def mean_shift(self) -> float:
        return self.total_shift / self.score_shifts.count if self.score_shifts.count else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "change": self.change,
            "compared": self.compared,
            "pass_to_fail": self.pass_to_fail.to_json(),
            "fail_to_pass": self.fail_to_pass.to_json(),
            "score_shifts": self.score_shifts.to_json(),
            "mean_shift": self.mean_shift,
            "max_shift": self.max_shift,
        }


@dataclass(frozen=True)
class ReplayProgress:
    read: int  # records read so far
    replayed: int
    not_replayable: int
    limit: int  # the most records this replay reads
    message: str = ""


@dataclass
class LLMEstimate:
    """What a ``--rerun-llm`` replay of the same range would spend on LLM calls (an upper bound:
    every LLM judge of an enabled rule without a recorded verdict is counted, reached or not)."""

    calls: int = 0
    decisions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_models: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "decisions": self.decisions,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "unpriced_models": sorted(self.unpriced_models),
        }


@dataclass
class ReplayReport:
    policy: str  # the policy replayed against (whose records were read)
    candidate: str  # the candidate's name
    environment: str
    since: float | None = None
    until: float | None = None
    read: int = 0  # audit records read
    replayed: int = 0  # re-evaluated under the candidate
    unchanged: int = 0
    changed: Bucket = field(default_factory=Bucket)  # passed or action differs: the flips
    pass_to_fail: Bucket = field(default_factory=Bucket)
    fail_to_pass: Bucket = field(default_factory=Bucket)
    action_changes: dict[str, Bucket] = field(default_factory=dict)  # "warn->block" -> bucket
    not_replayable: dict[str, Bucket] = field(default_factory=dict)  # reason -> bucket
    rules: dict[str, RuleDiff] = field(default_factory=dict)
    more: bool = False  # the limit was reached with records left in the range
    evaluator_runs: int = 0  # evaluator calls the candidate made (what was not recorded), per decision added up
    hint: str = ""  # what to do about what was not replayable (turning retention on)
    estimate: LLMEstimate | None = None  # estimate_only: the LLM calls a --rerun-llm replay would make
    max_samples: int = 10

    @property
    def flips(self) -> int:
        return self.changed.count

    @property
    def not_replayable_count(self) -> int:
        return sum(b.count for b in self.not_replayable.values())

    def unreplayable(self, decision_id: str, reason: str) -> None:
        self.not_replayable.setdefault(reason, Bucket()).add(decision_id, self.max_samples)

    def compare(self, recorded: RecordedDecision, candidate: Decision) -> None:
        """Add one replayed decision: ``recorded`` as audited, ``candidate`` as re-evaluated."""
        n, did = self.max_samples, recorded.decision_id
        self.replayed += 1
        # evaluators called (rules sharing one call count it once); recorded results have no attempts
        self.evaluator_runs += len(
            {e.evaluator for r in candidate.rules for e in r.evaluators if e.attempts > 0 and not e.cached}
        )
        action = candidate.action.value
        if recorded.passed and not candidate.passed:
            self.pass_to_fail.add(did, n)
        elif not recorded.passed and candidate.passed:
            self.fail_to_pass.add(did, n)
        if recorded.action != action:
            self.action_changes.setdefault(f"{recorded.action}->{action}", Bucket()).add(did, n)
        if recorded.passed != candidate.passed or recorded.action != action:
            self.changed.add(did, n)
        else:
            self.unchanged += 1
        now = {r.rule: r for r in candidate.rules if r.status is not Status.SKIPPED}
        before = {name: r for name, r in recorded.rules.items() if r.get("status") != Status.SKIPPED.value}
        for name in now.keys() | before.keys():
            diff = self.rules.get(name)
            if diff is None:
                diff = self.rules[name] = RuleDiff(name, change=recorded.presence(name, candidate))
            c, r = now.get(name), before.get(name)
            diff.compared += 1
            was_passed = True if r is None else bool(r.get("passed", True))
            is_passed = True if c is None else c.passed
            if was_passed and not is_passed:
                diff.pass_to_fail.add(did, n)
            elif not was_passed and is_passed:
                diff.fail_to_pass.add(did, n)
            old = r.get("score") if r is not None else None
            new = c.score if c is not None else None
            if isinstance(old, int | float) and new is not None and abs(new - float(old)) > SCORE_EPSILON:
                delta = new - float(old)
                diff.score_shifts.add(did, n)
                diff.total_shift += delta
                diff.max_shift = max(diff.max_shift, abs(delta))

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "candidate": self.candidate,
            "environment": self.environment,
            "since": self.since,
            "until": self.until,
            "read": self.read,
            "replayed": self.replayed,
            "unchanged": self.unchanged,
            "flips": self.flips,
            "changed": self.changed.to_json(),
            "pass_to_fail": self.pass_to_fail.to_json(),
            "fail_to_pass": self.fail_to_pass.to_json(),
            "action_changes": {k: b.to_json() for k, b in sorted(self.action_changes.items())},
            "not_replayable": {k: b.to_json() for k, b in sorted(self.not_replayable.items())},
            "not_replayable_total": self.not_replayable_count,
            "rules": [d.to_json() for d in self.sorted_rules()],
            "more": self.more,
            "evaluator_runs": self.evaluator_runs,
            "hint": self.hint,
            "estimate": self.estimate.to_json() if self.estimate is not None else None,
        }

    def sorted_rules(self) -> list[RuleDiff]:
        """Rules with the most flips first, then by name."""
        return sorted(self.rules.values(), key=lambda d: (-(d.pass_to_fail.count + d.fail_to_pass.count), d.rule))


@dataclass(frozen=True)
class RecordedDecision:
    """What the audit record says was decided (rules by name: status, passed, score, action)."""

    decision_id: str
    passed: bool
    action: str
    rules: Mapping[str, Mapping[str, Any]]  # every rule of the recorded version, skipped ones too

    @classmethod
    def of(cls, decision_id: str, passed: bool, action: str, rules: Iterable[Any]) -> RecordedDecision:
        by_name = {str(r["rule"]): r for r in rules if isinstance(r, Mapping) and "rule" in r}
        return cls(decision_id, passed, action, by_name)

    def presence(self, rule: str, candidate: Decision) -> str:
        """Whether the rule is in both versions (a decision lists every rule, skipped ones too)."""
        in_candidate = any(r.rule == rule for r in candidate.rules)
        if rule not in self.rules and in_candidate:
            return "added"
        if rule in self.rules and not in_candidate:
            return "removed"
        return "same"
