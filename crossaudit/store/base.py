"""The store interface: everything the service persists, behind one async API.

The embedded implementation is :class:`crossaudit.store.sqlite.SQLiteStore`; a PostgreSQL
store can replace it by implementing :class:`Store`. Every method is scoped by ``tenant``:
a tenant never sees another tenant's rows (a foreign id is simply NOT_FOUND).
Records are plain frozen dataclasses (no proto types, no ORM objects).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from crossaudit.api.records import (
    AuditRecord,
    CandidateMode,
    CandidateRecord,
    CandidateState,
    CheckpointRecord,
    DeploymentRecord,
    ErasureRecord,
    EvaluatorRecord,
    FeedbackRecord,
    HistoryRecord,
    LabelRecord,
    OutboxRecord,
    OutboxState,
    PolicySummaryRecord,
    PolicyVersionRecord,
    RetainedRecord,
    ReviewRecord,
    ShadowDiffRecord,
    TenantKeyRecord,
)

# The store's errors live in the one hierarchy (crossaudit.kernel.errors); re-exported for compatibility.
from crossaudit.evidence.leaf import receipt_text
from crossaudit.kernel.errors import ReviewAlreadyResolvedError as ReviewAlreadyResolvedError
from crossaudit.kernel.errors import StoreUnavailableError as StoreUnavailableError
from orchestrator.reviews import ReviewState

# The service settings the store's evaluator quotas stand for (named in their refusals).
EVALUATORS_QUOTA = "limits.max_evaluators_per_tenant"
EVALUATOR_CODE_QUOTA = "limits.max_evaluator_code_bytes_per_tenant"
OPEN_REVIEWS_QUOTA = "limits.max_open_reviews_per_tenant"


LABEL_REVIEW_STATES = ("approved", "rejected")  # review states that are labels (dismissed is not)
LABEL_FEEDBACK = ("false_positive", "false_negative")  # feedback labels that are labels of a rule


class LogRow(NamedTuple):
    """A decision as its log sees it: its sequence number (None: outside the log), the leaf
    hash stored with it, and its :data:`crossaudit.evidence.leaf.LEAF_COLUMNS` values as stored
    (rules and receipt as UTF-8 bytes: verification hashes them without decoding). A tuple:
    verify builds one per record, tens of thousands a second."""

    decision_id: str
    seq: int | None
    leaf_hash: str | None
    values: tuple[Any, ...]


# What a NUL (U+0000) is stored as: PostgreSQL text cannot hold one. Audit texts are written with
# it already replaced on every backend, so their measured size is what is stored.
NUL_REPLACEMENT = "\ufffd"
AUDIT_DAY_S = 86_400  # audit quotas count per UTC day: day = int(created_at // AUDIT_DAY_S)
AUDIT_ROW_BYTES = 512  # an audit row's fixed part (ids, hashes, names, numbers), counted for every record
ERASE_BATCH = 200  # decisions one erasure transaction removes by default (retention.erase_batch)


def audit_rules_json(rec: AuditRecord) -> str:
    """``rec.rules`` as the store writes them (encoded once per decision: see ``record_decision``)."""
    return json.dumps(rec.rules, default=str)


def audit_size(rec: AuditRecord, rules_json: str | None = None, receipt_json: str | None = None) -> int:
    """The bytes an audit record costs its tenant's quota: its JSON and text columns as stored
    (the receipt included), plus the fixed part. One measure for the per-decision cap and the per-day quota.
    ``rules_json``, ``receipt_json``: :func:`audit_rules_json` of ``rec`` and ``receipt_text`` of
    its receipt when the caller already has them."""
    if rules_json is None:
        rules_json = audit_rules_json(rec)
    size = AUDIT_ROW_BYTES + len(rules_json) + len(json.dumps(rec.errored_rules))
    if rec.receipt:  # as the store writes it (crossaudit.evidence.leaf.receipt_text)
        size += len(receipt_text(rec.receipt) if receipt_json is None else receipt_json)
    if rec.prompt is not None:
        size += len(rec.prompt.encode("utf-8", "surrogatepass"))
    if rec.response is not None:
        size += len(rec.response.encode("utf-8", "surrogatepass"))
    size += len(rec.request_id.encode("utf-8", "surrogatepass"))  # the caller's: stored, so counted
    return size + len(rec.truncated)


class Store(abc.ABC):
    """Async persistence of policies, deployments, evaluators, audit, reviews and feedback.

    Errors: :class:`~crossaudit.kernel.errors.NotFoundError` for unknown names/ids (including
    another tenant's), :class:`~crossaudit.kernel.errors.InvalidInputError` for bad arguments.
    """

    # --- policies -----------------------------------------------------------------------

    @abc.abstractmethod
    async def deploy_policy(
        self,
        tenant: str,
        *,
        name: str,
        declared_version: str,
        description: str,
        content: str,
        environment: str,
    ) -> tuple[PolicyVersionRecord, DeploymentRecord, bool]:
        """Store ``content`` as a new version (or reuse the version with the same digest) and
        deploy it to ``environment``, atomically. Returns (version, deployment, created)."""

    @abc.abstractmethod
    async def get_policy_version(self, tenant: str, name: str, version: int) -> PolicyVersionRecord: ...

    @abc.abstractmethod
    async def get_deployed_policy(self, tenant: str, name: str, environment: str) -> PolicyVersionRecord:
        """The version currently deployed in ``environment`` (NotFoundError when none)."""

    @abc.abstractmethod
    async def list_deployments(self, tenant: str, name: str) -> list[DeploymentRecord]: ...

    @abc.abstractmethod
    async def list_policies(
        self, tenant: str, environment: str | None = None, *, limit: int | None = None
    ) -> list[PolicySummaryRecord]:
        """By name; ``environment``: only those deployed there; ``limit``: the first that many."""

    @abc.abstractmethod
    async def rollback_policy(
        self, tenant: str, name: str, environment: str, to_version: int | None = None
    ) -> tuple[DeploymentRecord, int]:
        """Deploy ``to_version`` (default: the last different version deployed there before the
        current one). Returns (new deployment, version that was deployed before)."""

    # --- evaluators ---------------------------------------------------------------------

    @abc.abstractmethod
    async def put_evaluator(
        self,
        tenant: str,
        *,
        name: str,
        code: str,
        language: str,
        dependencies: tuple[str, ...],
        digest: str,
        description: str = "",
        max_versions: int | None = None,
        max_code_bytes: int | None = None,
    ) -> tuple[EvaluatorRecord, bool]:
        """Store an uploaded evaluator. Identical content under the same name returns the
        existing record (created=False); new content becomes the next version with a new id.
        Quotas, checked in the same transaction: a new version beyond ``max_versions`` stored
        versions of the tenant, or taking its stored code past ``max_code_bytes`` (UTF-8), is
        QuotaExceededError naming :data:`EVALUATORS_QUOTA` or :data:`EVALUATOR_CODE_QUOTA`."""

    @abc.abstractmethod
    async def get_evaluator(self, tenant: str, evaluator_id: str) -> EvaluatorRecord: ...

    @abc.abstractmethod
    async def get_evaluator_by_name(self, tenant: str, name: str, version: int | None = None) -> EvaluatorRecord:
        """The given version of ``name``, or its latest version."""

    @abc.abstractmethod
    async def list_evaluators(self, tenant: str, name: str | None = None) -> list[EvaluatorRecord]:
        """Records without code (``code`` is empty), newest version last per name."""

    # --- audit, reviews, feedback -------------------------------------------------------

    @abc.abstractmethod
    async def record_decision(
        self,
        audit: AuditRecord,
        reviews: list[ReviewRecord],
        outbox: Sequence[OutboxRecord] = (),
        *,
        max_pending: Mapping[str, int] | None = None,
        audit_bytes: int | None = None,
        max_open_reviews: int | None = None,
        rules_json: str | None = None,
        retained: RetainedRecord | None = None,
        receipt_json: str | None = None,
    ) -> list[OutboxRecord | ReviewRecord]:
        """Durably write a decision's audit record, the reviews it created and the messages it
        sends (webhooks, decision-log entries), atomically. Called *before* the answer is sent.
        The record's size (``audit_bytes``, else :func:`audit_size`) is added to its tenant's
        audit bytes of the record's UTC day in the same transaction (:meth:`audit_bytes`).
        ``rules_json``: the record's rules already encoded (:func:`audit_rules_json`), written as
        they are, so a decision's rules are encoded once on the hot path; ``receipt_json`` likewise
        its receipt (``receipt_text``).

        ``max_pending`` (kind -> n): a message of that kind is written only while its tenant has
        fewer than n pending; the audit record and everything else are written all the same (an
        answered decision is never lost to a quota). Returns the rows not written: those messages,
        and the reviews ``max_open_reviews`` kept closed (so the answer names only opened ones).

        ``max_open_reviews``: when the decision's reviews would take its tenant's open reviews
        past it, none of them is opened; the audit record is written all the same, each of its
        rules that asked for a review saying ``review_not_opened`` (:data:`OPEN_REVIEWS_QUOTA`).

        ``retained``: the decision's sealed inputs and their blind index, written in the same
        transaction (the caller counts their size in ``audit_bytes``)."""

    @abc.abstractmethod
    async def audit_bytes(self, tenant: str, day: int) -> int:
        """Audit bytes ``tenant`` recorded on UTC day ``day`` (every writer sharing the store)."""

    @abc.abstractmethod
    async def get_decision(self, tenant: str, decision_id: str) -> AuditRecord: ...

    @abc.abstractmethod
    async def list_decisions(
        self,
        tenant: str,
        *,
        policy: str | None = None,
        limit: int = 100,
        since: float | None = None,
        until: float | None = None,
        max_bytes: int | None = None,
    ) -> list[AuditRecord]:
        """Most recent first; ``since``/``until`` (epoch seconds, inclusive) bound ``created_at``;
        ``max_bytes``: stop before the record that takes the page's stored size past it (the first
        record is always answered), sizes read before any record is."""

    @abc.abstractmethod
    async def page_decisions(
        self,
        tenant: str,
        *,
        policy: str,
        environment: str,
        since: float | None,
        until: float | None,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[AuditRecord]:
        """One page of ``tenant``'s records of ``policy`` in ``environment``, most recent first
        (``created_at`` descending, then ``decision_id``), ``since``/``until`` inclusive;
        ``after``: the (created_at, decision_id) of the previous page's last record (keyset paging,
        so a page costs the same however deep it is and records written meanwhile never shift it)."""

    @abc.abstractmethod
    async def count_decisions(self, tenant: str | None = None) -> int: ...

    @abc.abstractmethod
    async def list_reviews(
        self,
        tenant: str,
        *,
        state: ReviewState | None = None,
        policy: str | None = None,
        limit: int = 100,
    ) -> list[ReviewRecord]:
        """Oldest first (a review queue)."""

    @abc.abstractmethod
    async def auto_approve_due(self, tenant: str, now: float) -> int:
        """Approve (reviewer ``auto``) open require_review items whose ``auto_approve_at`` has
        passed; returns how many."""

    @abc.abstractmethod
    async def get_review(self, tenant: str, review_id: str) -> ReviewRecord:
        """One review of ``tenant`` (NOT_FOUND otherwise, also another tenant's), looked up by id."""

    @abc.abstractmethod
    async def resolve_review(
        self, tenant: str, review_id: str, state: ReviewState, *, reviewer: str = "", note: str = ""
    ) -> ReviewRecord:
        """Close an open review. Resolving an already-resolved one is FAILED_PRECONDITION."""

    @abc.abstractmethod
    async def add_feedback(
        self, tenant: str, decision_id: str, *, rule: str, label: str, comment: str = ""
    ) -> FeedbackRecord: ...

    @abc.abstractmethod
    async def feedback_counts(self, tenant: str) -> dict[tuple[str, str], tuple[int, int, int]]:
        """Rule-level feedback per (policy, rule): (total, false_positive, false_negative)."""

    @abc.abstractmethod
    async def list_feedback(self, tenant: str, decision_id: str | None = None) -> list[FeedbackRecord]: ...

    @abc.abstractmethod
    async def page_labels(
        self,
        tenant: str,
        *,
        policy: str,
        environment: str,
        since: float | None,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[LabelRecord]:
        """One page of the labels people gave ``tenant``'s decisions of ``policy`` in
        ``environment``: reviews resolved as approved or rejected by a person (an auto-approval is
        no one's judgement) and rule-level feedback labelled false_positive or false_negative,
        labelled at or after ``since``, oldest label first (``labelled_at``, then ``id``);
        ``after``: the (labelled_at, id) of the previous page's last label (keyset paging)."""

    @abc.abstractmethod
    async def feedback_scores(self, tenant: str, *, limit: int) -> list[tuple[str, str, str, float | None]]:
        """(policy, rule, label, the rule's recorded score) of ``tenant``'s most recent ``limit``
        rule-level feedback labels false_positive / false_negative, most recent first."""

    # --- retained inputs (docs/retention.md) ----------------------------------------------

    @abc.abstractmethod
    async def get_tenant_key(self, tenant: str) -> TenantKeyRecord | None: ...

    @abc.abstractmethod
    async def put_tenant_key(self, rec: TenantKeyRecord) -> TenantKeyRecord:
        """Store ``rec`` unless its tenant has a key already; returns the tenant's key either way
        (two replicas creating one at once agree on the first)."""

    @abc.abstractmethod
    async def rewrap_tenant_key(self, tenant: str, old_operator_key_id: str, rec: TenantKeyRecord) -> bool:
        """Replace the tenant's wrapped key (same data key, rewrapped) if it is still wrapped by
        ``old_operator_key_id``; False when another writer did it first."""

    @abc.abstractmethod
    async def list_tenant_keys(self, *, not_wrapped_by: str, limit: int, after: str = "") -> list[TenantKeyRecord]:
        """Up to ``limit`` tenants' keys wrapped by another operator key than ``not_wrapped_by``,
        of tenants named after ``after``, by tenant (a page: keys left as they are never fill it)."""

    @abc.abstractmethod
    async def load_retained(self, tenant: str, decision_ids: Sequence[str], now: float) -> list[RetainedRecord]:
        """The tenant's retained rows of ``decision_ids`` that have not expired at ``now`` (erased
        rows are gone), in one transaction; ``index`` is left empty."""

    @abc.abstractmethod
    async def erase_inputs(
        self,
        erasure: ErasureRecord,
        *,
        decision_id: str | None = None,
        blind_index: str | None = None,
        limit: int = ERASE_BATCH,
    ) -> ErasureRecord:
        """Remove the retained inputs and the audit records' raw prompt/response of the tenant's
        decision ``decision_id`` (NotFoundError when the tenant has no such decision) or of up to
        ``limit`` decisions whose retained context has ``blind_index`` (call again for the rest:
        an erased decision leaves the index); mark those decisions erased; record ``erasure``,
        adding this call's count to a record of the same id, all in one transaction. Returns the
        recorded erasure (its count over every call)."""

    @abc.abstractmethod
    async def list_erasures(self, tenant: str, *, limit: int = 100) -> list[ErasureRecord]:
        """Most recent first."""

    @abc.abstractmethod
    async def purge_retained(
        self, now: float, *, limit: int, tenant: str | None = None, created_before: float | None = None
    ) -> int:
        """Delete up to ``limit`` rows (every tenant's) that expired before ``now``, or with
        ``tenant``: up to ``limit`` of that tenant's rows created at or before ``created_before``
        (older than its current ceiling), with their index; returns how many."""

    # --- outbox (every tenant's: the delivery workers are the operator's) -----------------

    @abc.abstractmethod
    async def claim_outbox(
        self,
        kinds: Sequence[str],
        now: float,
        *,
        limit: int,
        lease_s: float,
        per_tenant: int | None = None,
        held: Mapping[str, int] | None = None,
    ) -> list[OutboxRecord]:
        """Lease up to ``limit`` pending messages of ``kinds`` that are due and not leased by
        another worker; each returned record carries its new ``lease_until``. Oldest first; with
        ``per_tenant``, at most ``per_tenant - held[tenant]`` of each tenant (none of a tenant at
        its share: nothing is leased that could not be attempted at once), taken round-robin
        across tenants (each one's oldest first, tenants in the order of their oldest)."""

    @abc.abstractmethod
    async def settle_outbox(
        self,
        claimed: OutboxRecord,
        *,
        state: OutboxState,
        next_attempt_at: float = 0.0,
        last_error: str = "",
        last_status: int = 0,
        now: float,
        count_attempt: bool = True,
    ) -> bool:
        """Record one attempt on a message this worker leased (``claimed``): delivered, dead, or
        pending again at ``next_attempt_at`` (``count_attempt`` False: handed back untried). False
        (nothing written) when the lease was lost."""

    @abc.abstractmethod
    async def list_outbox(
        self, tenant: str, *, state: OutboxState | None = None, kind: str | None = None, limit: int = 100
    ) -> list[OutboxRecord]:
        """Most recent first."""

    @abc.abstractmethod
    async def redeliver_outbox(
        self, tenant: str, message_id: str, now: float, *, kind: str | None = None, max_pending: int | None = None
    ) -> OutboxRecord:
        """Put a dead or delivered message (of ``kind``, when given) back to pending, due now, with
        a fresh attempt budget. A message that is still pending is FAILED_PRECONDITION; one whose
        tenant already has ``max_pending`` pending of its kind is QuotaExceededError."""

    @abc.abstractmethod
    async def outbox_counts(self) -> dict[tuple[str, str], int]:
        """(kind, state) -> messages, for the metrics."""

    # --- shared rate limits ----------------------------------------------------------------

    @abc.abstractmethod
    async def take_rate_token(
        self, key: str, *, rate_per_s: float, capacity: float, now: float, max_wait_s: float
    ) -> float | None:
        """Reserve one token of bucket ``key`` (created full): the seconds until it is due, or None
        when that would exceed ``max_wait_s`` (nothing reserved). Atomic across processes."""

    # --- shadow and canary candidates ------------------------------------------------------

    @abc.abstractmethod
    async def start_candidate(
        self,
        tenant: str,
        *,
        name: str,
        declared_version: str,
        description: str,
        content: str,
        environment: str,
        mode: CandidateMode,
        share: float,
        canary_key: str = "",
        notify_url: str = "",
        bounds: Mapping[str, Any] | None = None,
    ) -> tuple[PolicyVersionRecord, CandidateRecord, bool]:
        """Store ``content`` as a version (or reuse the one with its digest) WITHOUT deploying it,
        and start it as ``environment``'s candidate, atomically, with a history entry of kind
        ``mode``. NotFoundError when nothing is deployed there; CandidateStateError when a
        candidate is already running there or the content is the active version."""

    @abc.abstractmethod
    async def get_candidate(self, tenant: str, name: str, environment: str) -> CandidateRecord:
        """The running candidate, else the most recent ended one (NotFoundError when none)."""

    @abc.abstractmethod
    async def running_candidate(self, tenant: str, name: str, environment: str) -> CandidateRecord | None: ...

    @abc.abstractmethod
    async def end_candidate(
        self,
        tenant: str,
        name: str,
        environment: str,
        *,
        state: CandidateState,
        reason: str = "",
        candidate_id: str | None = None,
        outbox: Sequence[OutboxRecord] = (),
    ) -> tuple[CandidateRecord, DeploymentRecord | None]:
        """End the running candidate, atomically with its history entry and ``outbox`` rows:
        PROMOTED also deploys its version (a ``promote`` deployment, returned). ``candidate_id``:
        only that candidate (a replica's automatic rollback never ends a newer one).
        CandidateStateError when none is running."""

    @abc.abstractmethod
    async def record_shadow_diffs(
        self,
        diffs: Sequence[ShadowDiffRecord],
        *,
        dropped: Mapping[str, tuple[str, int]] | None = None,
        max_diffs: int,
    ) -> None:
        """Add shadow evaluations (and ``dropped``: candidate id -> (tenant, samples not
        evaluated)) to their candidates' totals and per-rule flips in one transaction; store the
        diffs themselves while a candidate holds fewer than ``max_diffs``. Nothing is added to a
        candidate no longer running, nor to one of another tenant."""

    @abc.abstractmethod
    async def shadow_rule_flips(self, tenant: str, candidate_id: str) -> dict[str, int]: ...

    @abc.abstractmethod
    async def list_shadow_diffs(
        self, tenant: str, candidate_id: str, *, changed_only: bool = True, limit: int = 100
    ) -> list[ShadowDiffRecord]:
        """Most recent first; ``changed_only``: those whose answer or some rule differed, or errored."""

    @abc.abstractmethod
    async def revision_counts(
        self, tenant: str, name: str, environment: str, since: float, revisions: Sequence[int]
    ) -> dict[int, tuple[int, int, int]]:
        """From the audit log since ``since``: revision -> (decisions, with an errored rule, blocked)."""

    @abc.abstractmethod
    async def list_history(self, tenant: str, name: str, environment: str, *, limit: int = 100) -> list[HistoryRecord]:
        """The environment's deployment history of ``name``, most recent first."""

    # --- the decision log (docs/evidence.md) ---------------------------------------------

    @abc.abstractmethod
    async def log_size(self, tenant: str) -> int:
        """Sequence numbers handed out in ``tenant``'s log (its head): 0 when it has none."""

    @abc.abstractmethod
    async def log_rows(self, tenant: str, *, start: int, limit: int, end: int | None = None) -> list[LogRow]:
        """Up to ``limit`` records of ``tenant``'s log with ``start <= seq < end``, in order."""

    @abc.abstractmethod
    async def log_rows_outside(self, tenant: str, *, since: float | None, limit: int) -> list[LogRow]:
        """Up to ``limit`` of ``tenant``'s records with no sequence number (written outside the log)."""

    @abc.abstractmethod
    async def log_leaves(self, tenant: str, start: int, end: int) -> list[tuple[int, str | None]]:
        """(seq, stored leaf hash) of ``tenant``'s records with ``start <= seq < end``, in order."""

    @abc.abstractmethod
    async def first_seq_since(self, tenant: str, since: float) -> int | None:
        """The lowest sequence number of ``tenant``'s records created at or after ``since``."""

    @abc.abstractmethod
    async def add_checkpoint(self, rec: CheckpointRecord) -> bool:
        """Store a checkpoint; False when one of that size was already stored (by any replica)."""

    @abc.abstractmethod
    async def list_checkpoints(
        self, tenant: str, *, min_size: int = 0, max_size: int | None = None, limit: int = 1000
    ) -> list[CheckpointRecord]:
        """``tenant``'s checkpoints with ``min_size <= size <= max_size``, smallest first."""

    @abc.abstractmethod
    async def latest_checkpoint(self, tenant: str, max_size: int | None = None) -> CheckpointRecord | None:
        """``tenant``'s largest checkpoint (of at most ``max_size`` leaves)."""

    @abc.abstractmethod
    async def logs_behind(self, limit: int) -> list[tuple[str, int, int]]:
        """(tenant, log size, size of its latest checkpoint) of logs with leaves no checkpoint covers."""

    # --- misc ---------------------------------------------------------------------------

    @abc.abstractmethod
    async def get_meta(self, key: str) -> str | None: ...

    @abc.abstractmethod
    async def set_meta(self, key: str, value: str) -> None: ...

    async def check(self, timeout_s: float) -> None:
        """Raise :class:`StoreUnavailableError` when the database cannot be reached within
        ``timeout_s``: the server's health follows it (``ServiceLimits.store_check_interval_s``).
        An embedded store is reachable while its process runs, so the default does nothing."""
        return None

    @abc.abstractmethod
    async def aclose(self) -> None: ...
