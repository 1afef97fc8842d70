"""The one calibration method (docs/calibration.md): F1-best threshold on labelled scores, bounded
steps, never below min_feedback_count; the feedback loop that uses it; Wilson precision."""

from __future__ import annotations

import pytest

from crossaudit.kernel.dsl import FeedbackConfig
from crossaudit.service.tenants import TenantFeedback
from orchestrator.engine.calibration import (
    Labelled,
    best_threshold,
    calibrate,
    candidates,
    rule_precision,
    wilson,
)
from orchestrator.engine.thresholds import FEEDBACK_SCORES_PER_RULE, FeedbackStats, feedback_adjusted

# (score, should_pass): a rule passes when its score is at or above its threshold
SEPARABLE = [(0.1, False), (0.2, False), (0.3, False), (0.6, True), (0.7, True), (0.8, True)]


def test_candidates_are_the_ends_the_current_threshold_and_midpoints() -> None:
    assert candidates([0.2, 0.6, 0.6, 0.8], 0.5) == [0.0, 0.4, 0.5, 0.7, 1.0]


def test_the_target_separates_the_labels_and_ties_go_to_the_closest() -> None:
    # every threshold in (0.3, 0.6] gets F1 = 1: the midpoint 0.45 is the only candidate there
    assert best_threshold(SEPARABLE, 0.9) == (pytest.approx(0.45), "f1", 1.0)
    # the current threshold is a candidate: when it is already perfect it stays
    assert best_threshold(SEPARABLE, 0.5)[0] == 0.5


def test_hand_worked_f1_on_overlapping_labels() -> None:
    scored = [(0.1, False), (0.4, True), (0.5, False), (0.9, True)]
    # t = 0.45: fails {0.1, 0.4} -> tp 1, fp 1, fn 1 (0.5): F1 = 2/(2+1+1) = 0.5
    # t = 0.7: fails {0.1, 0.4, 0.5} -> tp 2, fp 1, fn 0: F1 = 4/5 = 0.8 (the best)
    target, objective, value = best_threshold(scored, 0.3)
    assert (target, objective, value) == (0.7, "f1", pytest.approx(0.8))


def test_one_class_of_labels_uses_accuracy() -> None:
    only_fine = [(0.2, True), (0.4, True), (0.9, True)]
    target, objective, value = best_threshold(only_fine, 0.5)
    assert objective == "accuracy" and value == 1.0 and target <= 0.2


def test_steps_are_bounded_and_few_labels_move_nothing() -> None:
    cal = calibrate(0.9, SEPARABLE, max_step=0.1, min_count=3)
    assert cal.target == pytest.approx(0.45) and cal.threshold == pytest.approx(0.8) and cal.labels == 6
    assert calibrate(0.9, SEPARABLE, max_step=1.0, min_count=3).threshold == pytest.approx(0.45)
    stay = calibrate(0.9, SEPARABLE, max_step=0.1, min_count=7)
    assert stay.threshold == 0.9 and stay.target is None and not stay.moved
    # the same labels in another order give the same answer
    assert calibrate(0.9, list(reversed(SEPARABLE)), max_step=0.1, min_count=3) == cal


def test_the_feedback_loop_calibrates_on_labelled_scores() -> None:
    cfg = FeedbackConfig(collect_user_feedback=True, update_model=True, feedback_weight=0.1, min_feedback_count=6)
    stats = FeedbackStats(total=6, false_positive=3, false_negative=3, scores=tuple(SEPARABLE))
    new, why = feedback_adjusted(0.9, cfg, stats)
    assert new == pytest.approx(0.8) and "f1-best 0.45" in why
    # counts without scores (rules that recorded none): the count rule, as before
    counts = FeedbackStats(total=10, false_positive=10)
    assert feedback_adjusted(0.8, cfg, counts)[0] == pytest.approx(0.7)
    few = FeedbackStats(total=5, false_positive=5, scores=tuple(SEPARABLE[:5]))
    assert feedback_adjusted(0.8, cfg, few) == (0.8, "")


def test_tenant_feedback_keeps_the_labelled_scores() -> None:
    fb = TenantFeedback()
    fb.add("p", "r", "false_positive", 0.3)
    fb.add("p", "r", "false_negative", 0.9)
    fb.add("p", "r", "false_negative", None)  # counted, no score
    fb.add("p", "r", "correct", 0.5)  # counted, says nothing about the threshold
    stats = fb("p", "r")
    assert stats == FeedbackStats(total=4, false_positive=1, false_negative=2, scores=((0.3, True), (0.9, False)))
    for _ in range(FEEDBACK_SCORES_PER_RULE + 5):
        fb.add("p", "r", "false_positive", 0.1)
    assert len(fb("p", "r").scores) == FEEDBACK_SCORES_PER_RULE


def test_wilson_interval_matches_the_formula() -> None:
    assert wilson(0, 0) is None
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    low, high = wilson(10, 10)
    assert high == pytest.approx(1.0) and low == pytest.approx(0.7225, abs=1e-4)


def test_precision_counts_labelled_failures_only() -> None:
    labels = [
        Labelled("tox", passed=False, should_pass=False),
        Labelled("tox", passed=False, should_pass=False),
        Labelled("tox", passed=False, should_pass=True),
        Labelled("tox", passed=True, should_pass=False),  # missed: recall, not precision
        Labelled("pii", passed=True, should_pass=True),
    ]
    table = rule_precision(labels)
    assert list(table) == ["pii", "tox"]
    tox = table["tox"]
    assert (tox.count, tox.true_failures, tox.false_failures, tox.missed) == (3, 2, 1, 1)
    assert tox.precision == pytest.approx(2 / 3) and tox.interval == wilson(2, 3)
    assert table["pii"].precision is None and table["pii"].interval is None  # undefined, not 0
