"""crossaudit.evals.metrics and sweep: values worked out by hand, and checked against scikit-learn."""

from __future__ import annotations

import math

import pytest
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    confusion_matrix,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)

from crossaudit.evals.metrics import Confusion, mcnemar, mcnemar_counts, metrics_with_ci, point_metrics
from crossaudit.evals.sweep import Target, suggest, sweep
from crossaudit.kernel.errors import InvalidInputError

# A hand-labelled set of ten answers (True = a violation, the rule should fail) and what a rule said.
EXPECTED = [True, True, True, True, False, False, False, False, False, False]
PREDICTED = [True, True, True, False, True, True, False, False, False, False]
# Scores of the same ten rows (the rule fails below its threshold of 0.5): PREDICTED == score < 0.5.
SCORES = [0.05, 0.2, 0.3, 0.7, 0.4, 0.45, 0.6, 0.8, 0.9, 0.95]


def test_metrics_match_the_hand_computation() -> None:
    c = Confusion.of(EXPECTED, PREDICTED)
    assert (c.tp, c.fp, c.fn, c.tn) == (3, 2, 1, 4)
    m = point_metrics(c)
    assert m["precision"].value == pytest.approx(3 / 5)  # tp / (tp + fp)
    assert m["recall"].value == pytest.approx(3 / 4)  # tp / (tp + fn)
    assert m["f1"].value == pytest.approx(2 * 0.6 * 0.75 / (0.6 + 0.75))  # = 2/3
    assert m["f1"].value == pytest.approx(2 / 3)
    assert m["accuracy"].value == pytest.approx(7 / 10)


def test_metrics_match_scikit_learn() -> None:
    c, m = metrics_with_ci(EXPECTED, PREDICTED, seed=0)
    tn, fp, fn, tp = confusion_matrix(EXPECTED, PREDICTED, labels=[False, True]).ravel()
    assert (c.tp, c.fp, c.fn, c.tn) == (tp, fp, fn, tn)
    assert m["precision"].value == pytest.approx(precision_score(EXPECTED, PREDICTED))
    assert m["recall"].value == pytest.approx(recall_score(EXPECTED, PREDICTED))
    assert m["f1"].value == pytest.approx(f1_score(EXPECTED, PREDICTED))
    assert m["accuracy"].value == pytest.approx(accuracy_score(EXPECTED, PREDICTED))


def test_intervals_are_reproducible_and_hold_the_point_value() -> None:
    _, a = metrics_with_ci(EXPECTED * 5, PREDICTED * 5, seed=7)
    _, b = metrics_with_ci(EXPECTED * 5, PREDICTED * 5, seed=7)
    _, other = metrics_with_ci(EXPECTED * 5, PREDICTED * 5, seed=8)
    assert a == b
    assert a != other
    for metric in a.values():
        assert metric.low is not None and metric.high is not None
        assert 0.0 <= metric.low <= metric.value <= metric.high <= 1.0
        assert metric.high > metric.low


def test_no_positives_is_undefined_not_zero() -> None:
    expected = [False] * 6
    predicted = [False, True, False, False, False, False]
    _, m = metrics_with_ci(expected, predicted)
    assert m["recall"].value is None and "no labelled violation" in m["recall"].reason
    assert m["f1"].value is None and m["f1"].reason
    assert m["precision"].value == 0.0  # the rule fired once, wrongly: defined, and 0
    assert m["accuracy"].value == pytest.approx(5 / 6)
    assert m["recall"].to_json() == {"value": None, "undefined": m["recall"].reason}
    # scikit-learn answers 0 here (zero_division): what an author could mistake for a measured 0
    assert recall_score(expected, predicted, zero_division=0) == 0


def test_never_fired_makes_precision_undefined() -> None:
    _, m = metrics_with_ci([True, False, False], [False, False, False])
    assert m["precision"].value is None and "never predicted" in m["precision"].reason
    assert m["recall"].value == 0.0
    assert m["precision"].low is None


def test_mcnemar_exact_matches_the_hand_computation() -> None:
    # A right and B wrong on 1 row, B right and A wrong on 7: n = 8 discordant, exact binomial,
    # p = 2 * (C(8,0) + C(8,1)) / 2^8 = 18 / 256
    a_right = [True] * 10 + [True] + [False] * 7
    b_right = [True] * 10 + [False] + [True] * 7
    t = mcnemar(a_right, b_right)
    assert (t.b, t.c, t.method) == (1, 7, "exact")
    assert t.p_value == pytest.approx(18 / 256)
    assert not t.significant


def test_mcnemar_chi_square_with_continuity() -> None:
    # b = 10, c = 25: (|10 - 25| - 1)^2 / 35 = 196 / 35 = 5.6; chi-square(1) survival at 5.6 = 0.01796
    t = mcnemar_counts(10, 25)
    assert t.method == "chi2"
    assert t.statistic == pytest.approx(5.6)
    assert t.p_value == pytest.approx(0.017960, abs=1e-5)
    assert t.significant
    assert mcnemar_counts(0, 0).p_value == 1.0


def test_sweep_auc_and_average_precision_match_scikit_learn() -> None:
    s = sweep("r", 0.5, SCORES, EXPECTED)
    # a violation is a low score: scikit-learn's scores rank positives high, so negate
    neg = [-x for x in SCORES]
    assert s.auc_roc == pytest.approx(roc_auc_score(EXPECTED, neg))
    assert s.average_precision == pytest.approx(average_precision_score(EXPECTED, neg))
    at_current = next(p for p in s.points if p.threshold == 0.6)  # score < 0.6 == score < 0.5 here
    assert (at_current.tp, at_current.fp, at_current.fn, at_current.tn) == (3, 2, 1, 4)
    assert s.points[-1].tp + s.points[-1].fp == len(SCORES)  # above the highest score: everything fails


@pytest.mark.parametrize("target", ["precision=0.9", "recall=0.9", "precision=0.6", "recall=0.5"])
def test_the_suggested_threshold_meets_its_target(target: str) -> None:
    t = Target.parse(target)
    g = suggest(sweep("r", 0.5, SCORES, EXPECTED), t)
    assert g.threshold is not None
    fired = [x < g.threshold for x in SCORES]
    _, m = metrics_with_ci(EXPECTED, fired)
    value = m[t.metric].value
    assert value is not None and value >= t.value
    assert (g.precision, g.recall) == pytest.approx((m["precision"].value, m["recall"].value))


def test_a_target_no_threshold_meets_is_said() -> None:
    scores = [0.1, 0.2, 0.3, 0.4]
    violation = [False, True, False, True]  # the lowest score is fine: precision 1.0 is out of reach
    g = suggest(sweep("r", 0.5, scores, violation), Target.parse("precision=1"))
    assert g.threshold is None
    assert "no threshold reaches precision=1" in g.reason


@pytest.mark.parametrize("text", ["precision", "precision=0", "recall=1.5", "f1=0.9", "precision=x"])
def test_bad_targets_are_refused(text: str) -> None:
    with pytest.raises(InvalidInputError):
        Target.parse(text)


def test_undefined_roc_auc_with_one_class() -> None:
    s = sweep("r", 0.5, [0.2, 0.9], [False, False])
    assert s.auc_roc is None
    assert not math.isnan(s.points[0].threshold)
