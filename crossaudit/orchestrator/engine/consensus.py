"""Combining several evaluators into one rule score.

- weighted_average: score = Σ wᵢ·sᵢ / Σ wᵢ; passes when score ≥ threshold.
- majority: each evaluator votes (pass = its score clears the threshold and it did not
  say ``passed: false``); passes when the passing weight is strictly more than half.
  Score reported: the weighted average.
- unanimous: passes when every evaluator votes pass. Score reported: the minimum.
An evaluator with no verdict (error/timeout) votes fail with score 0 (fail-closed).
"""

from __future__ import annotations

from dataclasses import dataclass

from crossaudit.kernel.dsl import ConsensusStrategy


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
