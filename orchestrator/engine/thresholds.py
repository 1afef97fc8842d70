"""Static and dynamic thresholds, plus feedback-driven adjustment.

Dynamic: base + user_trust_modifier × trust + content_sensitivity_modifier × sensitivity
+ the first matching time-of-day range's modifier, clamped to [0, 1].
trust = ``user.trust_score`` (0-1), else 1 when ``user.trusted`` is true, else 0;
sensitivity = ``content.sensitivity`` (0-1), else 1 when ``content.sensitive`` is true.
Time ranges are 'HH:MM-HH:MM', start inclusive, end exclusive, and may wrap midnight; the time
of day is ``time.hour`` and ``time.minute`` (the engine's clock, unless the caller pinned them):
a pinned value that is not a whole number in range (0-23, 0-59; a number or its decimal text) is
an InvalidInputError naming the field, never its value. A trust or sensitivity score that is not
a finite number counts as absent (its flag decides).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crossaudit.kernel.dsl import DynamicThresholdConfig, FeedbackConfig, Rule
from crossaudit.kernel.errors import InvalidInputError
from orchestrator.engine.calibration import calibrate
from orchestrator.engine.context import MISSING, lookup


def _unit(ctx: Mapping[str, Any], score_path: str, flag_path: str) -> float:
    v = lookup(ctx, score_path)
    if isinstance(v, int | float) and not isinstance(v, bool):
        try:
            f = float(v)
        except OverflowError:  # an int past a float's range: not a score
            f = math.nan
        if not math.isnan(f):
            return min(1.0, max(0.0, f))
    flag = lookup(ctx, flag_path)
    return 1.0 if flag is True else 0.0


MAX_TIME_TEXT = 4  # " 23 ": a pinned hour or minute given as text is never longer


def _time_part(ctx: Mapping[str, Any], field: str, top: int) -> int | None:
    """``time.<field>`` as a whole number 0..top; None when absent. A number (an integral float
    too: gRPC Structs carry numbers as floats) or its short decimal text; anything else is the
    caller's mistake, named without its value (a log or a reply never quotes it)."""
    v = lookup(ctx, f"time.{field}")
    if v is MISSING:
        return None
    n: int | float | None = None
    if isinstance(v, str) and len(v) <= MAX_TIME_TEXT and v.strip().isascii() and v.strip().isdigit():
        n = int(v.strip())
    elif (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()):
        n = v  # float.is_integer() is False for NaN and the infinities
    if n is None or not 0 <= n <= top:
        raise InvalidInputError(
            f"context time.{field} must be a whole number from 0 to {top} (a time_of_day_modifier reads it), "
            f"not {_kind(v)}"
        )
    return int(n)


def _kind(v: Any) -> str:
    """What a value is, for an error: its type (and for a number, that it is out of range)."""
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "that number"
    if isinstance(v, str):
        return f"text of {len(v)} characters"
    return {list: "a list", dict: "an object", type(None): "null"}.get(type(v), "that value")


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def in_time_range(spec: str, minute_of_day: int) -> bool:
    start_s, end_s = spec.split("-")
    start, end = _minutes(start_s), _minutes(end_s)
    if start == end:
        return True  # the whole day
    if start < end:
        return start <= minute_of_day < end
    return minute_of_day >= start or minute_of_day < end  # wraps midnight


def dynamic_threshold(cfg: DynamicThresholdConfig, ctx: Mapping[str, Any]) -> tuple[float, str]:
    value = cfg.base_threshold
    parts = [f"base {cfg.base_threshold:g}"]
    if cfg.user_trust_modifier:
        trust = _unit(ctx, "user.trust_score", "user.trusted")
        if trust:
            value += cfg.user_trust_modifier * trust
            parts.append(f"trust {cfg.user_trust_modifier * trust:+g}")
    if cfg.content_sensitivity_modifier:
        sens = _unit(ctx, "content.sensitivity", "content.sensitive")
        if sens:
            value += cfg.content_sensitivity_modifier * sens
            parts.append(f"sensitivity {cfg.content_sensitivity_modifier * sens:+g}")
    hour = _time_part(ctx, "hour", 23) if cfg.time_of_day_modifier else None
    if cfg.time_of_day_modifier and hour is not None:
        mod = hour * 60 + (_time_part(ctx, "minute", 59) or 0)
        for spec, delta in cfg.time_of_day_modifier.items():
            if in_time_range(spec, mod):
                value += delta
                parts.append(f"{spec} {delta:+g}")
                break
    clamped = min(1.0, max(0.0, value))
    return clamped, "dynamic threshold " + ", ".join(parts) + f" = {clamped:g}"


@dataclass(frozen=True)
class FeedbackStats:
    """Labels collected for one rule: a false positive = failed but should have passed.
    ``scores``: (recorded score, should it have passed) of the labels whose decision recorded a
    score for the rule (the most recent ones, at most ``FEEDBACK_SCORES_PER_RULE``)."""

    total: int = 0
    false_positive: int = 0
    false_negative: int = 0
    scores: tuple[tuple[float, bool], ...] = ()


FEEDBACK_SCORES_PER_RULE = 1_000  # labelled scores a rule's feedback loop keeps (the most recent)


def feedback_adjusted(threshold: float, cfg: FeedbackConfig | None, stats: FeedbackStats | None) -> tuple[float, str]:
    """Move the threshold toward what reviewers said, once enough feedback exists
    (docs/calibration.md: the one method ``crossaudit eval`` suggests thresholds with).

    With at least ``min_feedback_count`` labelled scores: :func:`calibrate` (the F1-best threshold
    on them, reached by steps of at most ``feedback_weight``). Labels without a recorded score
    (a rule that errored, a record cut down) cannot be calibrated on; when those are what makes
    the count, the counts move it: more false positives lower the threshold (too strict), more
    false negatives raise it, by feedback_weight × (fn - fp) / total (within the same step).
    """
    if cfg is None or not (cfg.collect_user_feedback and cfg.update_model):
        return threshold, ""  # feedback not collected for this rule, or not used
    if stats is None or stats.total < cfg.min_feedback_count:
        return threshold, ""
    if len(stats.scores) >= cfg.min_feedback_count:
        cal = calibrate(threshold, stats.scores, max_step=cfg.feedback_weight, min_count=cfg.min_feedback_count)
        if cal.target is not None:
            return cal.threshold, (
                f"feedback ({cal.labels} labelled scores, {cal.objective}-best {cal.target:g}) "
                f"moved threshold {threshold:g} -> {cal.threshold:g}"
            )
    shift = cfg.feedback_weight * (stats.false_negative - stats.false_positive) / stats.total
    new = min(1.0, max(0.0, threshold + shift))
    return new, f"feedback ({stats.total} labels) moved threshold {threshold:g} -> {new:g}"


def rule_threshold(rule: Rule, ctx: Mapping[str, Any], stats: FeedbackStats | None = None) -> tuple[float, str]:
    if rule.threshold == "dynamic":
        assert rule.threshold_config is not None  # validated
        value, why = dynamic_threshold(rule.threshold_config, ctx)
    else:
        value, why = float(rule.threshold), ""
    adjusted, fb = feedback_adjusted(value, rule.feedback_config, stats)
    return adjusted, "; ".join(x for x in (why, fb) if x)
