"""The store's SQL, shared by its backends (SQLite, PostgreSQL): one query per operation.

:class:`SqlStore` implements every :class:`~crossaudit.store.base.Store` operation as a
function run in one transaction on a DB-API-like connection (``execute`` returning a cursor
with ``fetchone``/``fetchall``/``rowcount``, ``executemany``; ``?`` placeholders; rows readable
by column name and by position). A backend supplies only :meth:`SqlStore._tx` (how a
transaction runs on its connection, in one of its executor's threads), its schema and its
connection; :meth:`SqlStore._run`, which hands transactions to that executor, is shared. The SQL
sticks to what both engines accept.

Records map to rows generically: one column per dataclass field, named like the field (lists
and dicts as JSON text, tuples as JSON lists, enums by value, booleans as 0/1).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import enum
import json
import time
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

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
from crossaudit.evidence.leaf import LEAF_COLUMNS, leaf_document, receipt_text
from crossaudit.evidence.merkle import leaf_hash
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import (
    CandidateStateError,
    DeliveryPendingError,
    InvalidInputError,
    NotFoundError,
    QuotaExceededError,
)
from crossaudit.store.base import (
    AUDIT_DAY_S,
    AUDIT_ROW_BYTES,
    ERASE_BATCH,
    EVALUATOR_CODE_QUOTA,
    EVALUATORS_QUOTA,
    LABEL_FEEDBACK,
    LABEL_REVIEW_STATES,
    OPEN_REVIEWS_QUOTA,
    LogRow,
    ReviewAlreadyResolvedError,
    Store,
    StoreUnavailableError,
    audit_rules_json,
    audit_size,
)
from crossaudit.store.groupcommit import GroupCommit
from orchestrator.engine.ratelimit import take
from orchestrator.reviews import AUTO_APPROVAL, AUTO_APPROVE_AT, AUTO_REVIEWER, Resolution, ReviewState, timing

T = TypeVar("T")

CLOSED = "the store is closed (the server is shutting down)"  # what every call to a closed store says


class Row(Protocol):
    def __getitem__(self, key: int | str) -> Any: ...


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


class Conn(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Cursor: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...


Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]  # (column value -> field value, and back)

# Each record is one row of its table, one column per field, named like the field.
TABLES: dict[type, str] = {
    PolicyVersionRecord: "policy_versions",
    DeploymentRecord: "deployments",
    EvaluatorRecord: "evaluators",
    AuditRecord: "decisions",
    ReviewRecord: "reviews",
    FeedbackRecord: "feedback",
    OutboxRecord: "outbox",
    TenantKeyRecord: "tenant_keys",
    ErasureRecord: "erasures",
    CandidateRecord: "candidates",
    ShadowDiffRecord: "shadow_diffs",
    CheckpointRecord: "log_checkpoints",
}


def _same(value: Any) -> Any:
    return value


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


def _codec(tp: Any) -> Codec:
    """How a field of type ``tp`` is stored: lists and dicts as JSON, tuples as JSON lists, enums
    by value, booleans as 0/1; everything else (text, numbers, epoch-second timestamps, their
    optional forms) as is."""
    origin = typing.get_origin(tp)
    if origin in (list, dict):
        return json.loads, _json
    if origin is tuple:
        return (lambda v: tuple(json.loads(v))), (lambda v: _json(list(v)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp, (lambda v: v.value)
    if tp is bool:
        return bool, int
    if tp is bytes:
        return bytes, _same  # PostgreSQL may answer a memoryview
    return _same, _same


def _columns(cls: type) -> tuple[tuple[str, Codec], ...]:
    """(column, codec) per field of a record dataclass, from its type hints: adding a field (and its
    column to the schema) is all a new column needs."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _codec(hints[f.name])) for f in dataclasses.fields(cls))


COLUMNS = {cls: _columns(cls) for cls in TABLES}
_ENCODE = {name: enc for name, (_, enc) in COLUMNS[AuditRecord]}  # an audit record's column encoders


def _record(cls: type[T], row: Row, **values: Any) -> T:
    """The record in ``row``; ``values`` replace fields the caller must not return (e.g. code)."""
    return cls(**{name: values[name] if name in values else dec(row[name]) for name, (dec, _) in COLUMNS[cls]})


# The largest LIMIT both engines take (a signed 64-bit integer): a bigger page size is no limit at
# all, and sent as it is it was a driver error (PostgreSQL "bigint out of range", SQLite OverflowError).
MAX_SQL_INT = 2**63 - 1


# An audit record's size as stored, estimated in SQL (characters of its text columns, plus the
# fixed part audit_size counts): what a byte-bounded listing adds up before it reads any record
# whole. AUDIT_ROW_BYTES is a constant of the code, not a value from a caller.
_RECORD_SIZE = (
    "(LENGTH(rules) + LENGTH(errored_rules) + LENGTH(receipt) + COALESCE(LENGTH(prompt), 0) "
    "+ COALESCE(LENGTH(response), 0) "
    f"+ LENGTH(truncated) + LENGTH(request_id) + LENGTH(policy) + {int(AUDIT_ROW_BYTES)})"
)
# The history kinds that made a version active (a candidate's start, discard or automatic
# rollback is in the history too, but never was the answering version): what rollback goes back to.
DEPLOYED_KINDS = "('deploy', 'rollback', 'promote')"
# Values bound in one IN (...) list: below every SQLite build's variable limit (999 before 3.32).
_IN_CHUNK = 500


def _page(limit: int) -> int:
    return min(max(0, int(limit)), MAX_SQL_INT)


def _listing(
    source: str,
    tenant: str,
    filters: Mapping[str, Any] | None = None,
    *,
    order: str,
    since: float | None = None,
    until: float | None = None,
    limit: int | None = None,
    columns: str = "*",
    group: str = "",
) -> tuple[str, list[Any]]:
    """The one shape of a tenant's filtered listing, and its arguments:
    ``SELECT columns FROM source WHERE tenant=? [AND filter ...] [AND created_at>=? AND
    created_at<=?] [GROUP BY group] ORDER BY order [LIMIT ?]``.

    Each filter is a fixed condition holding one ``?`` mapped to its value, and is left out when
    the value is None (an optional argument not given; callers pass ``x or None`` where an empty
    string means "any" too). Values, time bounds and the page size (clamped by :func:`_page`) are
    only ever bound, never written into the SQL; the SQL text comes from this module alone, so
    every listing is scoped to its tenant the same way on both backends."""
    sql = f"SELECT {columns} FROM {source} WHERE tenant=?"
    args: list[Any] = [tenant]
    bounds = {"created_at>=?": since, "created_at<=?": until}
    for condition, value in [*(filters or {}).items(), *bounds.items()]:
        if value is None:
            continue
        assert condition.count("?") == 1, condition  # one bound value per condition
        sql += f" AND {condition}"
        args.append(float(value) if condition in bounds else value)
    if group:
        sql += f" GROUP BY {group}"
    sql += f" ORDER BY {order}"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(_page(limit))
    return sql, args


def _one(c: Conn, table: str, tenant: str, key: Mapping[str, Any], missing: str, columns: str = "*") -> Row:
    """The tenant's one row of ``table`` whose columns equal ``key`` (names from this module,
    values bound), or NotFoundError(``missing``): another tenant's row is as absent as none."""
    where = "".join(f" AND {column}=?" for column in key)
    row = c.execute(f"SELECT {columns} FROM {table} WHERE tenant=?{where}", (tenant, *key.values())).fetchone()
    if row is None:
        raise NotFoundError(missing)
    return row


def _keyed(c: Conn, table: str, tenant: str, column: str, keys: Sequence[Any], order: str = "") -> list[Row]:
    """The tenant's rows of ``table`` whose ``column`` is one of ``keys``, in ``IN`` lists of at
    most :data:`_IN_CHUNK` bound values (``order`` applies within each list)."""
    rows: list[Row] = []
    for i in range(0, len(keys), _IN_CHUNK):
        chunk = keys[i : i + _IN_CHUNK]
        sql = f"SELECT * FROM {table} WHERE tenant=? AND {column} IN ({', '.join('?' * len(chunk))})"
        rows += c.execute(sql + (f" ORDER BY {order}" if order else ""), (tenant, *chunk)).fetchall()
    return rows


def _insert(c: Conn, rec: Any, on_conflict: str = "", encoded: Mapping[str, Any] | None = None) -> None:
    """``encoded``: column values the caller already encoded, written as they are."""
    cols = COLUMNS[type(rec)]
    c.execute(
        f"INSERT INTO {TABLES[type(rec)]} ({', '.join(name for name, _ in cols)}) "
        f"VALUES ({', '.join('?' * len(cols))}) {on_conflict}",
        [encoded[name] if encoded and name in encoded else enc(getattr(rec, name)) for name, (_, enc) in cols],
    )


