"""How a policy test case is judged and explained: one rule for PolicyTester (local) and for
``crossaudit policy test --server`` (a deployed policy), so both count alike.

A case is PASS when the decision matches what it expects, FAIL when it does not, and ERROR when
a rule got no verdict (an evaluator raised or timed out: the decision's ``errored_rules``) or the
request could not be evaluated at all, unless the case expects ``error``. An errored rule is
never a pass: a fail-closed block looks like the "fail" a case expects, for the wrong reason.
Pure functions of the kernel's models, so the counting is tested without a sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from crossaudit.kernel.results import Decision, RuleResult, Status

if TYPE_CHECKING:  # the DSL module is large; judging needs only the case's fields
    from crossaudit.kernel.dsl import TestCase

NO_VERDICT = (Status.ERROR, Status.TIMEOUT)


class CaseStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


@dataclass(frozen=True)
class RuleRow:
    """One rule of a decision as the explanation shows it."""

    rule: str
    status: str
    score: float | None
    threshold: float | None
    action: str | None
    reason: str
    errors: tuple[str, ...] = ()  # "evaluator: ErrorType: message", evaluators that gave no verdict

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status,
            "score": self.score,
            "threshold": self.threshold,
            "action": self.action,
            "reason": self.reason,
            "errors": list(self.errors),
        }


def summary(text: str) -> str:
    """The first line of an error message. CrossAudit's messages say what went wrong on their first
    line and put the rest (how to fix it, the places tried: a missing model's takes a dozen lines)
    on the lines after it, so a table or a one-line report shows this and the whole text once."""
    return text.split("\n", 1)[0].rstrip()


def _evaluator_errors(rule: RuleResult) -> tuple[str, ...]:
    return tuple(
        f"{e.evaluator}: {e.error_type or e.status.value}: {e.error or e.status.value}"
        for e in rule.evaluators
        if e.status in NO_VERDICT
    )


def _own_reason(rule: RuleResult) -> str:
    """The rule's reason without the evaluator errors the engine quotes at its end (``no verdict
    (fail-closed): evaluator: message; ...``): the row's ``errors`` carry them, so a long message
    is not shown twice. A reason that does not end with them (another wording) is kept whole."""
    quoted = [f"{e.evaluator}: {e.error}" for e in rule.evaluators if e.status in NO_VERDICT and e.error]
    for n in range(len(quoted), 0, -1):  # the primaries' errors come first; a failed fallback's after
        tail = ": " + "; ".join(quoted[:n])
        if rule.reason.endswith(tail) and len(rule.reason) > len(tail):
            return rule.reason[: -len(tail)]
    return rule.reason


def rule_rows(decision: Decision) -> list[RuleRow]:
    """Every rule with its status, score, threshold, action, reason and evaluator errors (each error
    once: in ``errors``, not again in the reason)."""
    return [
        RuleRow(
            rule=r.rule,
            status=r.status.value,
            score=r.score,
            threshold=r.threshold,
            action=r.action.value if r.action else None,
            reason=_own_reason(r),
            errors=_evaluator_errors(r),
        )
        for r in decision.rules
    ]


def errored_rules(decision: Decision) -> list[str]:
    """Rules that got no verdict: the decision's ``errored_rules`` plus any rule whose status says so
    (a remote decision carries both; a hand-built one may carry only the statuses)."""
    names = list(decision.errored_rules)
    names += [r.rule for r in decision.rules if r.status in NO_VERDICT and r.rule not in names]
    return names


def _error_text(decision: Decision, errored: list[str], notes: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """Why the rules got no verdict, and the local-vs-server notes of the evaluators involved."""
    parts: list[str] = []
    touched: list[str] = []
    for r in decision.rules:
        if r.rule not in errored:
            continue
        failing = [e for e in r.evaluators if e.status in NO_VERDICT]
        if not failing:
            parts.append(f"{r.rule}: {summary(r.reason or r.status.value)}")
        for e in failing:  # one line (the case's line is one line, for grep); the table has the rest
            parts.append(f"{r.rule}: {e.evaluator}: {summary(e.error or e.status.value)}")
            if e.evaluator in notes and notes[e.evaluator] not in touched:
                touched.append(notes[e.evaluator])
    text = "; ".join(parts)
    if touched:
        text += " (local results may differ from the server's: " + "; ".join(touched) + ")"
    return text, tuple(touched)


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome. ``ok`` is ``status is PASS`` (kept for callers of the first API)."""

    name: str
    ok: bool
    expected: str
    actual: str
    decision: Decision | None = None
    error: str | None = None
    status: CaseStatus | None = None  # None: PASS when ok, else ERROR with an error, else FAIL
    duration_s: float = 0.0
    notes: tuple[str, ...] = field(default=())  # local-vs-server differences that touch this case

    def __post_init__(self) -> None:
        if self.status is None:
            derived = CaseStatus.PASS if self.ok else CaseStatus.ERROR if self.error else CaseStatus.FAIL
            object.__setattr__(self, "status", derived)

    def line(self) -> str:
        """``PASS  name: actual``, ``FAIL  name: expected X, got Y``, ``ERROR name: ...: why``."""
        if self.status is CaseStatus.PASS:
            return f"PASS  {self.name}: {self.actual}"
        mark = "FAIL " if self.status is CaseStatus.FAIL else "ERROR"
        why = f": {self.error}" if self.error else ""
        return f"{mark} {self.name}: expected {self.expected}, got {self.actual}{why}"

    def rows(self) -> list[RuleRow]:
        return rule_rows(self.decision) if self.decision is not None else []

    def as_dict(self) -> dict[str, Any]:
        d = self.decision
        return {
            "name": self.name,
            "status": (self.status or CaseStatus.FAIL).value,
            "expected": self.expected,
            "actual": self.actual,
            "error": self.error,
            "notes": list(self.notes),
            "duration_s": round(self.duration_s, 6),
            "decision": None
            if d is None
            else {
                "decision_id": d.decision_id,
                "passed": d.passed,
                "action": d.action.value,
                "errored_rules": errored_rules(d),
                "modified_response": d.modified_response,
            },
            "rules": [r.as_dict() for r in self.rows()],
        }


