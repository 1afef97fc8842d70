"""Calibration from labels: the one method behind ``feedback_config.update_model`` and the
threshold ``crossaudit eval`` suggests from production labels (docs/calibration.md), and each
rule's measured precision with its Wilson interval (the review console's rules page).

A rule passes when its score is at or above its threshold (``Engine._vote``). A label says
whether the rule *should* have passed. The positive class is "should fail" (what the rule is
there to catch):

- **target**: among the candidate thresholds (0, 1, and the midpoint between each two
  consecutive distinct labelled scores), the one with the highest F1 on the labelled scores
  (precision and recall of "fails" against "should fail"); when the labels hold one class only,
  F1 is undefined and the highest accuracy is used instead. Ties go to the candidate closest to
  the current threshold, then to the lower one: the same labels always give the same target.
- **bounded step**: the new threshold moves from the current one toward the target by at most
  ``max_step`` (the rule's ``feedback_weight``), clamped to [0, 1].
- **never below ``min_feedback_count``**: with fewer labelled scores the threshold stays.

Pure functions of their arguments: no clock, no I/O, no randomness.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# What a feedback label says about its rule: should it have passed? (Other labels say nothing.)
FEEDBACK_SHOULD_PASS = {"false_positive": True, "false_negative": False}
WILSON_Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval
THRESHOLD_DIGITS = 6  # candidate thresholds are rounded to this many decimals (midpoints stay exact enough)


@dataclass(frozen=True)
class Calibration:
    threshold: float  # the new threshold (the current one when nothing moved)
    target: float | None  # the best threshold on the labels (None: too few labels)
    labels: int  # labelled scores used
    objective: str  # "f1" | "accuracy" | "" (not calibrated)
    score: float | None  # the objective's value at the target

    @property
    def moved(self) -> bool:
        return self.target is not None


def _counts(scored: Sequence[tuple[float, bool]], t: float) -> tuple[int, int, int, int]:
    """(tp, fp, fn, tn) with positive = fails (score < t) against should fail (not should_pass)."""
    tp = fp = fn = tn = 0
    for score, should_pass in scored:
        fails = score < t
        if fails and not should_pass:
            tp += 1
        elif fails:
            fp += 1
        elif not should_pass:
            fn += 1
        else:
            tn += 1
    return tp, fp, fn, tn


def f1(tp: int, fp: int, fn: int) -> float | None:
    """F1 of the positive class (None: no positive labelled nor predicted)."""
    return None if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def candidates(scores: Iterable[float], current: float) -> list[float]:
    """0, 1, the current threshold and the midpoints between consecutive distinct scores, sorted."""
    distinct = sorted({min(1.0, max(0.0, s)) for s in scores})
    mids = [(a + b) / 2 for a, b in itertools.pairwise(distinct)]
    return sorted({round(x, THRESHOLD_DIGITS) for x in (0.0, 1.0, current, *mids)})


def best_threshold(scored: Sequence[tuple[float, bool]], current: float) -> tuple[float, str, float]:
    """(target, objective, its value) on ``scored`` = [(score, should_pass)], as the module says."""
    both = any(p for _, p in scored) and any(not p for _, p in scored)
    objective = "f1" if both else "accuracy"
    best: tuple[float, float, float] | None = None  # (-value, distance to current, t): smallest wins
    for t in candidates((s for s, _ in scored), current):
        tp, fp, fn, tn = _counts(scored, t)
        value = f1(tp, fp, fn) if both else (tp + tn) / len(scored)
        key = (-(value or 0.0), abs(t - current), t)
        if best is None or key < best:
            best = key
    assert best is not None  # candidates() is never empty
    return best[2], objective, -best[0]


def calibrate(
    current: float, scored: Sequence[tuple[float, bool]], *, max_step: float, min_count: int
) -> Calibration:
    """The calibrated threshold for labelled ``scored`` = [(score, should_pass)] (module docstring)."""
    usable = [(float(s), bool(p)) for s, p in scored if isinstance(s, int | float) and math.isfinite(s)]
    if not usable or len(usable) < min_count:
        return Calibration(current, None, len(usable), "", None)
    target, objective, value = best_threshold(usable, current)
    step = max(-max_step, min(max_step, target - current))
    new = min(1.0, max(0.0, round(current + step, THRESHOLD_DIGITS)))
    return Calibration(new, target, len(usable), objective, value)


def wilson(successes: int, n: int, z: float = WILSON_Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (None when n is 0: undefined)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Labelled:
    """A label on one rule of one decision: what the rule did and what it should have done."""

    rule: str
    passed: bool  # the recorded verdict
    should_pass: bool


@dataclass(frozen=True)
class RulePrecision:
    """A rule's precision measured from labels: of its labelled failures, the share that should
    have failed. ``precision`` and ``interval`` are None (undefined) without a labelled failure."""

    rule: str
    true_failures: int  # failed, and should have
    false_failures: int  # failed, should have passed (false positives)
    missed: int  # passed, should have failed (false negatives: not part of precision)
    confirmed_passes: int  # passed, and should have

    @property
    def count(self) -> int:
        """Labelled failures: the precision's denominator."""
        return self.true_failures + self.false_failures

    @property
    def precision(self) -> float | None:
        return self.true_failures / self.count if self.count else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson(self.true_failures, self.count)


def rule_precision(labels: Iterable[Labelled]) -> dict[str, RulePrecision]:
    """Per rule, sorted by name."""
    counts: dict[str, list[int]] = {}
    for lab in labels:
        c = counts.setdefault(lab.rule, [0, 0, 0, 0])
        if not lab.passed:
            c[0 if not lab.should_pass else 1] += 1
        else:
            c[2 if not lab.should_pass else 3] += 1
    return {rule: RulePrecision(rule, *counts[rule]) for rule in sorted(counts)}