def _resolve(c: Conn, tenant: str, review_id: str, how: Resolution, now: float) -> None:
    c.execute(
        "UPDATE reviews SET state=?, resolved_at=?, reviewer=?, note=? WHERE tenant=? AND id=?",
        (how.state.value, now, how.reviewer, how.note, tenant, review_id),
    )


@dataclasses.dataclass
class _DecisionWrite:
    """One decision's rows for the group commit; ``refused`` is filled by the transaction."""

    records: tuple[Any, ...]  # the audit record and its reviews
    outbox: tuple[OutboxRecord, ...]
    max_pending: dict[str, int]
    audit_bytes: int = 0
    rules_json: str | None = None  # the audit record's rules, already encoded
    receipt_json: str | None = None  # and its receipt (receipt_text), which no quota rewrites
    refused: list[OutboxRecord | ReviewRecord] = dataclasses.field(default_factory=list)
    max_open_reviews: int | None = None
    retained: RetainedRecord | None = None  # the decision's sealed inputs (docs/retention.md)


# The tenants with pending messages of a kind, one index seek each (a loose index scan on
# outbox_tenant_due): never a walk over a tenant's whole backlog.
_PENDING_TENANTS = """
WITH RECURSIVE t(tenant) AS (
    SELECT MIN(tenant) FROM outbox WHERE kind=? AND state=?
    UNION ALL
    SELECT (SELECT MIN(tenant) FROM outbox WHERE kind=? AND state=? AND tenant>t.tenant) FROM t
    WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL
"""


def _round_robin(
    c: Conn, kinds: Sequence[str], now: float, limit: int, per_tenant: int, held: Mapping[str, int]
) -> list[Any]:
    """Due, unleased rows: at most ``per_tenant - held`` of a tenant, in turns (every tenant's
    oldest, then every tenant's second oldest, ...), tenants in the order of their oldest. A
    tenant at its share is not read at all: however long its backlog, it costs nothing here."""
    mine: dict[str, list[Any]] = {}
    pending = OutboxState.PENDING.value
    for kind in kinds:
        for (tenant,) in c.execute(_PENDING_TENANTS, (kind, pending, kind, pending)).fetchall():
            room = per_tenant - held.get(tenant, 0) - len(mine.get(tenant, ()))
            if room <= 0:
                continue
            rows = c.execute(
                # by next_attempt_at alone: the index's order, so LIMIT stops early even when a
                # whole backlog shares one due time (a tie-break would sort all of it)
                "SELECT * FROM outbox WHERE kind=? AND state=? AND tenant=? AND next_attempt_at<=? AND lease_until<=? "
                "ORDER BY next_attempt_at LIMIT ?",
                (kind, pending, tenant, now, now, room),
            ).fetchall()
            if rows:
                mine.setdefault(tenant, []).extend(rows)
    queues = sorted(
        (sorted(rows, key=lambda r: (r["next_attempt_at"], r["created_at"], r["id"])) for rows in mine.values()),
        key=lambda q: (q[0]["next_attempt_at"], q[0]["created_at"]),
    )
    out: list[Any] = []
    for turn in range(per_tenant):
        for q in queues:
            if turn < len(q) and len(out) < limit:
                out.append(q[turn])
    return out


def _open_reviews(c: Conn, tenant: str) -> int:
    row = c.execute(
        "SELECT COUNT(*) FROM reviews WHERE tenant=? AND state=?", (tenant, ReviewState.OPEN.value)
    ).fetchone()
    return int(row[0])


def _reviews_not_opened(audit: AuditRecord, reviews: Sequence[ReviewRecord], cap: int, held: int) -> AuditRecord:
    """``audit`` with each rule that asked for one of ``reviews`` saying why it was not opened."""
    why = f"{OPEN_REVIEWS_QUOTA}={cap}: the tenant had {held} open reviews"
    asked = {r.rule for r in reviews}
    rules = [{**r, "review_not_opened": why} if r.get("rule") in asked else r for r in audit.rules]
    return dataclasses.replace(audit, rules=rules)


def _pending_count(c: Conn, tenant: str, kind: str) -> int:
    row = c.execute(
        "SELECT COUNT(*) FROM outbox WHERE tenant=? AND kind=? AND state=?", (tenant, kind, OutboxState.PENDING.value)
    ).fetchone()
    return int(row[0])


_RETAINED_COLUMNS = (
    "tenant", "decision_id", "policy", "environment", "created_at", "expires_at", "key_id", "nonce", "ciphertext"
)  # fmt: skip


def _insert_retained(c: Conn, rec: RetainedRecord) -> None:
    c.execute(
        f"INSERT INTO retained_inputs ({', '.join(_RETAINED_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(_RETAINED_COLUMNS))})",
        [getattr(rec, name) for name in _RETAINED_COLUMNS],
    )
    if rec.index:
        c.executemany(
            "INSERT INTO retained_index (tenant, digest, decision_id) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [(rec.tenant, digest, rec.decision_id) for digest in sorted(set(rec.index))],
        )


def _retained(row: Row) -> RetainedRecord:
    return RetainedRecord(
        **{name: row[name] for name in _RETAINED_COLUMNS if name not in ("nonce", "ciphertext")},
        nonce=bytes(row["nonce"]),
        ciphertext=bytes(row["ciphertext"]),
    )


def _violations_counted(rules: list[Any]) -> bool:
    """Replace each evaluator's ``violations`` list (kept raw with the audit's raw text: it may
    quote the prompt or response) by its count, as a record without raw text holds it; True when
    anything changed."""
    changed = False
    for rule in rules:
        for ev in rule.get("evaluators") or () if isinstance(rule, dict) else ():
            if isinstance(ev, dict) and isinstance(ev.get("violations"), list):
                ev["violations"] = len(ev["violations"])
                changed = True
    return changed


# Outbox kinds of the decision log ("decision_log:http", "decision_log:file"): their payload is a
# copy of the audit record, raw text included when the record has it.
DECISION_LOG_KIND_PREFIX = "decision_log:"

# The decisions an erasure matches, as a subquery with one bound value (the tenant comes first).
ERASE_BY_INDEX = "SELECT decision_id FROM retained_index WHERE tenant=? AND digest=?"
# The decision log's copies of the erased records; ``match`` selects the decisions. Found through
# outbox_decision (tenant, decision_id): the outbox keeps every delivered copy, never walk it.
ERASE_OUTBOX_COPIES = "SELECT id, payload FROM outbox WHERE tenant=? AND kind LIKE ? AND {match}"


def _store_version(
    c: Conn, tenant: str, name: str, declared_version: str, description: str, content: str, now: float
) -> tuple[PolicyVersionRecord, bool]:
    """The version holding ``content`` (reused by digest) or a new one numbered after the last."""
    digest = sha256_text(content)
    row = c.execute(
        "SELECT * FROM policy_versions WHERE tenant=? AND name=? AND digest=? ORDER BY version DESC LIMIT 1",
        (tenant, name, digest),
    ).fetchone()
    if row is not None:
        return _record(PolicyVersionRecord, row), False
    (latest,) = c.execute(
        "SELECT COALESCE(MAX(version), 0) FROM policy_versions WHERE tenant=? AND name=?", (tenant, name)
    ).fetchone()
    version = PolicyVersionRecord(
        tenant=tenant,
        name=name,
        version=latest + 1,
        declared_version=declared_version,
        digest=digest,
        description=description,
        content=content,
        created_at=now,
    )
    _insert(c, version)
    return version, True


def _history(c: Conn, tenant: str, name: str, environment: str, version: int, kind: str, now: float) -> None:
    c.execute(
        "INSERT INTO deployment_history (tenant, name, environment, version, kind, at) VALUES (?,?,?,?,?,?)",
        (tenant, name, environment, version, kind, now),
    )


def _running(c: Conn, tenant: str, name: str, environment: str, lock: str = "") -> CandidateRecord | None:
    row = c.execute(
        f"SELECT * FROM candidates WHERE tenant=? AND name=? AND environment=? AND state=?{lock}",
        (tenant, name, environment, CandidateState.RUNNING.value),
    ).fetchone()
    return None if row is None else _record(CandidateRecord, row)


def _shadow_totals(diffs: Sequence[ShadowDiffRecord]) -> tuple[int, int, int, int, int, int]:
    """(evaluated, agreed, pass_to_fail, fail_to_pass, action_changes, errors) of ``diffs``."""
    agreed = p2f = f2p = actions = errors = 0
    for d in diffs:
        if d.error:
            errors += 1
            continue
        same = d.live_passed == d.candidate_passed and d.live_action == d.candidate_action
        agreed += same
        p2f += d.live_passed and not d.candidate_passed
        f2p += not d.live_passed and d.candidate_passed
        actions += d.live_action != d.candidate_action
    return len(diffs), agreed, p2f, f2p, actions, errors


