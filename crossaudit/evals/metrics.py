"""Confusion matrices, precision/recall/F1/accuracy with bootstrap confidence intervals, McNemar.

The *positive* class is a violation: a rule that fails (``fail`` label), a decision that does
not pass. So precision answers "of what the rule blocked, how much deserved it" and recall "of
what deserved it, how much the rule caught".

A metric whose denominator is zero is **undefined**, never 0: ``value`` is None and ``reason``
says why (no positives in the labels: recall undefined; the rule never fired: precision
undefined; F1 is undefined when either is). Confidence intervals are percentile bootstrap
intervals (:data:`BOOTSTRAP_RESAMPLES` resamples of the rows with replacement, numpy's PCG64 with
a fixed seed, so a run is reproducible); resamples in which the metric is undefined are left
out, and an interval from fewer than :data:`BOOTSTRAP_MIN_DEFINED` defined resamples is not given.

McNemar's test compares two policies on the same rows: ``b`` rows only A got right, ``c`` rows
only B got right. With fewer than :data:`MCNEMAR_EXACT_BELOW` discordant rows it is the exact
two-sided binomial test (p = min(1, 2 · P[X <= min(b, c)]), X ~ Binomial(b + c, 1/2)); otherwise
the chi-square statistic with Edwards' continuity correction, (|b - c| - 1)² / (b + c), on one
degree of freedom. No discordant row: p = 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_MIN_DEFINED = 100  # fewer defined resamples than this: no interval
CONFIDENCE = 0.95
MCNEMAR_EXACT_BELOW = 25  # discordant pairs below this: exact binomial test
SIGNIFICANCE = 0.05  # the p-value below which a compare calls a difference significant
METRICS = ("precision", "recall", "f1", "accuracy")


@dataclass(frozen=True)
class Confusion:
    """Counts with a violation as the positive class."""

    tp: int  # labelled violation, predicted violation
    fp: int  # labelled fine, predicted violation
    fn: int  # labelled violation, predicted fine
    tn: int  # labelled fine, predicted fine

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    @classmethod
    def of(cls, expected: Sequence[bool], predicted: Sequence[bool]) -> Confusion:
        """``expected``/``predicted``: True = violation (positive)."""
        e = np.asarray(expected, dtype=bool)
        p = np.asarray(predicted, dtype=bool)
        return cls(tp=int(np.sum(e & p)), fp=int(np.sum(~e & p)), fn=int(np.sum(e & ~p)), tn=int(np.sum(~e & ~p)))

    def to_json(self) -> dict[str, int]:
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn, "tn": self.tn}


@dataclass(frozen=True)
class Metric:
    value: float | None  # None: undefined (``reason`` says why)
    reason: str = ""
    low: float | None = None  # the bootstrap interval, when there is one
    high: float | None = None

    @property
    def defined(self) -> bool:
        return self.value is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value}
        if self.value is None:
            out["undefined"] = self.reason
        if self.low is not None:
            out["ci95"] = [self.low, self.high]
        return out

    def text(self) -> str:
        if self.value is None:
            return "undefined"
        ci = f" [{self.low:.2f}-{self.high:.2f}]" if self.low is not None and self.high is not None else ""
        return f"{self.value:.3f}{ci}"


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def point_metrics(c: Confusion) -> dict[str, Metric]:
    """Precision, recall, F1, accuracy of one confusion matrix (undefined ones said so)."""
    precision = _ratio(c.tp, c.tp + c.fp)
    recall = _ratio(c.tp, c.tp + c.fn)
    out = {
        "precision": Metric(precision, "" if precision is not None else "never predicted a violation (tp + fp = 0)"),
        "recall": Metric(recall, "" if recall is not None else "no labelled violation (tp + fn = 0)"),
        "accuracy": Metric(_ratio(c.tp + c.tn, c.n), "" if c.n else "no labelled rows"),
    }
    if precision is None or recall is None:
        out["f1"] = Metric(None, "precision or recall is undefined")
    else:
        out["f1"] = Metric(_ratio(2 * c.tp, 2 * c.tp + c.fp + c.fn) or 0.0)
    return {k: out[k] for k in METRICS}


def _vectorised(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, tn: np.ndarray) -> dict[str, np.ndarray]:
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), np.nan)
        recall = np.where(tp + fn > 0, tp / (tp + fn), np.nan)
        f1 = np.where(
            np.isnan(precision) | np.isnan(recall),
            np.nan,
            np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0),
        )
        n = tp + fp + fn + tn
        accuracy = np.where(n > 0, (tp + tn) / n, np.nan)
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}


def metrics_with_ci(
    expected: Sequence[bool], predicted: Sequence[bool], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[Confusion, dict[str, Metric]]:
    """The confusion matrix and each metric with its percentile bootstrap interval."""
    c = Confusion.of(expected, predicted)
    points = point_metrics(c)
    n = c.n
    if n == 0:
        return c, points
    e = np.asarray(expected, dtype=bool)
    p = np.asarray(predicted, dtype=bool)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    es, ps = e[idx], p[idx]
    counts = [np.sum(a, axis=1).astype(float) for a in (es & ps, ~es & ps, es & ~ps, ~es & ~ps)]
    samples = _vectorised(*counts)
    alpha = (1 - CONFIDENCE) / 2
    out = {}
    for name, m in points.items():
        s = samples[name]
        s = s[~np.isnan(s)]
        if m.value is None or len(s) < BOOTSTRAP_MIN_DEFINED:
            out[name] = m
            continue
        low, high = np.quantile(s, [alpha, 1 - alpha])
        out[name] = Metric(m.value, m.reason, float(low), float(high))
    return c, out


@dataclass(frozen=True)
class McNemar:
    b: int  # rows only A got right
    c: int  # rows only B got right
    p_value: float
    method: str  # "exact" | "chi2" | "none"
    statistic: float | None = None

    @property
    def significant(self) -> bool:
        return self.p_value < SIGNIFICANCE

    def to_json(self) -> dict[str, Any]:
        return {
            "a_only_right": self.b,
            "b_only_right": self.c,
            "p_value": self.p_value,
            "method": self.method,
            "statistic": self.statistic,
            "significant": self.significant,
        }


def mcnemar(a_right: Sequence[bool], b_right: Sequence[bool]) -> McNemar:
    """McNemar's paired test of two classifiers' correctness on the same rows (module docstring)."""
    a = np.asarray(a_right, dtype=bool)
    b_ = np.asarray(b_right, dtype=bool)
    b = int(np.sum(a & ~b_))
    c = int(np.sum(~a & b_))
    return mcnemar_counts(b, c)


def mcnemar_counts(b: int, c: int) -> McNemar:
    n = b + c
    if n == 0:
        return McNemar(b, c, 1.0, "none")
    if n < MCNEMAR_EXACT_BELOW:
        k = min(b, c)
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        return McNemar(b, c, min(1.0, 2 * tail), "exact")
    stat = (abs(b - c) - 1) ** 2 / n
    return McNemar(b, c, math.erfc(math.sqrt(stat / 2)), "chi2", stat)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` (0..1) percentile, linear interpolation (numpy's default); None for no values."""
    if not len(values):
        return None
    return float(np.quantile(np.asarray(values, dtype=float), q))