def expected_text(case: TestCase) -> str:
    return case.expected_result + (f"/{case.expected_action.value}" if case.expected_action else "")


def judge_case(
    case: TestCase,
    decision: Decision | None,
    error: str | None = None,
    *,
    duration_s: float = 0.0,
    notes: Mapping[str, str] | None = None,
) -> CaseResult:
    """The outcome of ``case`` given its decision (or, when it could not be evaluated, ``error``).

    ``notes``: evaluator name → why local results may differ from the server's; a note is added to
    the error of a case whose errored rules involve that evaluator."""
    notes = notes or {}
    expected = expected_text(case)
    if decision is None:
        expects_error = case.expected_result == "error"
        status = CaseStatus.ERROR if not expects_error else CaseStatus.FAIL if case.expected_action else CaseStatus.PASS
        actual = "error (no decision)"
        return CaseResult(
            case.name, status is CaseStatus.PASS, expected, actual, None, error or "no decision", status, duration_s
        )
    errored = errored_rules(decision)
    result = "error" if errored else "pass" if decision.passed else "fail"
    actual = f"{result}/{decision.action.value}"
    why, touched = (None, ()) if not errored else _error_text(decision, errored, notes)
    if errored:
        actual += f" (errored rules: {', '.join(errored)})"
    action_ok = case.expected_action is None or decision.action is case.expected_action
    if result == case.expected_result and action_ok:
        status = CaseStatus.PASS
    elif errored and case.expected_result != "error":
        status = CaseStatus.ERROR
    else:
        status = CaseStatus.FAIL
    return CaseResult(
        case.name, status is CaseStatus.PASS, expected, actual, decision, why, status, duration_s, touched
    )


@dataclass
class Tally:
    """Counts over cases: what every report's summary line says."""

    passed: int = 0
    failed: int = 0
    errors: int = 0

    def add(self, status: CaseStatus) -> None:
        if status is CaseStatus.PASS:
            self.passed += 1
        elif status is CaseStatus.FAIL:
            self.failed += 1
        else:
            self.errors += 1

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0

    def line(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.errors} error{'' if self.errors == 1 else 's'}"