def _take_seqs(c: Conn, batch: Sequence[_DecisionWrite]) -> dict[str, Iterator[int]]:
    """Sequence numbers for the batch's decisions, per tenant, taken from the log heads in this
    transaction: the head row stays locked until the commit, so a replica's numbers commit in
    order and a rolled-back batch hands none out (no gaps). Tenants are locked in one order on
    every replica, so two batches never wait on each other in a cycle."""
    counts: dict[str, int] = {}
    for write in batch:
        tenant = write.records[0].tenant
        counts[tenant] = counts.get(tenant, 0) + 1
    seqs: dict[str, Iterator[int]] = {}
    for tenant in sorted(counts):
        n = counts[tenant]
        row = c.execute(
            "INSERT INTO log_heads (tenant, size) VALUES (?, ?) "
            "ON CONFLICT (tenant) DO UPDATE SET size=log_heads.size+excluded.size RETURNING size",
            (tenant, n),
        ).fetchone()
        end = int(row[0])
        seqs[tenant] = iter(range(end - n, end))
    return seqs


def _logged(audit: AuditRecord, seqs: Mapping[str, Iterator[int]], encoded: Mapping[str, Any]) -> AuditRecord:
    """``audit`` with its sequence number and leaf hash (over the values as they are written)."""
    seq = next(seqs[audit.tenant])
    values = tuple(encoded[name] if name in encoded else _ENCODE[name](getattr(audit, name)) for name in LEAF_COLUMNS)
    return dataclasses.replace(audit, log_seq=seq, leaf_hash=leaf_hash(leaf_document(values, seq)).hex())


