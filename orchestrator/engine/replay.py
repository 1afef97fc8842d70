"""Evaluating a recorded decision again under another policy version (``policy replay``).

The engine takes a :class:`Replay` beside the request: the verdicts recorded with the decision,
keyed by the engine's cache identity (tenant scope, evaluator identity, spec as written: what
:attr:`EvaluatorResult.identity` carries), the decision's recorded time, and what may run.

- An evaluator whose identity has a recorded verdict is not called: the recorded result stands
  (no call, no result cache, no rate-limit token). A threshold-only change runs no evaluator.
- One without a recorded verdict runs for real when ``may_run(kind)`` allows it (custom code and
  builtins by default; LLM judges only with ``--rerun-llm``); otherwise the decision is not
  replayable (:class:`Unreplayable`), raised as ``NotReplayableError`` with that reason.
- ``time.*`` and every timestamp of the decision are those of ``at``, the recorded time, so
  time-of-day conditions and thresholds see the hour the decision was made in.
- ``live=True`` is a shadow's (``crossaudit.governance.rollout``): the live decision just made, its
  verdicts reused the same way, every evaluator allowed to run, and one that gives no verdict (or
  does not build) fails its rule as it would live instead of making the decision not replayable.
  Rules run one after the other as in any replay, so nothing is called speculatively for a rule
  the decision then skips (the live path starts every rule at once).
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from crossaudit.kernel.results import EvaluatorResult

LLM_KIND = "llm"


class Unreplayable(StrEnum):
    """Why a recorded decision was not re-evaluated: the stable codes a replay counts by."""

    NOT_RETAINED = "not_retained"  # the policy did not retain this decision's inputs
    EXPIRED = "expired"  # retained, but the retention period is over
    ERASED = "erased"  # retained, then erased on request (audit erase)
    LLM_CHANGED = "llm_changed"  # an LLM judge changed (its recorded verdict is another identity's), no --rerun-llm
    LLM_NOT_RECORDED = "llm_not_recorded"  # an LLM judge the recorded decision never asked (its rule was not
    # reached: stopped, skipped), no --rerun-llm
    EVALUATOR_CHANGED = "evaluator_changed"  # another evaluator without a recorded verdict, not allowed to run
    BUILD_FAILED = "evaluator_build_failed"  # the candidate's evaluator could not be built here
    EVALUATOR_FAILED = "evaluator_failed"  # an evaluator that ran again gave no verdict (error, timeout, rate limit)
    INVALID_INPUT = "invalid_input"  # the retained inputs are refused by the engine's limits now


def llm_only_with_permission(rerun_llm: bool) -> Callable[[str], bool]:
    """The run permission of a replay: every kind may run again except LLM judges, which only
    with ``rerun_llm`` (they cost money and answer differently from one call to the next)."""
    return lambda kind: rerun_llm or kind != LLM_KIND


class RecordedResults(Mapping[str, EvaluatorResult]):
    """Recorded evaluator results by identity, as retained (JSON documents), each validated into
    an :class:`EvaluatorResult` the first time it is asked for: a replay asks for few of them."""

    def __init__(self, documents: Mapping[str, Mapping[str, Any]]) -> None:
        self._documents = documents
        self._results: dict[str, EvaluatorResult] = {}

    def __getitem__(self, identity: str) -> EvaluatorResult:
        found = self._results.get(identity)
        if found is None:
            found = self._results[identity] = EvaluatorResult.model_validate(self._documents[identity])
        return found

    def result(self, identity: str, **changes: Any) -> EvaluatorResult | None:
        """A new result validated from the document of ``identity`` with ``changes`` (None: none is
        recorded), for one rule to set its status on: cheaper than validating once and copying for
        every rule that uses it. Nested details are copied deeply, as the engine's own copies are."""
        document = self._documents.get(identity)
        if document is None:
            return None
        found = EvaluatorResult.model_validate({**document, **changes})
        if any(isinstance(v, dict | list) for v in found.details.values()):
            found.details = copy.deepcopy(found.details)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._documents)

    def __len__(self) -> int:
        return len(self._documents)

    def __contains__(self, identity: object) -> bool:
        return identity in self._documents


@dataclass(frozen=True)
class Replay:
    results: Mapping[str, EvaluatorResult]  # recorded verdicts by identity
    at: dt.datetime  # when the decision was made (aware)
    may_run: Callable[[str], bool] = field(default=llm_only_with_permission(False))
    live: bool = False  # a shadow of live traffic (module docstring): errors stand, no NotReplayableError


def run_everything(_kind: str) -> bool:
    """The run permission of a shadow: it is live traffic, so every kind runs (LLM judges too)."""
    return True


def unreplayable_reason(kind: str, name: str, results: Mapping[str, EvaluatorResult]) -> Unreplayable:
    """Why evaluator ``name`` of ``kind``, with no recorded verdict of its identity, may not run."""
    if kind != LLM_KIND:
        return Unreplayable.EVALUATOR_CHANGED
    asked = any(r.evaluator == name for r in results.values())
    return Unreplayable.LLM_CHANGED if asked else Unreplayable.LLM_NOT_RECORDED
