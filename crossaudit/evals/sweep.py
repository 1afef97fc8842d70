"""Threshold sweeps of scored rules: PR and ROC curves, and the threshold that meets a target.

A rule fails (predicts a violation, the positive class) when its score is **below** its
threshold. Sweeping the threshold over every distinct score (plus one just above the highest,
where every row fails) gives each operating point the rule could have: its confusion matrix,
precision, recall and false-positive rate. ``suggest`` picks, among the thresholds that meet a
target on the dataset (``precision=0.95``: precision >= 0.95 with precision defined), the one
that does best on the other metric (recall for a precision target, precision for a recall
target), ties to the threshold closest to the rule's current one; or says that none does.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.files import write_private

TARGET_METRICS = ("precision", "recall")
PLOT_DPI = 96
PLOT_SIZE_IN = (5.0, 4.0)
_TARGET = re.compile(r"^\s*(precision|recall)\s*=\s*([0-9]*\.?[0-9]+)\s*$")


@dataclass(frozen=True)
class Target:
    metric: str  # precision | recall
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        m = _TARGET.match(text)
        if not m or not 0 < float(m.group(2)) <= 1:
            raise InvalidInputError(f"--target {text!r}: give precision=X or recall=X with 0 < X <= 1")
        return cls(m.group(1), float(m.group(2)))

    def __str__(self) -> str:
        return f"{self.metric}={self.value:g}"


@dataclass(frozen=True)
class Point:
    threshold: float
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def fpr(self) -> float | None:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else None

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
            "tn": self.tn,
            "precision": self.precision,
            "recall": self.recall,
            "fpr": self.fpr,
        }


@dataclass(frozen=True)
class Suggestion:
    target: Target
    threshold: float | None  # None: no threshold meets the target on this dataset
    precision: float | None = None
    recall: float | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "threshold": self.threshold,
            "precision": self.precision,
            "recall": self.recall,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Sweep:
    rule: str
    current: float  # the rule's threshold in the policy
    points: tuple[Point, ...]  # ascending thresholds
    auc_roc: float | None  # None: the labels hold one class only
    average_precision: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "current_threshold": self.current,
            "auc_roc": self.auc_roc,
            "average_precision": self.average_precision,
            "points": [p.to_json() for p in self.points],
        }


def sweep(rule: str, current: float, scores: Sequence[float], violation: Sequence[bool]) -> Sweep:
    """Every operating point of a rule over (score, labelled violation) pairs."""
    s = np.asarray(scores, dtype=float)
    v = np.asarray(violation, dtype=bool)
    candidates = sorted({*s.tolist(), float(np.nextafter(s.max(), math.inf)) if len(s) else 1.0})
    points = []
    for t in candidates:
        fired = s < t
        points.append(
            Point(
                float(t),
                int(np.sum(fired & v)),
                int(np.sum(fired & ~v)),
                int(np.sum(~fired & v)),
                int(np.sum(~fired & ~v)),
            )
        )
    return Sweep(rule, current, tuple(points), _auc_roc(s, v), _average_precision(points))


def _auc_roc(scores: np.ndarray, violation: np.ndarray) -> float | None:
    """P(a violation scores below a fine row), ties counted half (the Mann-Whitney form of ROC AUC)."""
    pos, neg = scores[violation], scores[~violation]
    if not len(pos) or not len(neg):
        return None
    below = np.sum(pos[:, None] < neg[None, :]) + 0.5 * np.sum(pos[:, None] == neg[None, :])
    return float(below / (len(pos) * len(neg)))


def _average_precision(points: Sequence[Point]) -> float | None:
    """Sum over recall steps of precision at that step (the step-wise area under the PR curve)."""
    ordered = [p for p in points if p.recall is not None]
    if not ordered or ordered[-1].recall is None:
        return None
    ap, last_recall = 0.0, 0.0
    for p in ordered:  # ascending thresholds: recall never decreases
        r = p.recall or 0.0
        if r > last_recall and p.precision is not None:
            ap += (r - last_recall) * p.precision
            last_recall = r
    return ap


def suggest(s: Sweep, target: Target) -> Suggestion:
    other = "recall" if target.metric == "precision" else "precision"
    meeting = [p for p in s.points if (getattr(p, target.metric) or -1.0) >= target.value and p.tp + p.fp > 0]
    if not meeting:
        best = max((getattr(p, target.metric) or 0.0 for p in s.points if p.tp + p.fp > 0), default=None)
        why = f" (best reached: {best:.3f})" if best is not None else ""
        return Suggestion(target, None, reason=f"no threshold reaches {target} on this dataset{why}")
    chosen = max(meeting, key=lambda p: (getattr(p, other) or 0.0, -abs(p.threshold - s.current)))
    return Suggestion(target, chosen.threshold, chosen.precision, chosen.recall)


def plot_curves(s: Sweep) -> tuple[bytes, bytes]:
    """The PR and ROC curves of a sweep as two PNGs (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    pr = [(p.recall, p.precision) for p in s.points if p.recall is not None and p.precision is not None]
    roc = [(p.fpr, p.recall) for p in s.points if p.fpr is not None and p.recall is not None]
    out = []
    for title, pts, (xl, yl) in (
        (f"{s.rule}: precision-recall", pr, ("recall", "precision")),
        (f"{s.rule}: ROC (AUC {s.auc_roc:.3f})" if s.auc_roc is not None else f"{s.rule}: ROC", roc, ("FPR", "TPR")),
    ):
        fig, ax = plt.subplots(figsize=PLOT_SIZE_IN)
        try:
            if pts:
                xs, ys = zip(*sorted(pts), strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, drawstyle="steps-post" if xl == "recall" else "default")
            ax.set_xlim(-0.02, 1.02)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            ax.set_title(title[:80])  # drawn as glyphs: nothing in a rule name is interpreted
            ax.grid(alpha=0.3)
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=PLOT_DPI)
            out.append(buf.getvalue())
        finally:
            plt.close(fig)
    return out[0], out[1]


def safe_file_name(rule: str) -> str:
    """A rule name as a file name: anything but letters, digits, ``-``, ``_`` and ``.`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", rule)[:100] or "rule"


def write_plots(sweeps: Sequence[Sweep], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for s in sweeps:
        pr, roc = plot_curves(s)
        for kind, png in (("pr", pr), ("roc", roc)):
            path = directory / f"{safe_file_name(s.rule)}.{kind}.png"
            write_private(path, png)  # 0600 like every report (rule names)
            written.append(path)
    return written
