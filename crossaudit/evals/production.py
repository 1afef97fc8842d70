"""Datasets from production labels: a policy's resolved reviews and feedback labels as dataset
rows (docs/calibration.md), so thresholds are tuned on the traffic the policy really sees.

:func:`rows_from_reviews` reads the server's labels (``AuditService.ListLabels``, a page at a
time, at most ``MAX_PRODUCTION_LABELS``) and makes one :class:`~crossaudit.evals.dataset.Row`
per labelled decision:

- ``rules``: what the labels say each rule should have done; when a decision has two labels on
  one rule, the later label wins (labels arrive oldest first);
- ``scores``: the decision's recorded per-rule scores (in [0, 1]), so a row without text is
  scored against each rule's threshold (threshold-only evaluation);
- ``prompt``/``response``/``context``: the retained inputs where the operator enabled retention
  (docs/retention.md), else None / {};
- ``passed``/``action``: None (people label rules, not whole decisions);
- ``id``: the decision id; ``source``: the latest label's ``review:<id>`` or ``feedback:<id>``.

A decision with neither retained text nor a recorded score for any rule cannot be evaluated
and is left out (:attr:`ProductionLabels.skipped` counts them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from crossaudit.api.models import LabelledDecision, LabelPage
from crossaudit.evals.dataset import Row, row_to_json
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.files import private_file
from orchestrator.engine.calibration import Calibration, calibrate

MAX_PRODUCTION_LABELS = 100_000  # labels one dataset is built from at most (the oldest first)


class LabelSource(Protocol):
    """What reads labels: :class:`crossaudit.sdk.Client` satisfies it."""

    def list_labels(
        self,
        policy: str,
        environment: str = "",
        since: float | None = None,
        *,
        page_token: str = "",
        page_size: int = 0,
    ) -> LabelPage: ...


@dataclass
class ProductionLabels:
    labels: list[LabelledDecision] = field(default_factory=list)
    more: bool = False  # MAX_PRODUCTION_LABELS (or the limit) was reached with labels left
    skipped: int = 0  # labelled decisions with no text and no recorded score: not rows


def read_labels(
    client: LabelSource,
    policy: str,
    since: float | None = None,
    environment: str = "",
    *,
    limit: int = MAX_PRODUCTION_LABELS,
) -> ProductionLabels:
    """Every label of ``policy`` in ``environment`` given since ``since``, up to ``limit``."""
    if limit <= 0:
        raise InvalidInputError("limit must be positive")
    out = ProductionLabels()
    token = ""
    for _ in range(limit):  # at least one label per page but the last: the loop's bound
        page = client.list_labels(policy, environment, since, page_token=token, page_size=0)
        out.labels.extend(page.labels[: limit - len(out.labels)])
        token = page.next_page_token
        if not token or not page.labels:
            break
        if len(out.labels) >= limit:
            out.more = True
            break
    return out


def _unit_scores(scores: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in scores.items() if math.isfinite(v) and 0.0 <= v <= 1.0}


def rows_from_labels(labels: Iterable[LabelledDecision]) -> tuple[list[Row], int]:
    """(rows, decisions skipped): one row per labelled decision, in the order of its first label."""
    merged: dict[str, dict[str, Any]] = {}
    for lab in labels:
        doc = merged.setdefault(
            lab.decision_id,
            {"rules": {}, "scores": _unit_scores(lab.scores), "prompt": None, "response": None, "context": None},
        )
        doc["rules"][lab.rule] = lab.should_pass  # later labels win
        doc["source"] = f"{lab.source}:{lab.id}"
        if lab.context is not None:
            doc["prompt"], doc["response"], doc["context"] = lab.prompt, lab.response, lab.context
    rows: list[Row] = []
    skipped = 0
    for decision_id, doc in merged.items():
        if doc["response"] is None and not doc["scores"]:
            skipped += 1
            continue
        rows.append(
            Row(
                line=len(rows) + 1,
                id=decision_id,
                prompt=doc["prompt"],
                response=doc["response"],
                context=dict(doc["context"] or {}),
                passed=None,
                action=None,
                rules=dict(doc["rules"]),
                scores=dict(doc["scores"]),
                source=doc["source"],
            )
        )
    return rows, skipped


def rows_from_reviews(
    client: LabelSource, policy: str, since: float | None = None, environment: str = ""
) -> list[Row]:
    """The dataset rows of ``policy``'s labels in ``environment`` since ``since`` (module docstring)."""
    rows, _ = rows_from_labels(read_labels(client, policy, since, environment).labels)
    return rows


def write_jsonl(rows: Sequence[Row], path: str | Path) -> None:
    """Write ``rows`` as JSONL, whole or not at all, mode 0600: the rows carry decisions' retained
    text (:func:`crossaudit.kernel.files.private_file`: an interrupted write leaves no partial dataset)."""
    with private_file(path) as f:
        for row in rows:
            f.write((json.dumps(row_to_json(row), ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))


def suggested_threshold(
    rows: Iterable[Row], rule: str, current: float, *, max_step: float, min_count: int
) -> Calibration:
    """The threshold ``feedback_config.update_model`` would move ``rule`` to on these rows' labels
    and recorded scores (the one method: docs/calibration.md)."""
    scored = [(row.scores[rule], row.rules[rule]) for row in rows if rule in row.rules and rule in row.scores]
    return calibrate(current, scored, max_step=max_step, min_count=min_count)