def _labels_query(
    tenant: str,
    policy: str,
    environment: str,
    since: float | None,
    after: tuple[float, str] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """Resolved reviews (by a person) and rule-level feedback labels of one policy's decisions in
    one environment, as one keyset-paged list ordered by (labelled_at, id): see Store.page_labels."""
    columns = "source, id, decision_id, rule, label, labelled_at, decided_at, rules"
    reviews = (
        "SELECT 'review' AS source, r.id AS id, r.decision_id AS decision_id, r.rule AS rule, r.state AS label, "
        "r.resolved_at AS labelled_at, d.created_at AS decided_at, d.rules AS rules "
        "FROM reviews r JOIN decisions d ON d.tenant = r.tenant AND d.decision_id = r.decision_id "
        "WHERE r.tenant = ? AND r.policy = ? AND r.environment = ? AND r.state IN (?, ?) AND r.reviewer != ? "
        "AND r.resolved_at IS NOT NULL AND r.resolved_at >= ?"
    )
    feedback = (
        "SELECT 'feedback' AS source, f.id AS id, f.decision_id AS decision_id, f.rule AS rule, f.label AS label, "
        "f.created_at AS labelled_at, d.created_at AS decided_at, d.rules AS rules "
        "FROM feedback f JOIN decisions d ON d.tenant = f.tenant AND d.decision_id = f.decision_id "
        "WHERE f.tenant = ? AND d.policy = ? AND d.environment = ? AND f.rule != '' AND f.label IN (?, ?) "
        "AND f.created_at >= ?"
    )
    start = float(since) if since is not None else 0.0
    args: list[Any] = [tenant, policy, environment, *LABEL_REVIEW_STATES, AUTO_REVIEWER, start]
    args += [tenant, policy, environment, *LABEL_FEEDBACK, start]
    sql = f"SELECT {columns} FROM ({reviews} UNION ALL {feedback}) labels"
    if after is not None:  # the keyset: strictly after the previous page's last label
        sql += " WHERE labelled_at >= ? AND (labelled_at > ? OR id > ?)"
        args += [float(after[0]), float(after[0]), str(after[1])]
    sql += " ORDER BY labelled_at, id LIMIT ?"
    args.append(_page(limit))
    return sql, args


def _rule_score(rules: Any, rule: str) -> float | None:
    """The recorded score of ``rule`` in an audit record's rules (None: no score, or no such rule)."""
    for r in rules if isinstance(rules, list) else ():
        if isinstance(r, dict) and r.get("rule") == rule:
            score = r.get("score")
            return float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None
    return None


def _log_row(row: Row) -> LogRow:
    seq = row[1]  # an integer, or NULL: anything else (SQLite keeps what it is given) is outside the log
    return LogRow(row[0], seq if isinstance(seq, int) and not isinstance(seq, bool) else None, row[2], tuple(row[3:]))


def _log_select(as_bytes: str) -> str:
    """A decision's log columns, then LEAF_COLUMNS (rules and receipt as bytes, by ``as_bytes``:
    the backend's cast of a text column to its UTF-8 bytes): what verification reads of each record."""
    cols = [as_bytes.format(c) if c in ("rules", "receipt") else c for c in LEAF_COLUMNS]
    return f"SELECT decision_id, log_seq, leaf_hash, {', '.join(cols)} FROM decisions"


class SqlStore(Store):
    """Every store operation as SQL; subclasses run the transactions (:meth:`_tx`)."""

    # Row lock of a read-modify-write (PostgreSQL: FOR UPDATE; SQLite's single writer needs none).
    FOR_UPDATE = ""
    # Set by the backend's constructor: the threads its transactions block, and whether it closed.
    _executor: Executor
    _closed: bool

    async def _run(self, fn: Callable[[Conn], T], *, contended: bool = False) -> T:
        """Run ``fn`` in one transaction (:meth:`_tx`) on the backend's threads, off the event loop.
        A closed store, or an executor shut down while the call waited, is StoreUnavailableError
        (a typed, retryable answer during shutdown rather than a crash), the same on every backend."""
        if self._closed:
            raise StoreUnavailableError(CLOSED)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._tx, fn, contended)
        except RuntimeError as exc:  # the executor shut down under us
            raise StoreUnavailableError(f"the store is closed: {exc}") from None

    async def _scrub(self) -> None:
        """After an erasure or purge: make what it removed unreadable from the database files as
        far as the backend can (SQLite: truncate the WAL; PostgreSQL cannot, docs/retention.md)."""

    @abc.abstractmethod
    def _tx(self, fn: Callable[[Conn], T], contended: bool) -> T:
        """Run ``fn`` in one transaction (committed when it returns, rolled back when it raises), in
        an executor thread; the backend's own failures become typed errors here.
        ``contended``: a hot row that concurrent callers update through ``FOR_UPDATE`` (a backend
        may then use a weaker isolation that queues them instead of failing all but one)."""

    async def take_rate_token(
        self, key: str, *, rate_per_s: float, capacity: float, now: float, max_wait_s: float
    ) -> float | None:
        def tx(c: Conn) -> float | None:
            c.execute(
                "INSERT INTO rate_buckets (key, tokens, updated) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, capacity, now),
            )
            row = c.execute(f"SELECT tokens, updated FROM rate_buckets WHERE key=?{self.FOR_UPDATE}", (key,)).fetchone()
            got = take(float(row[0]), now - float(row[1]), rate_per_s, capacity, max_wait_s)
            if got is None:
                return None
            c.execute("UPDATE rate_buckets SET tokens=?, updated=? WHERE key=?", (got[0], max(now, row[1]), key))
            return got[1]

        return await self._run(tx, contended=True)

    # --- policies -----------------------------------------------------------------------

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
        now = time.time()

        def tx(c: Conn) -> tuple[PolicyVersionRecord, DeploymentRecord, bool]:
            version, created = _store_version(c, tenant, name, declared_version, description, content, now)
            deployment = self._set_deployment(c, tenant, name, environment, version.version, "deploy", now)
            return version, deployment, created

        return await self._run(tx)

    @staticmethod
    def _set_deployment(
        c: Conn, tenant: str, name: str, environment: str, version: int, kind: str, now: float
    ) -> DeploymentRecord:
        if kind != "promote":  # a candidate is tried against the version it started beside: a new one ends it
            cand = _running(c, tenant, name, environment)
            if cand is not None:
                c.execute(
                    "UPDATE candidates SET state=?, ended_at=?, reason=? WHERE tenant=? AND id=?",
                    (CandidateState.DISCARDED.value, now, f"superseded by a {kind} to v{version}", tenant, cand.id),
                )
                _history(c, tenant, name, environment, cand.version, "discard", now)
        deployment = DeploymentRecord(
            tenant=tenant, name=name, environment=environment, version=version, deployed_at=now
        )
        _insert(
            c,
            deployment,
            "ON CONFLICT (tenant, name, environment) "
            "DO UPDATE SET version=excluded.version, deployed_at=excluded.deployed_at",
        )
        _history(c, tenant, name, environment, version, kind, now)
        return deployment

    async def get_policy_version(self, tenant: str, name: str, version: int) -> PolicyVersionRecord:
        def tx(c: Conn) -> PolicyVersionRecord:
            key = {"name": name, "version": version}
            row = _one(c, "policy_versions", tenant, key, f"policy {name!r} has no version {version}")
            return _record(PolicyVersionRecord, row)

        return await self._run(tx)

    async def get_deployed_policy(self, tenant: str, name: str, environment: str) -> PolicyVersionRecord:
        def tx(c: Conn) -> PolicyVersionRecord:
            row = c.execute(
                "SELECT v.* FROM deployments d JOIN policy_versions v "
                "ON v.tenant=d.tenant AND v.name=d.name AND v.version=d.version "
                "WHERE d.tenant=? AND d.name=? AND d.environment=?",
                (tenant, name, environment),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"policy {name!r} is not deployed in environment {environment!r}")
            return _record(PolicyVersionRecord, row)

        return await self._run(tx)

    async def list_deployments(self, tenant: str, name: str) -> list[DeploymentRecord]:
        def tx(c: Conn) -> list[DeploymentRecord]:
            rows = c.execute(*_listing("deployments", tenant, {"name=?": name}, order="environment")).fetchall()
            return [_record(DeploymentRecord, r) for r in rows]

        return await self._run(tx)

    async def list_policies(
        self, tenant: str, environment: str | None = None, *, limit: int | None = None
    ) -> list[PolicySummaryRecord]:
        def tx(c: Conn) -> list[PolicySummaryRecord]:
            # The page is cut in SQL (a tenant's policies are not capped in number): only the
            # policies answered, and their deployments, are read.
            deployed_in = (
                "EXISTS (SELECT 1 FROM deployments d WHERE d.tenant=pv.tenant AND d.name=pv.name AND d.environment=?)"
            )
            latest = c.execute(
                *_listing(
                    "policy_versions pv",
                    tenant,
                    {deployed_in: environment or None},
                    columns="name, MAX(version) AS v",
                    group="name",
                    order="name",
                    limit=limit,
                )
            ).fetchall()
            deps: dict[str, list[DeploymentRecord]] = {}
            for r in _keyed(c, "deployments", tenant, "name", [r["name"] for r in latest], order="environment"):
                deps.setdefault(r["name"], []).append(_record(DeploymentRecord, r))
            return [
                PolicySummaryRecord(name=r["name"], latest_version=r["v"], deployments=tuple(deps.get(r["name"], [])))
                for r in latest
            ]

        return await self._run(tx)

    async def rollback_policy(
        self, tenant: str, name: str, environment: str, to_version: int | None = None
    ) -> tuple[DeploymentRecord, int]:
        now = time.time()

        def tx(c: Conn) -> tuple[DeploymentRecord, int]:
            current = c.execute(
                "SELECT version FROM deployments WHERE tenant=? AND name=? AND environment=?",
                (tenant, name, environment),
            ).fetchone()
            if current is None:
                raise NotFoundError(f"policy {name!r} is not deployed in environment {environment!r}")
            cur = current["version"]
            target = to_version
            if target is None:
                row = c.execute(
                    "SELECT version FROM deployment_history WHERE tenant=? AND name=? AND environment=? "
                    f"AND version != ? AND kind IN {DEPLOYED_KINDS} ORDER BY seq DESC LIMIT 1",
                    (tenant, name, environment, cur),
                ).fetchone()
                if row is None:
                    raise NotFoundError(
                        f"policy {name!r} has no earlier deployment in environment {environment!r} to roll back to"
                    )
                target = row["version"]
            exists = c.execute(
                "SELECT 1 FROM policy_versions WHERE tenant=? AND name=? AND version=?", (tenant, name, target)
            ).fetchone()
            if exists is None:
                raise NotFoundError(f"policy {name!r} has no version {target}")
            return self._set_deployment(c, tenant, name, environment, target, "rollback", now), cur

        return await self._run(tx)

    # --- shadow and canary candidates ------------------------------------------------------

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
        now = time.time()

        def tx(c: Conn) -> tuple[PolicyVersionRecord, CandidateRecord, bool]:
            active = c.execute(
                f"SELECT version FROM deployments WHERE tenant=? AND name=? AND environment=?{self.FOR_UPDATE}",
                (tenant, name, environment),
            ).fetchone()
            if active is None:
                raise NotFoundError(
                    f"policy {name!r} is not deployed in environment {environment!r}: a {mode.value} candidate is "
                    "tried beside an active version (deploy one first)"
                )
            running = _running(c, tenant, name, environment)
            if running is not None:
                raise CandidateStateError(
                    f"policy {name!r} already has a running {running.mode.value} candidate (v{running.version}) in "
                    f"{environment!r}: promote or discard it first"
                )
            version, created = _store_version(c, tenant, name, declared_version, description, content, now)
            if version.version == active["version"]:
                raise CandidateStateError(
                    f"this candidate is v{version.version} of {name!r}, the version already active in {environment!r}"
                )
            cand = CandidateRecord(
                id=str(uuid.uuid4()),
                tenant=tenant,
                name=name,
                environment=environment,
                mode=mode,
                version=version.version,
                active_version=int(active["version"]),
                share=float(share),
                canary_key=canary_key,
                notify_url=notify_url,
                bounds=dict(bounds or {}),
                state=CandidateState.RUNNING,
                started_at=now,
            )
            _insert(c, cand)
            _history(c, tenant, name, environment, version.version, mode.value, now)
            return version, cand, created

        return await self._run(tx)

    async def get_candidate(self, tenant: str, name: str, environment: str) -> CandidateRecord:
        def tx(c: Conn) -> CandidateRecord:
            found = _running(c, tenant, name, environment)
            if found is not None:
                return found
            row = c.execute(
                "SELECT * FROM candidates WHERE tenant=? AND name=? AND environment=? ORDER BY started_at DESC LIMIT 1",
                (tenant, name, environment),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"policy {name!r} has no shadow or canary candidate in environment {environment!r}")
            return _record(CandidateRecord, row)

        return await self._run(tx)

    async def running_candidate(self, tenant: str, name: str, environment: str) -> CandidateRecord | None:
        return await self._run(lambda c: _running(c, tenant, name, environment))

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
        if state is CandidateState.RUNNING:
            raise InvalidInputError("a candidate ends promoted, discarded or rolled back")
        now = time.time()
        kind = {CandidateState.PROMOTED: "promote", CandidateState.DISCARDED: "discard"}.get(state, "canary_rollback")

        def tx(c: Conn) -> tuple[CandidateRecord, DeploymentRecord | None]:
            cand = _running(c, tenant, name, environment, self.FOR_UPDATE)
            if cand is None or (candidate_id is not None and cand.id != candidate_id):
                raise CandidateStateError(
                    f"policy {name!r} has no running shadow or canary candidate in environment {environment!r}"
                )
            c.execute(
                "UPDATE candidates SET state=?, ended_at=?, reason=? WHERE tenant=? AND id=?",
                (state.value, now, reason, tenant, cand.id),
            )
            deployment = None
            if state is CandidateState.PROMOTED:
                deployment = self._set_deployment(c, tenant, name, environment, cand.version, kind, now)
            else:
                _history(c, tenant, name, environment, cand.version, kind, now)
            for msg in outbox:
                _insert(c, msg)
            return dataclasses.replace(cand, state=state, ended_at=now, reason=reason), deployment

        return await self._run(tx)

    async def record_shadow_diffs(
        self,
        diffs: Sequence[ShadowDiffRecord],
        *,
        dropped: Mapping[str, tuple[str, int]] | None = None,
        max_diffs: int,
    ) -> None:
        def tx(c: Conn) -> None:
            mine: dict[str, list[ShadowDiffRecord]] = {}
            for d in diffs:
                mine.setdefault(d.candidate_id, []).append(d)
            owners = {cid: group[0].tenant for cid, group in mine.items()}
            owners.update({cid: tenant for cid, (tenant, _) in (dropped or {}).items() if cid not in owners})
            for cid, tenant in owners.items():
                row = c.execute(
                    f"SELECT diffs_stored FROM candidates WHERE tenant=? AND id=? AND state=?{self.FOR_UPDATE}",
                    (tenant, cid, CandidateState.RUNNING.value),
                ).fetchone()
                if row is None:  # ended (or not this tenant's): nothing more is added to it
                    continue
                group = [d for d in mine.get(cid, ()) if d.tenant == tenant]
                kept = group[: max(0, max_diffs - int(row[0]))]
                for d in kept:
                    _insert(c, d, "ON CONFLICT (candidate_id, decision_id) DO NOTHING")
                t = _shadow_totals(group)
                c.execute(
                    "UPDATE candidates SET evaluated=evaluated+?, agreed=agreed+?, pass_to_fail=pass_to_fail+?, "
                    "fail_to_pass=fail_to_pass+?, action_changes=action_changes+?, errors=errors+?, "
                    "dropped=dropped+?, diffs_stored=diffs_stored+? WHERE id=?",
                    (*t, (dropped or {}).get(cid, (tenant, 0))[1], len(kept), cid),
                )
                flips: dict[str, int] = {}
                for d in group:
                    for r in d.rules:
                        if r.get("flipped"):
                            flips[str(r["rule"])] = flips.get(str(r["rule"]), 0) + 1
                c.executemany(
                    "INSERT INTO shadow_rule_flips (tenant, candidate_id, rule, flips) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (candidate_id, rule) DO UPDATE SET flips=shadow_rule_flips.flips+excluded.flips",
                    [(tenant, cid, rule, n) for rule, n in sorted(flips.items())],
                )

        await self._run(tx, contended=True)

    async def shadow_rule_flips(self, tenant: str, candidate_id: str) -> dict[str, int]:
        def tx(c: Conn) -> dict[str, int]:
            rows = c.execute(
                "SELECT rule, flips FROM shadow_rule_flips WHERE tenant=? AND candidate_id=? ORDER BY rule",
                (tenant, candidate_id),
            ).fetchall()
            return {r[0]: int(r[1]) for r in rows}

        return await self._run(tx)

    async def list_shadow_diffs(
        self, tenant: str, candidate_id: str, *, changed_only: bool = True, limit: int = 100
    ) -> list[ShadowDiffRecord]:
        def tx(c: Conn) -> list[ShadowDiffRecord]:
            filters = {"candidate_id=?": candidate_id, "changed=?": 1 if changed_only else None}
            q = _listing("shadow_diffs", tenant, filters, order="created_at DESC, decision_id", limit=limit)
            return [_record(ShadowDiffRecord, r) for r in c.execute(*q).fetchall()]

        return await self._run(tx)

    async def revision_counts(
        self, tenant: str, name: str, environment: str, since: float, revisions: Sequence[int]
    ) -> dict[int, tuple[int, int, int]]:
        def tx(c: Conn) -> dict[int, tuple[int, int, int]]:
            marks = ", ".join("?" * len(revisions))
            rows = c.execute(
                "SELECT policy_revision, COUNT(*), SUM(CASE WHEN errored_rules != '[]' THEN 1 ELSE 0 END), "
                "SUM(CASE WHEN action = 'block' THEN 1 ELSE 0 END) FROM decisions "
                f"WHERE tenant=? AND policy=? AND environment=? AND created_at>=? AND policy_revision IN ({marks}) "
                "GROUP BY policy_revision",
                (tenant, name, environment, since, *revisions),
            ).fetchall()
            return {int(r[0]): (int(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in rows}

        if not revisions:
            return {}
        return await self._run(tx)

    async def list_history(self, tenant: str, name: str, environment: str, *, limit: int = 100) -> list[HistoryRecord]:
        def tx(c: Conn) -> list[HistoryRecord]:
            rows = c.execute(
                "SELECT name, environment, version, kind, at FROM deployment_history "
                "WHERE tenant=? AND name=? AND environment=? ORDER BY seq DESC LIMIT ?",
                (tenant, name, environment, _page(limit)),
            ).fetchall()
            return [HistoryRecord(r[0], r[1], int(r[2]), r[3], float(r[4])) for r in rows]

        return await self._run(tx)

    # --- evaluators ---------------------------------------------------------------------

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
        now = time.time()

        def tx(c: Conn) -> tuple[EvaluatorRecord, bool]:
            row = c.execute(
                "SELECT * FROM evaluators WHERE tenant=? AND name=? AND digest=? ORDER BY version DESC LIMIT 1",
                (tenant, name, digest),
            ).fetchone()
            if row is not None:
                return _record(EvaluatorRecord, row), False
            if max_versions is not None or max_code_bytes is not None:
                count, stored = c.execute(
                    "SELECT COUNT(*), COALESCE(SUM(octet_length(code)), 0) FROM evaluators WHERE tenant=?", (tenant,)
                ).fetchone()
                if max_versions is not None and count >= max_versions:
                    raise QuotaExceededError(
                        f"this tenant already stores {count} uploaded evaluator versions, at most {max_versions} "
                        f"({EVALUATORS_QUOTA})",
                        setting=EVALUATORS_QUOTA,
                    )
                size = len(code.encode())
                if max_code_bytes is not None and int(stored) + size > max_code_bytes:
                    raise QuotaExceededError(
                        f"this upload ({size} bytes) would take this tenant's stored evaluator code to "
                        f"{int(stored) + size} bytes, over {max_code_bytes} ({EVALUATOR_CODE_QUOTA})",
                        setting=EVALUATOR_CODE_QUOTA,
                    )
            (latest,) = c.execute(
                "SELECT COALESCE(MAX(version), 0) FROM evaluators WHERE tenant=? AND name=?", (tenant, name)
            ).fetchone()
            rec = EvaluatorRecord(
                id=str(uuid.uuid4()),
                tenant=tenant,
                name=name,
                version=latest + 1,
                language=language,
                dependencies=tuple(dependencies),
                digest=digest,
                code=code,
                description=description,
                created_at=now,
            )
            _insert(c, rec)
            return rec, True

        return await self._run(tx)

    async def get_evaluator(self, tenant: str, evaluator_id: str) -> EvaluatorRecord:
        def tx(c: Conn) -> EvaluatorRecord:
            row = _one(c, "evaluators", tenant, {"id": evaluator_id}, f"evaluator {evaluator_id!r} not found")
            return _record(EvaluatorRecord, row)

        return await self._run(tx)

    async def get_evaluator_by_name(self, tenant: str, name: str, version: int | None = None) -> EvaluatorRecord:
        def tx(c: Conn) -> EvaluatorRecord:
            if version:
                row = c.execute(
                    "SELECT * FROM evaluators WHERE tenant=? AND name=? AND version=?", (tenant, name, version)
                ).fetchone()
            else:
                row = c.execute(
                    "SELECT * FROM evaluators WHERE tenant=? AND name=? ORDER BY version DESC LIMIT 1", (tenant, name)
                ).fetchone()
            if row is None:
                suffix = f" version {version}" if version else ""
                raise NotFoundError(f"evaluator {name!r}{suffix} not found")
            return _record(EvaluatorRecord, row)

        return await self._run(tx)

    async def list_evaluators(self, tenant: str, name: str | None = None) -> list[EvaluatorRecord]:
        def tx(c: Conn) -> list[EvaluatorRecord]:
            rows = c.execute(
                *_listing("evaluators", tenant, {"name=?": name or None}, order="name, version")
            ).fetchall()
            return [_record(EvaluatorRecord, r, code="") for r in rows]

        return await self._run(tx)

    # --- audit, reviews, feedback -------------------------------------------------------

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
        """Committed with concurrent decisions in one transaction (:mod:`crossaudit.store.groupcommit`)."""
        for rec in (*reviews, *outbox, *((retained,) if retained else ())):
            if rec.tenant != audit.tenant or rec.decision_id != audit.decision_id:
                raise InvalidInputError("a review, message or retained row must belong to its decision")
        if self._decisions is None:
            self._decisions = GroupCommit(
                self._record_decisions, key=lambda w: w.records[0].tenant, size=lambda w: w.audit_bytes
            )
        if rules_json is None:
            rules_json = audit_rules_json(audit)
        if receipt_json is None:
            receipt_json = receipt_text(audit.receipt)
        size = audit_size(audit, rules_json, receipt_json) if audit_bytes is None else audit_bytes
        write = _DecisionWrite((audit, *reviews), tuple(outbox), dict(max_pending or {}), size, rules_json)
        write.receipt_json = receipt_json
        write.max_open_reviews = max_open_reviews
        write.retained = retained
        await self._decisions.commit(write)
        return write.refused

    _decisions: GroupCommit[_DecisionWrite] | None = None
    # This writer's own row of audit_usage per tenant and day: replicas never update one row.
    _usage_writer: str = ""

    async def _record_decisions(self, batch: Sequence[_DecisionWrite]) -> None:
        if not self._usage_writer:
            self._usage_writer = uuid.uuid4().hex

        def tx(c: Conn) -> None:
            pending: dict[tuple[str, str], int] = {}  # (tenant, kind) -> pending, as this batch goes
            usage: dict[tuple[str, int], int] = {}  # (tenant, day) -> audit bytes of this batch
            opened: dict[str, int] = {}  # tenant -> open reviews, as this batch goes
            seqs = _take_seqs(c, batch) if self.log_decisions else {}
            for write in batch:
                write.refused.clear()  # a transaction re-run (a retried batch, a lone re-write) starts over
                audit, reviews = write.records[0], write.records[1:]
                cap = write.max_open_reviews
                if reviews and cap is not None:
                    if audit.tenant not in opened:
                        opened[audit.tenant] = _open_reviews(c, audit.tenant)
                    if opened[audit.tenant] + len(reviews) > cap:  # the decision is kept, its reviews are not
                        write.refused.extend(reviews)
                        audit, reviews = _reviews_not_opened(audit, reviews, cap, opened[audit.tenant]), ()
                    opened[audit.tenant] += len(reviews)
                # the rules as encoded by the caller, unless the review quota rewrote the record
                encoded = {
                    "rules": write.rules_json if audit is write.records[0] else audit_rules_json(audit),
                    "receipt": receipt_text(audit.receipt) if write.receipt_json is None else write.receipt_json,
                }
                if self.log_decisions:
                    audit = _logged(audit, seqs, encoded)
                _insert(c, audit, encoded=encoded)
                for rec in reviews:
                    _insert(c, rec)
                if write.retained is not None:
                    _insert_retained(c, write.retained)
                key = (audit.tenant, int(audit.created_at // AUDIT_DAY_S))
                usage[key] = usage.get(key, 0) + write.audit_bytes
                for msg in write.outbox:
                    cap = write.max_pending.get(msg.kind)
                    if cap is not None and msg.state is OutboxState.PENDING:
                        key = (msg.tenant, msg.kind)
                        if key not in pending:
                            pending[key] = _pending_count(c, msg.tenant, msg.kind)
                        if pending[key] >= cap:
                            write.refused.append(msg)
                            continue
                        pending[key] += 1
                    _insert(c, msg)
            c.executemany(
                "INSERT INTO audit_usage (tenant, day, writer, bytes) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tenant, day, writer) DO UPDATE SET bytes=audit_usage.bytes+excluded.bytes",
                [(tenant, day, self._usage_writer, n) for (tenant, day), n in usage.items()],
            )

        await self._run(tx)

    async def audit_bytes(self, tenant: str, day: int) -> int:
        def tx(c: Conn) -> int:
            row = c.execute("SELECT SUM(bytes) FROM audit_usage WHERE tenant=? AND day=?", (tenant, day)).fetchone()
            return int(row[0] or 0)

        return await self._run(tx)

    async def get_decision(self, tenant: str, decision_id: str) -> AuditRecord:
        def tx(c: Conn) -> AuditRecord:
            row = _one(c, "decisions", tenant, {"decision_id": decision_id}, f"decision {decision_id!r} not found")
            return _record(AuditRecord, row)

        return await self._run(tx)

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
        def page(columns: str = "*") -> tuple[str, list[Any]]:
            return _listing(
                "decisions",
                tenant,
                {"policy=?": policy or None},
                columns=columns,
                since=since,
                until=until,
                order="created_at DESC, decision_id",
                limit=limit,
            )

        def tx(c: Conn) -> list[AuditRecord]:
            if max_bytes is None:
                return [_record(AuditRecord, r) for r in c.execute(*page())]
            # Sizes first, then only the records that fit: a page of large records (each up to
            # max_audit_bytes_per_decision) is never read whole into memory.
            ids: list[str] = []
            total = 0
            for r in c.execute(*page(f"decision_id, {_RECORD_SIZE} AS n")):
                total += int(r[1] or 0)
                if ids and total > max_bytes:
                    break
                ids.append(r[0])
            found = {
                r["decision_id"]: _record(AuditRecord, r) for r in _keyed(c, "decisions", tenant, "decision_id", ids)
            }
            return [found[i] for i in ids if i in found]

        return await self._run(tx)

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
        def tx(c: Conn) -> list[AuditRecord]:
            sql, args = _listing(
                "decisions",
                tenant,
                {"policy=?": policy, "environment=?": environment},
                since=since,
                until=until,
                order="created_at DESC, decision_id",
                limit=limit,
            )
            if after is not None:  # the keyset: strictly after the previous page's last record
                # created_at<=? first, a range the (tenant, created_at) index seeks to: with the
                # OR alone, each page scanned every more recent row again (a deep page cost more)
                head, _, tail = sql.partition(" ORDER BY ")
                sql = f"{head} AND created_at<=? AND (created_at<? OR decision_id>?) ORDER BY {tail}"
                args[-1:-1] = [float(after[0]), float(after[0]), str(after[1])]
            return [_record(AuditRecord, r) for r in c.execute(sql, args)]

        return await self._run(tx)

    async def count_decisions(self, tenant: str | None = None) -> int:
        def tx(c: Conn) -> int:
            if tenant is None:
                return int(c.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])
            return int(c.execute("SELECT COUNT(*) FROM decisions WHERE tenant=?", (tenant,)).fetchone()[0])

        return await self._run(tx)

    async def list_reviews(
        self,
        tenant: str,
        *,
        state: ReviewState | None = None,
        policy: str | None = None,
        limit: int = 100,
    ) -> list[ReviewRecord]:
        def tx(c: Conn) -> list[ReviewRecord]:
            filters = {"state=?": state.value if state is not None else None, "policy=?": policy or None}
            q = _listing("reviews", tenant, filters, order="created_at, id", limit=limit)
            return [_record(ReviewRecord, r) for r in c.execute(*q).fetchall()]

        return await self._run(tx)

    async def auto_approve_due(self, tenant: str, now: float) -> int:
        def tx(c: Conn) -> int:
            # SQL only narrows to open items that have the param; the review rules decide.
            rows = c.execute(
                "SELECT * FROM reviews WHERE tenant=? AND state=? AND params LIKE ?",
                (tenant, ReviewState.OPEN.value, f'%"{AUTO_APPROVE_AT}"%'),
            ).fetchall()
            due = [
                rec.id
                for rec in (_record(ReviewRecord, r) for r in rows)
                if timing(rec.kind, rec.state, rec.params, now).auto_approve
            ]
            for review_id in due:
                _resolve(c, tenant, review_id, AUTO_APPROVAL, now)
            return len(due)

        return await self._run(tx)

    async def get_review(self, tenant: str, review_id: str) -> ReviewRecord:
        def tx(c: Conn) -> ReviewRecord:
            row = _one(c, "reviews", tenant, {"id": review_id}, f"review {review_id!r} not found")
            return _record(ReviewRecord, row)

        return await self._run(tx)

    async def resolve_review(
        self, tenant: str, review_id: str, state: ReviewState, *, reviewer: str = "", note: str = ""
    ) -> ReviewRecord:
        if state is ReviewState.OPEN:
            raise InvalidInputError("a review is resolved as approved, rejected or dismissed, not open")
        now = time.time()

        def tx(c: Conn) -> ReviewRecord:
            row = _one(c, "reviews", tenant, {"id": review_id}, f"review {review_id!r} not found")
            if row["state"] != ReviewState.OPEN.value:
                raise ReviewAlreadyResolvedError(f"review {review_id!r} is already {row['state']}")
            _resolve(c, tenant, review_id, Resolution(state, reviewer, note), now)
            return _record(ReviewRecord, c.execute("SELECT * FROM reviews WHERE id=?", (review_id,)).fetchone())

        return await self._run(tx)

    async def add_feedback(
        self, tenant: str, decision_id: str, *, rule: str, label: str, comment: str = ""
    ) -> FeedbackRecord:
        now = time.time()

        def tx(c: Conn) -> FeedbackRecord:
            key = {"decision_id": decision_id}
            row = _one(c, "decisions", tenant, key, f"decision {decision_id!r} not found", columns="rules")
            if rule and rule not in {r.get("rule") for r in json.loads(row["rules"])}:
                raise NotFoundError(f"decision {decision_id!r} has no rule {rule!r}")
            rec = FeedbackRecord(
                id=str(uuid.uuid4()),
                tenant=tenant,
                decision_id=decision_id,
                rule=rule,
                label=label,
                comment=comment,
                created_at=now,
            )
            _insert(c, rec)
            return rec

        return await self._run(tx)

    async def feedback_counts(self, tenant: str) -> dict[tuple[str, str], tuple[int, int, int]]:
        def tx(c: Conn) -> dict[tuple[str, str], tuple[int, int, int]]:
            rows = c.execute(
                "SELECT d.policy, f.rule, COUNT(*), SUM(CASE WHEN f.label = 'false_positive' THEN 1 ELSE 0 END), "
                "SUM(CASE WHEN f.label = 'false_negative' THEN 1 ELSE 0 END) "
                "FROM feedback f JOIN decisions d ON d.tenant = f.tenant AND d.decision_id = f.decision_id "
                "WHERE f.tenant = ? AND f.rule != '' GROUP BY d.policy, f.rule",
                (tenant,),
            ).fetchall()
            return {(r[0], r[1]): (int(r[2]), int(r[3] or 0), int(r[4] or 0)) for r in rows}

        return await self._run(tx)

    async def list_feedback(self, tenant: str, decision_id: str | None = None) -> list[FeedbackRecord]:
        def tx(c: Conn) -> list[FeedbackRecord]:
            q = _listing("feedback", tenant, {"decision_id=?": decision_id or None}, order="created_at, id")
            rows = c.execute(*q).fetchall()
            return [_record(FeedbackRecord, r) for r in rows]

        return await self._run(tx)

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
        def tx(c: Conn) -> list[LabelRecord]:
            rows = c.execute(*_labels_query(tenant, policy, environment, since, after, limit)).fetchall()
            return [
                LabelRecord(
                    source=r[0],
                    id=r[1],
                    decision_id=r[2],
                    rule=r[3],
                    label=r[4],
                    labelled_at=float(r[5]),
                    decided_at=float(r[6]),
                    decision_rules=json.loads(r[7]),
                )
                for r in rows
            ]

        return await self._run(tx)

    async def feedback_scores(self, tenant: str, *, limit: int) -> list[tuple[str, str, str, float | None]]:
        def tx(c: Conn) -> list[tuple[str, str, str, float | None]]:
            rows = c.execute(
                "SELECT d.policy, f.rule, f.label, d.rules "
                "FROM feedback f JOIN decisions d ON d.tenant = f.tenant AND d.decision_id = f.decision_id "
                "WHERE f.tenant = ? AND f.rule != '' AND f.label IN (?, ?) "
                "ORDER BY f.created_at DESC, f.id LIMIT ?",
                (tenant, *LABEL_FEEDBACK, _page(limit)),
            ).fetchall()
            return [(r[0], r[1], r[2], _rule_score(json.loads(r[3]), r[1])) for r in rows]

        return await self._run(tx)

    # --- retained inputs ------------------------------------------------------------------

    async def get_tenant_key(self, tenant: str) -> TenantKeyRecord | None:
        def tx(c: Conn) -> TenantKeyRecord | None:
            row = c.execute("SELECT * FROM tenant_keys WHERE tenant=?", (tenant,)).fetchone()
            return None if row is None else _record(TenantKeyRecord, row)

        return await self._run(tx)

    async def put_tenant_key(self, rec: TenantKeyRecord) -> TenantKeyRecord:
        def tx(c: Conn) -> TenantKeyRecord:
            _insert(c, rec, "ON CONFLICT (tenant) DO NOTHING")
            row = c.execute("SELECT * FROM tenant_keys WHERE tenant=?", (rec.tenant,)).fetchone()
            return _record(TenantKeyRecord, row)

        return await self._run(tx)

    async def rewrap_tenant_key(self, tenant: str, old_operator_key_id: str, rec: TenantKeyRecord) -> bool:
        if rec.tenant != tenant:
            raise InvalidInputError("a tenant's key is rewrapped for that tenant only")

        def tx(c: Conn) -> bool:
            cur = c.execute(
                "UPDATE tenant_keys SET operator_key_id=?, wrapped=? WHERE tenant=? AND operator_key_id=? AND key_id=?",
                (rec.operator_key_id, rec.wrapped, tenant, old_operator_key_id, rec.key_id),
            )
            return cur.rowcount == 1

        return await self._run(tx)

    async def list_tenant_keys(self, *, not_wrapped_by: str, limit: int, after: str = "") -> list[TenantKeyRecord]:
        def tx(c: Conn) -> list[TenantKeyRecord]:
            rows = c.execute(
                "SELECT * FROM tenant_keys WHERE operator_key_id<>? AND tenant>? ORDER BY tenant LIMIT ?",
                (not_wrapped_by, after, _page(limit)),
            ).fetchall()
            return [_record(TenantKeyRecord, r) for r in rows]

        return await self._run(tx)

    async def load_retained(self, tenant: str, decision_ids: Sequence[str], now: float) -> list[RetainedRecord]:
        ids = list(dict.fromkeys(decision_ids))
        if not ids:
            return []

        def tx(c: Conn) -> list[RetainedRecord]:
            rows = _keyed(c, "retained_inputs", tenant, "decision_id", ids)
            return [_retained(r) for r in rows if float(r["expires_at"]) > now]

        return await self._run(tx)

    async def erase_inputs(
        self,
        erasure: ErasureRecord,
        *,
        decision_id: str | None = None,
        blind_index: str | None = None,
        limit: int = ERASE_BATCH,
    ) -> ErasureRecord:
        if (decision_id is None) == (blind_index is None):
            raise InvalidInputError("an erasure names a decision or a context field, exactly one")
        tenant = erasure.tenant

        def tx(c: Conn) -> ErasureRecord:
            args: tuple[Any, ...]
            if decision_id is not None:
                missing = f"decision {decision_id!r} not found"
                _one(c, "decisions", tenant, {"decision_id": decision_id}, missing, columns="decision_id")
                ids: list[str] = [decision_id]
            else:  # a bounded batch: the matched decisions' rows are read into memory below
                q = f"{ERASE_BY_INDEX} ORDER BY decision_id LIMIT ?"
                ids = [r[0] for r in c.execute(q, (tenant, blind_index, min(_page(limit), _IN_CHUNK))).fetchall()]
            match, args = f"decision_id IN ({', '.join('?' * len(ids))})", tuple(ids)
            if not ids:
                match = "0=1"  # nothing matched: the erasure is still recorded
            # the decisions first (the subquery reads the index, removed last); raw violations are
            # derived text (a quoted span), counted like a record kept without raw text
            scrubbed = []
            for row in c.execute(
                f"SELECT decision_id, rules FROM decisions WHERE tenant=? AND {match}", (tenant, *args)
            ).fetchall():
                rules = json.loads(row[1])
                if _violations_counted(rules):
                    scrubbed.append((_json(rules), tenant, row[0]))
            if scrubbed:
                c.executemany("UPDATE decisions SET rules=? WHERE tenant=? AND decision_id=?", scrubbed)
            # the decision log's copies of those records (outbox payloads), sent or not
            copies = []
            for row in c.execute(
                ERASE_OUTBOX_COPIES.format(match=match),
                (tenant, f"{DECISION_LOG_KIND_PREFIX}%", *args),
            ).fetchall():
                entry = json.loads(row[1])
                raw = entry.pop("prompt", None) is not None
                raw = entry.pop("response", None) is not None or raw
                if _violations_counted(entry.get("rules") or []) or raw:
                    copies.append((_json({**entry, "inputs_erased_at": erasure.created_at}), row[0]))
            if copies:
                c.executemany("UPDATE outbox SET payload=? WHERE id=?", copies)
            cur = c.execute(
                f"UPDATE decisions SET prompt=NULL, response=NULL, inputs_erased_at=? WHERE tenant=? AND {match}",
                (erasure.created_at, tenant, *args),
            )
            count = cur.rowcount
            c.execute(f"DELETE FROM retained_inputs WHERE tenant=? AND {match}", (tenant, *args))
            c.execute(f"DELETE FROM retained_index WHERE tenant=? AND {match}", (tenant, *args))
            rec = dataclasses.replace(erasure, decisions=int(count))
            # a later batch of the same erasure adds to its count
            _insert(c, rec, "ON CONFLICT (id) DO UPDATE SET decisions=erasures.decisions+excluded.decisions")
            row = c.execute("SELECT decisions FROM erasures WHERE id=? AND tenant=?", (rec.id, tenant)).fetchone()
            if row is None:  # an id of another tenant's erasure: its count is not ours to add to
                raise InvalidInputError("an erasure id belongs to its tenant")
            return dataclasses.replace(rec, decisions=int(row[0]))

        done = await self._run(tx)
        await self._scrub()
        return done

    async def list_erasures(self, tenant: str, *, limit: int = 100) -> list[ErasureRecord]:
        def tx(c: Conn) -> list[ErasureRecord]:
            q = _listing("erasures", tenant, order="created_at DESC, id", limit=limit)
            return [_record(ErasureRecord, r) for r in c.execute(*q).fetchall()]

        return await self._run(tx)

    async def purge_retained(
        self, now: float, *, limit: int, tenant: str | None = None, created_before: float | None = None
    ) -> int:
        def tx(c: Conn) -> int:
            if tenant is None:
                q = "SELECT tenant, decision_id FROM retained_inputs WHERE expires_at<=? ORDER BY expires_at LIMIT ?"
                args: tuple[Any, ...] = (now, _page(limit))
            else:  # through retained_inputs_created (tenant, created_at)
                q = (
                    "SELECT tenant, decision_id FROM retained_inputs WHERE tenant=? AND created_at<=? "
                    "ORDER BY created_at LIMIT ?"
                )
                args = (tenant, now if created_before is None else created_before, _page(limit))
            rows = c.execute(q, args).fetchall()
            keys = [(r[0], r[1]) for r in rows]
            if keys:
                c.executemany("DELETE FROM retained_index WHERE tenant=? AND decision_id=?", keys)
                c.executemany("DELETE FROM retained_inputs WHERE tenant=? AND decision_id=?", keys)
            return len(keys)

        purged = await self._run(tx)
        if purged:
            await self._scrub()
        return purged

    # --- outbox -------------------------------------------------------------------------

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
        kinds = list(kinds)
        if not kinds or limit <= 0:
            return []
        held = held or {}

        def tx(c: Conn) -> list[OutboxRecord]:
            # BEGIN IMMEDIATE holds the write lock: two workers on one file never lease the same row.
            if per_tenant is None:
                rows = c.execute(
                    f"SELECT * FROM outbox WHERE state=? AND kind IN ({', '.join('?' * len(kinds))}) "
                    "AND next_attempt_at<=? AND lease_until<=? ORDER BY next_attempt_at, created_at LIMIT ?",
                    (OutboxState.PENDING.value, *kinds, now, now, int(limit)),
                ).fetchall()
            else:
                rows = _round_robin(c, kinds, now, int(limit), per_tenant, held)
            lease = now + lease_s
            lease = now + lease_s
            c.executemany("UPDATE outbox SET lease_until=? WHERE id=?", [(lease, r["id"]) for r in rows])
            return [_record(OutboxRecord, r, lease_until=lease) for r in rows]

        return await self._run(tx)

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
        def tx(c: Conn) -> bool:
            cur = c.execute(
                "UPDATE outbox SET state=?, attempts=attempts+?, next_attempt_at=?, lease_until=0, last_error=?, "
                "last_status=?, delivered_at=? WHERE id=? AND state=? AND lease_until=?",
                (
                    state.value,
                    1 if count_attempt else 0,
                    next_attempt_at,
                    last_error,
                    int(last_status),
                    now if state is OutboxState.DELIVERED else None,
                    claimed.id,
                    OutboxState.PENDING.value,
                    claimed.lease_until,
                ),
            )
            return cur.rowcount == 1

        return await self._run(tx)

    async def list_outbox(
        self, tenant: str, *, state: OutboxState | None = None, kind: str | None = None, limit: int = 100
    ) -> list[OutboxRecord]:
        def tx(c: Conn) -> list[OutboxRecord]:
            filters = {"state=?": state.value if state is not None else None, "kind=?": kind or None}
            q = _listing("outbox", tenant, filters, order="created_at DESC, id", limit=limit)
            return [_record(OutboxRecord, r) for r in c.execute(*q).fetchall()]

        return await self._run(tx)

    async def redeliver_outbox(
        self, tenant: str, message_id: str, now: float, *, kind: str | None = None, max_pending: int | None = None
    ) -> OutboxRecord:
        def tx(c: Conn) -> OutboxRecord:
            key = {"id": message_id} if kind is None else {"id": message_id, "kind": kind}
            row = _one(c, "outbox", tenant, key, f"delivery {message_id!r} not found")
            if row["state"] == OutboxState.PENDING.value:
                raise DeliveryPendingError(f"delivery {message_id!r} is still pending (next attempt scheduled)")
            if max_pending is not None:
                pending = _pending_count(c, tenant, row["kind"])
                if pending >= max_pending:
                    raise QuotaExceededError(
                        f"delivery {message_id!r} cannot be queued again: {pending} {row['kind']} messages of "
                        f"this tenant are pending, at most {max_pending}"
                    )
            c.execute(
                "UPDATE outbox SET state=?, attempts=0, next_attempt_at=?, lease_until=0, delivered_at=NULL WHERE id=?",
                (OutboxState.PENDING.value, now, message_id),
            )
            return _record(
                OutboxRecord,
                row,
                state=OutboxState.PENDING,
                attempts=0,
                next_attempt_at=now,
                lease_until=0.0,
                delivered_at=None,
            )

        return await self._run(tx)

    async def outbox_counts(self) -> dict[tuple[str, str], int]:
        def tx(c: Conn) -> dict[tuple[str, str], int]:
            rows = c.execute("SELECT kind, state, COUNT(*) FROM outbox GROUP BY kind, state").fetchall()
            return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}

        return await self._run(tx)

    # --- misc ---------------------------------------------------------------------------

    # --- the decision log -----------------------------------------------------------------

    # Whether decisions are written into their tenant's log (evidence.log): set by the server.
    log_decisions: bool = True
    # A text column as its UTF-8 bytes, in this backend's SQL (PostgreSQL: convert_to).
    TEXT_AS_BYTES = "CAST({} AS BLOB)"

    @property
    def _log_select(self) -> str:
        return _log_select(self.TEXT_AS_BYTES)

    async def log_size(self, tenant: str) -> int:
        def tx(c: Conn) -> int:
            row = c.execute("SELECT size FROM log_heads WHERE tenant=?", (tenant,)).fetchone()
            return int(row[0]) if row else 0

        return await self._run(tx)

    async def log_rows(self, tenant: str, *, start: int, limit: int, end: int | None = None) -> list[LogRow]:
        def tx(c: Conn) -> list[LogRow]:
            q = f"{self._log_select} WHERE tenant=? AND log_seq>=? AND log_seq<? ORDER BY log_seq LIMIT ?"
            top = MAX_SQL_INT if end is None else int(end)
            return [_log_row(r) for r in c.execute(q, (tenant, int(start), top, _page(limit))).fetchall()]

        return await self._run(tx)

    async def log_rows_outside(self, tenant: str, *, since: float | None, limit: int) -> list[LogRow]:
        def tx(c: Conn) -> list[LogRow]:
            # no number, or one no log has (negative; in SQLite, not a number at all): the log's reads by
            # number never see these, so they are read here (verify names them)
            q = (
                f"{self._log_select} WHERE tenant=? AND (log_seq IS NULL OR NOT (log_seq>=0 AND log_seq<?)) "
                "AND created_at>=? ORDER BY created_at LIMIT ?"
            )
            since_ = float("-inf") if since is None else float(since)
            return [_log_row(r) for r in c.execute(q, (tenant, MAX_SQL_INT, since_, _page(limit))).fetchall()]

        return await self._run(tx)

    async def log_leaves(self, tenant: str, start: int, end: int) -> list[tuple[int, str | None]]:
        def tx(c: Conn) -> list[tuple[int, str | None]]:
            q = "SELECT log_seq, leaf_hash FROM decisions WHERE tenant=? AND log_seq>=? AND log_seq<? ORDER BY log_seq"
            return [(int(r[0]), r[1]) for r in c.execute(q, (tenant, int(start), int(end))).fetchall()]

        return await self._run(tx)

    async def first_seq_since(self, tenant: str, since: float) -> int | None:
        def tx(c: Conn) -> int | None:
            q = "SELECT MIN(log_seq) FROM decisions WHERE tenant=? AND log_seq>=0 AND created_at>=?"
            row = c.execute(q, (tenant, float(since))).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self._run(tx)

    async def add_checkpoint(self, rec: CheckpointRecord) -> bool:
        def tx(c: Conn) -> bool:
            found = c.execute(
                "SELECT 1 FROM log_checkpoints WHERE tenant=? AND size=?", (rec.tenant, rec.size)
            ).fetchone()
            if found:
                return False
            _insert(c, rec, "ON CONFLICT (tenant, size) DO NOTHING")
            return True

        return await self._run(tx)

    async def list_checkpoints(
        self, tenant: str, *, min_size: int = 0, max_size: int | None = None, limit: int = 1000
    ) -> list[CheckpointRecord]:
        def tx(c: Conn) -> list[CheckpointRecord]:
            q = "SELECT * FROM log_checkpoints WHERE tenant=? AND size>=? AND size<=? ORDER BY size LIMIT ?"
            top = MAX_SQL_INT if max_size is None else int(max_size)
            rows = c.execute(q, (tenant, int(min_size), top, _page(limit))).fetchall()
            return [_record(CheckpointRecord, r) for r in rows]

        return await self._run(tx)

    async def latest_checkpoint(self, tenant: str, max_size: int | None = None) -> CheckpointRecord | None:
        def tx(c: Conn) -> CheckpointRecord | None:
            q = "SELECT * FROM log_checkpoints WHERE tenant=? AND size<=? ORDER BY size DESC LIMIT 1"
            row = c.execute(q, (tenant, MAX_SQL_INT if max_size is None else int(max_size))).fetchone()
            return None if row is None else _record(CheckpointRecord, row)

        return await self._run(tx)

    async def logs_behind(self, limit: int) -> list[tuple[str, int, int]]:
        def tx(c: Conn) -> list[tuple[str, int, int]]:
            q = (
                "SELECT h.tenant, h.size, COALESCE((SELECT MAX(k.size) FROM log_checkpoints k "
                "WHERE k.tenant=h.tenant), 0) AS signed FROM log_heads h ORDER BY h.tenant"
            )
            rows = [(str(r[0]), int(r[1]), int(r[2])) for r in c.execute(q).fetchall()]
            return [r for r in rows if r[1] > r[2]][: _page(limit)]

        return await self._run(tx)

    async def get_meta(self, key: str) -> str | None:
        def tx(c: Conn) -> str | None:
            row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._run(tx)

    async def set_meta(self, key: str, value: str) -> None:
        def tx(c: Conn) -> None:
            c.execute(
                "INSERT INTO meta VALUES (?,?) ON CONFLICT (key) DO UPDATE SET value=excluded.value", (key, value)
            )

        await self._run(tx)
