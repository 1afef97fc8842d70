"""Labels from production: what people said about a policy's decisions, as expected rule outcomes.

What each label means (docs/calibration.md), for the rule it names:

============================  ========================================================================
resolved review ``approved``  a person let the held or flagged content through: it was fine, so the
                              rule that failed and asked for the review **should have passed**
resolved review ``rejected``  a person confirmed the problem: the rule **should have failed**
review ``dismissed``          no label (closed without a judgement on the content)
auto-approved review          no label (``auto_approve_after`` ran out: no one judged it)
feedback ``false_positive``   the rule failed but **should have passed**
feedback ``false_negative``   the rule passed but **should have failed**
other feedback                no label (free-form labels, and feedback on the whole decision)
============================  ========================================================================

Every label is one row (a decision with a review and feedback has two): the rows carry the
decision's recorded per-rule scores, thresholds and verdicts from its audit record and, where the
operator enabled retention (docs/retention.md), its retained prompt, response and context; without
them the text is None. Rows are listed oldest label first, a page at a time (keyset-paged: a page
token names the last label of the page before).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from crossaudit.api.models import LabelledDecision, LabelPage
from crossaudit.api.records import LabelRecord
from crossaudit.governance.retention import RetainedInputs, Retention
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.service import inputs
from crossaudit.service.config import ServiceLimits
from crossaudit.store.base import Store
from orchestrator.engine.calibration import Labelled, RulePrecision, rule_precision

# label -> should the rule have passed?  (source, label) pairs not listed are no label.
SHOULD_PASS: Mapping[tuple[str, str], bool] = {
    ("review", "approved"): True,
    ("review", "rejected"): False,
    ("feedback", "false_positive"): True,
    ("feedback", "false_negative"): False,
}
PAGE_TOKEN_SEPARATOR = "|"


def should_pass(source: str, label: str) -> bool | None:
    """Whether the labelled rule should have passed (None: the label says nothing about it)."""
    return SHOULD_PASS.get((source, label))


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def recorded_rules(rules: Sequence[Any]) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
    """(scores, thresholds, verdicts) by rule from an audit record's rules; a rule without a
    number or a verdict (errored, skipped, cut from the record) is left out of that map."""
    scores: dict[str, float] = {}
    thresholds: dict[str, float] = {}
    verdicts: dict[str, bool] = {}
    for r in rules:
        if not isinstance(r, dict) or not isinstance(r.get("rule"), str):
            continue
        name = r["rule"]
        if (score := _number(r.get("score"))) is not None:
            scores[name] = score
        if (threshold := _number(r.get("threshold"))) is not None:
            thresholds[name] = threshold
        if isinstance(r.get("passed"), bool) and r.get("status") in ("pass", "fail"):
            verdicts[name] = r["passed"]
    return scores, thresholds, verdicts


def labelled(rec: LabelRecord, kept: RetainedInputs | None = None) -> LabelledDecision | None:
    """The row of one stored label (None when the label is not one: see the module's table)."""
    expected = should_pass(rec.source, rec.label)
    if expected is None:
        return None
    scores, thresholds, verdicts = recorded_rules(rec.decision_rules)
    return LabelledDecision(
        source=rec.source,
        id=rec.id,
        decision_id=rec.decision_id,
        rule=rec.rule,
        label=rec.label,
        should_pass=expected,
        labelled_at=rec.labelled_at,
        decided_at=rec.decided_at,
        scores=scores,
        thresholds=thresholds,
        recorded=verdicts,
        prompt=kept.prompt if kept else None,
        response=kept.response if kept else None,
        context=dict(kept.context) if kept else None,
    )


LABEL_ROW_BYTES = 512  # a label row's fixed part (ids, names, times) and per-rule numbers, estimated per row


def row_bytes(row: LabelledDecision) -> int:
    """What a row adds to an answer, estimated: its texts, its context as JSON, its per-rule maps."""
    text = len((row.prompt or "").encode("utf-8", "surrogatepass")) + len(
        (row.response or "").encode("utf-8", "surrogatepass")
    )
    context = len(json.dumps(row.context, default=str)) if row.context is not None else 0
    rules = sum(len(name) + 16 for name in (*row.scores, *row.thresholds, *row.recorded))
    return LABEL_ROW_BYTES + text + context + rules


def token_of(rec: LabelRecord) -> str:
    return f"{rec.labelled_at!r}{PAGE_TOKEN_SEPARATOR}{rec.id}"


def parse_page_token(token: str) -> tuple[float, str] | None:
    if not token:
        return None
    at, sep, label_id = token.partition(PAGE_TOKEN_SEPARATOR)
    try:
        value = float(at)
    except ValueError:
        value = math.nan
    if not sep or not label_id or not math.isfinite(value):
        raise InvalidInputError("page_token is not one this server gave (pass the last answer's next_page_token)")
    return value, label_id


class Labels:
    """A tenant's labelled decisions of one policy (ListLabels) and each rule's measured precision."""

    def __init__(self, store: Store, retention: Retention, *, limits: ServiceLimits) -> None:
        self.store = store
        self.retention = retention
        self.limits = limits

    async def page(
        self,
        tenant: str,
        *,
        policy: str,
        environment: str = "",
        since: float | None = None,
        page_token: str = "",
        page_size: int = 0,
        with_text: bool = True,
    ) -> LabelPage:
        """One page of at most ``page_size`` labels (0, or more than ``limits.label_page_size``:
        that setting), with the retained inputs of their decisions where retained and ``with_text``
        (admin keys: retained text is read by admins alone, as by replay)."""
        name = inputs.policy_name(policy, self.limits.max_name_length)
        env = inputs.environment(environment)
        if page_size < 0:
            raise InvalidInputError("page_size must not be negative (0: limits.label_page_size)")
        if since is not None and not (0 <= since < 1e11):
            raise InvalidInputError("since must be epoch seconds")
        size = min(page_size or self.limits.label_page_size, self.limits.label_page_size)
        after = parse_page_token(page_token)
        recs = await self.store.page_labels(
            tenant, policy=name, environment=env, since=since, after=after, limit=size + 1
        )
        more = len(recs) > size
        recs = recs[:size]
        kept = await self._retained(tenant, [r.decision_id for r in recs]) if with_text else {}
        # A page of retained texts could outgrow one answer: it stops at half of
        # limits.max_send_message_bytes (as a ListDecisions page does); the first row always goes.
        budget, used = self.limits.max_send_message_bytes // 2, 0
        rows: list[LabelledDecision] = []
        last: LabelRecord | None = None
        for i, r in enumerate(recs):
            row = labelled(r, kept.get(r.decision_id))
            cost = row_bytes(row) if row is not None else 0
            if last is not None and used + cost > budget:
                more = True
                break
            used += cost
            last = recs[i]
            if row is not None:
                rows.append(row)
        return LabelPage(rows, token_of(last) if more and last is not None else "")

    async def _retained(self, tenant: str, ids: list[str]) -> dict[str, RetainedInputs]:
        """The page's retained inputs, in loads of at most retention.max_load_ids."""
        ids = list(dict.fromkeys(ids))
        batch = self.retention.config.max_load_ids
        found: dict[str, RetainedInputs] = {}
        for i in range(0, len(ids), batch):
            found.update(await self.retention.load(tenant, ids[i : i + batch]))
        return found

    async def precision(self, tenant: str, *, policy: str, environment: str = "") -> dict[str, RulePrecision]:
        """Each labelled rule's measured precision (docs/calibration.md) over the first
        ``limits.max_precision_labels`` labels (oldest first) of ``policy`` in ``environment``
        that name a rule with a recorded verdict; no text is loaded."""
        name = inputs.policy_name(policy, self.limits.max_name_length)
        env = inputs.environment(environment)
        cap, size = self.limits.max_precision_labels, self.limits.label_page_size
        found: list[Labelled] = []
        after: tuple[float, str] | None = None
        for _ in range(-(-cap // size)):  # pages within the cap: the loop's bound
            recs = await self.store.page_labels(
                tenant, policy=name, environment=env, since=None, after=after, limit=min(size, cap - len(found))
            )
            for r in recs:
                row = labelled(r)
                if row is not None and row.rule in row.recorded:
                    found.append(Labelled(row.rule, row.recorded[row.rule], row.should_pass))
            if len(recs) < size or len(found) >= cap:
                break
            after = (recs[-1].labelled_at, recs[-1].id)
        return rule_precision(found)
