"""Combining several evaluators into one rule score.

- weighted_average: score = Σ wᵢ·sᵢ / Σ wᵢ; passes when score ≥ threshold.
- majority: each evaluator votes (pass = its score clears the threshold and it did not
  say ``passed: false``); passes when the passing weight is strictly more than half.
  Score reported: the weighted average.
- unanimous: passes when every evaluator votes pass. Score reported: the minimum.
An evaluator with no verdict (error/timeout) votes fail with score 0 (fail-closed).

Disagreement (``on_disagreement``): among the evaluators that gave a verdict, at least one votes
pass and one votes fail, and their scores spread (highest minus lowest) by at least
``min_spread``. Evaluators without a verdict are left out: an outage is handled by the
fail-closed vote and ``fallback``, not sent to a person as a difference of opinion.
"""

from __future__ import annotations

from dataclasses import dataclass

from crossaudit.kernel.dsl import ConsensusStrategy

SPREAD_TOLERANCE = 1e-9  # float subtraction must not turn a spread equal to min_spread into less


@dataclass(frozen=True)
class Ballot:
    score: float | None  # None: the evaluator gave no verdict
    weight: float
    vote: bool


def combine(strategy: ConsensusStrategy, ballots: list[Ballot], threshold: float) -> tuple[float, bool, str]:
    """Returns (score, passed, explanation)."""
    scores = [(b.score if b.score is not None else 0.0, b.weight) for b in ballots]
    total = sum(w for _, w in scores) or 1.0
    avg = sum(s * w for s, w in scores) / total
    if strategy is ConsensusStrategy.WEIGHTED_AVERAGE:
        return avg, avg >= threshold, f"weighted average {avg:.3f} of {len(ballots)} evaluators"
    if strategy is ConsensusStrategy.UNANIMOUS:
        low = min(s for s, _ in scores)
        ok = all(b.vote and b.score is not None for b in ballots)
        return low, ok, f"unanimous: {sum(b.vote for b in ballots)} of {len(ballots)} voted pass"
    yes = sum(b.weight for b in ballots if b.vote and b.score is not None)
    return avg, yes > total / 2, f"majority: {yes:g} of {total:g} weight voted pass"


def disagreement(ballots: list[Ballot], min_spread: float) -> str | None:
    """A description of the split when the verdicts disagree (see the module doc), else None."""
    voted = [b for b in ballots if b.score is not None]
    yes = sum(1 for b in voted if b.vote)
    no = len(voted) - yes
    if not yes or not no:
        return None
    scores = [b.score for b in voted if b.score is not None]
    spread = max(scores) - min(scores)
    if spread < min_spread - SPREAD_TOLERANCE:  # 0.7 - 0.4 is 0.2999…: still a spread of 0.30
        return None
    return f"evaluators disagree: {yes} pass / {no} fail, spread {spread:.2f} >= {min_spread:.2f}; sent to review"
