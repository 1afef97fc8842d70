"""Embedded SQLite store (WAL). One connection, one dedicated thread: every call is a short
transaction run off the event loop, so the service stays async end to end.

Durability: WAL with ``synchronous=NORMAL`` (default) keeps every committed transaction
across a process crash or ``kill -9`` (the OS holds the WAL pages); ``synchronous=FULL``
also survives power loss at the cost of an fsync per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import os
import sqlite3
import time
import typing
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from crossaudit.kernel.errors import DeliveryPendingError, InvalidInputError, NotFoundError
from crossaudit.orchestrator.reviews import AUTO_APPROVAL, AUTO_APPROVE_AT, Resolution, timing
from crossaudit.store.base import (
    AuditRecord,
    DeploymentRecord,
    EvaluatorRecord,
    FeedbackRecord,
    OutboxRecord,
    OutboxState,
    PolicySummaryRecord,
    PolicyVersionRecord,
    ReviewAlreadyResolvedError,
    ReviewRecord,
    ReviewState,
    Store,
    StoreUnavailableError,
    sha256_text,
)

T = TypeVar("T")

SCHEMA_VERSION = 1
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policy_versions (
    tenant TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    declared_version TEXT NOT NULL, digest TEXT NOT NULL, description TEXT NOT NULL,
    content TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, name, version)
);
CREATE INDEX IF NOT EXISTS policy_versions_digest ON policy_versions (tenant, name, digest);
CREATE TABLE IF NOT EXISTS deployments (
    tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    version INTEGER NOT NULL, deployed_at REAL NOT NULL,
    PRIMARY KEY (tenant, name, environment)
);
CREATE TABLE IF NOT EXISTS deployment_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL, name TEXT NOT NULL, environment TEXT NOT NULL,
    version INTEGER NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS deployment_history_key ON deployment_history (tenant, name, environment, seq);
CREATE TABLE IF NOT EXISTS evaluators (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL,
    language TEXT NOT NULL, dependencies TEXT NOT NULL, digest TEXT NOT NULL,
    code TEXT NOT NULL, description TEXT NOT NULL, created_at REAL NOT NULL,
    UNIQUE (tenant, name, version)
);
CREATE INDEX IF NOT EXISTS evaluators_digest ON evaluators (tenant, name, digest);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, policy TEXT NOT NULL,
    policy_revision INTEGER NOT NULL, policy_version TEXT NOT NULL, policy_digest TEXT NOT NULL,
    environment TEXT NOT NULL, passed INTEGER NOT NULL, action TEXT NOT NULL,
    rules TEXT NOT NULL, errored_rules TEXT NOT NULL, latency_ms REAL NOT NULL,
    prompt_sha256 TEXT NOT NULL, response_sha256 TEXT NOT NULL, context_sha256 TEXT NOT NULL,
    modified_response_sha256 TEXT, prompt TEXT, response TEXT,
    request_id TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_tenant ON decisions (tenant, created_at);
CREATE TABLE IF NOT EXISTS reviews (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, decision_id TEXT NOT NULL, policy TEXT NOT NULL,
    policy_revision INTEGER NOT NULL, environment TEXT NOT NULL, rule TEXT NOT NULL,
    kind TEXT NOT NULL, state TEXT NOT NULL, params TEXT NOT NULL, created_at REAL NOT NULL,
    resolved_at REAL, reviewer TEXT NOT NULL, note TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reviews_tenant ON reviews (tenant, state, created_at);
CREATE TABLE IF NOT EXISTS feedback (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, decision_id TEXT NOT NULL, rule TEXT NOT NULL,
    label TEXT NOT NULL, comment TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_decision ON feedback (tenant, decision_id);
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kind TEXT NOT NULL, decision_id TEXT NOT NULL,
    rule TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL,
    next_attempt_at REAL NOT NULL, lease_until REAL NOT NULL, last_error TEXT NOT NULL,
    last_status INTEGER NOT NULL, created_at REAL NOT NULL, delivered_at REAL
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (state, kind, next_attempt_at);
CREATE INDEX IF NOT EXISTS outbox_tenant ON outbox (tenant, created_at);
"""


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
    return _same, _same


def _columns(cls: type) -> tuple[tuple[str, Codec], ...]:
    """(column, codec) per field of a record dataclass, from its type hints: adding a field (and its
    column to the schema) is all a new column needs."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _codec(hints[f.name])) for f in dataclasses.fields(cls))


COLUMNS = {cls: _columns(cls) for cls in TABLES}


def _record(cls: type[T], row: sqlite3.Row, **values: Any) -> T:
    """The record in ``row``; ``values`` replace fields the caller must not return (e.g. code)."""
    return cls(**{name: values[name] if name in values else dec(row[name]) for name, (dec, _) in COLUMNS[cls]})


def _insert(c: sqlite3.Connection, rec: Any, on_conflict: str = "") -> None:
    cols = COLUMNS[type(rec)]
    c.execute(
        f"INSERT INTO {TABLES[type(rec)]} ({', '.join(name for name, _ in cols)}) "
        f"VALUES ({', '.join('?' * len(cols))}) {on_conflict}",
        [enc(getattr(rec, name)) for name, (_, enc) in cols],
    )


def _resolve(c: sqlite3.Connection, tenant: str, review_id: str, how: Resolution, now: float) -> None:
    c.execute(
        "UPDATE reviews SET state=?, resolved_at=?, reviewer=?, note=? WHERE tenant=? AND id=?",
        (how.state.value, now, how.reviewer, how.note, tenant, review_id),
    )


class SQLiteStore(Store):
    """``SQLiteStore(path)``; ``path=":memory:"`` for tests. Call :meth:`aclose` when done."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL", busy_timeout_ms: int = 5_000) -> None:
        sync = synchronous.upper()
        if sync not in SYNCHRONOUS_MODES:
            raise InvalidInputError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, not {synchronous!r}")
        self.path = str(path)
        if self.path != ":memory:":
            _private_files(Path(self.path))
        # One thread owns the connection: sqlite3 objects never cross threads concurrently.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crossaudit-store")
        try:
            self._conn = self._executor.submit(self._open, sync, busy_timeout_ms).result()
        except sqlite3.Error as e:  # corrupt file, not a database, locked by another program, I/O error
            self._executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open the database {self.path}: {e}") from None
        self._closed = False

    def _open(self, sync: str, busy_timeout_ms: int) -> sqlite3.Connection:
        # Bounded by busy_timeout_ms: a database another program holds locked fails start-up with
        # one clear error instead of hanging.
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        # One process owns an SQLite store (the server locks its data dir): leases a previous
        # process held died with it, so its in-flight messages are due again now, not after lease_s.
        conn.execute("UPDATE outbox SET lease_until=0 WHERE lease_until>0")
        return conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreUnavailableError("the store is closed (the server is shutting down)")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._tx, fn)
        except sqlite3.OperationalError as e:  # locked, disk full, I/O error: typed, retryable
            raise StoreUnavailableError(f"database unavailable: {e}") from None
        except RuntimeError as e:  # executor shut down under us
            raise StoreUnavailableError(f"the store is closed: {e}") from None

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

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
        digest = sha256_text(content)
        now = time.time()

        def tx(c: sqlite3.Connection) -> tuple[PolicyVersionRecord, DeploymentRecord, bool]:
            row = c.execute(
                "SELECT * FROM policy_versions WHERE tenant=? AND name=? AND digest=? ORDER BY version DESC LIMIT 1",
                (tenant, name, digest),
            ).fetchone()
            created = row is None
            if created:
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
            else:
                version = _record(PolicyVersionRecord, row)
            deployment = self._set_deployment(c, tenant, name, environment, version.version, "deploy", now)
            return version, deployment, created

        return await self._run(tx)

    @staticmethod
    def _set_deployment(
        c: sqlite3.Connection, tenant: str, name: str, environment: str, version: int, kind: str, now: float
    ) -> DeploymentRecord:
        deployment = DeploymentRecord(
            tenant=tenant, name=name, environment=environment, version=version, deployed_at=now
        )
        _insert(
            c,
            deployment,
            "ON CONFLICT (tenant, name, environment) "
            "DO UPDATE SET version=excluded.version, deployed_at=excluded.deployed_at",
        )
        c.execute(
            "INSERT INTO deployment_history (tenant, name, environment, version, kind, at) VALUES (?,?,?,?,?,?)",
            (tenant, name, environment, version, kind, now),
        )
        return deployment

    async def get_policy_version(self, tenant: str, name: str, version: int) -> PolicyVersionRecord:
        def tx(c: sqlite3.Connection) -> PolicyVersionRecord:
            row = c.execute(
                "SELECT * FROM policy_versions WHERE tenant=? AND name=? AND version=?", (tenant, name, version)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"policy {name!r} has no version {version}")
            return _record(PolicyVersionRecord, row)

        return await self._run(tx)

    async def get_deployed_policy(self, tenant: str, name: str, environment: str) -> PolicyVersionRecord:
        def tx(c: sqlite3.Connection) -> PolicyVersionRecord:
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
        def tx(c: sqlite3.Connection) -> list[DeploymentRecord]:
            rows = c.execute(
                "SELECT * FROM deployments WHERE tenant=? AND name=? ORDER BY environment", (tenant, name)
            ).fetchall()
            return [_record(DeploymentRecord, r) for r in rows]

        return await self._run(tx)

    async def list_policies(self, tenant: str, environment: str | None = None) -> list[PolicySummaryRecord]:
        def tx(c: sqlite3.Connection) -> list[PolicySummaryRecord]:
            latest = c.execute(
                "SELECT name, MAX(version) AS v FROM policy_versions WHERE tenant=? GROUP BY name ORDER BY name",
                (tenant,),
            ).fetchall()
            deps: dict[str, list[DeploymentRecord]] = {}
            for r in c.execute("SELECT * FROM deployments WHERE tenant=? ORDER BY environment", (tenant,)):
                deps.setdefault(r["name"], []).append(_record(DeploymentRecord, r))
            out = []
            for r in latest:
                mine = deps.get(r["name"], [])
                if environment and not any(d.environment == environment for d in mine):
                    continue
                out.append(PolicySummaryRecord(name=r["name"], latest_version=r["v"], deployments=tuple(mine)))
            return out

        return await self._run(tx)

    async def rollback_policy(
        self, tenant: str, name: str, environment: str, to_version: int | None = None
    ) -> tuple[DeploymentRecord, int]:
        now = time.time()

        def tx(c: sqlite3.Connection) -> tuple[DeploymentRecord, int]:
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
                    "AND version != ? ORDER BY seq DESC LIMIT 1",
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
    ) -> tuple[EvaluatorRecord, bool]:
        now = time.time()

        def tx(c: sqlite3.Connection) -> tuple[EvaluatorRecord, bool]:
            row = c.execute(
                "SELECT * FROM evaluators WHERE tenant=? AND name=? AND digest=? ORDER BY version DESC LIMIT 1",
                (tenant, name, digest),
            ).fetchone()
            if row is not None:
                return _record(EvaluatorRecord, row), False
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
        def tx(c: sqlite3.Connection) -> EvaluatorRecord:
            row = c.execute("SELECT * FROM evaluators WHERE tenant=? AND id=?", (tenant, evaluator_id)).fetchone()
            if row is None:
                raise NotFoundError(f"evaluator {evaluator_id!r} not found")
            return _record(EvaluatorRecord, row)

        return await self._run(tx)

    async def get_evaluator_by_name(self, tenant: str, name: str, version: int | None = None) -> EvaluatorRecord:
        def tx(c: sqlite3.Connection) -> EvaluatorRecord:
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
        def tx(c: sqlite3.Connection) -> list[EvaluatorRecord]:
            if name:
                rows = c.execute(
                    "SELECT * FROM evaluators WHERE tenant=? AND name=? ORDER BY name, version", (tenant, name)
                ).fetchall()
            else:
                rows = c.execute("SELECT * FROM evaluators WHERE tenant=? ORDER BY name, version", (tenant,)).fetchall()
            return [_record(EvaluatorRecord, r, code="") for r in rows]

        return await self._run(tx)

    # --- audit, reviews, feedback -------------------------------------------------------

    async def record_decision(
        self, audit: AuditRecord, reviews: list[ReviewRecord], outbox: Sequence[OutboxRecord] = ()
    ) -> None:
        def tx(c: sqlite3.Connection) -> None:
            _insert(c, audit)
            for rec in (*reviews, *outbox):
                if rec.tenant != audit.tenant or rec.decision_id != audit.decision_id:
                    raise InvalidInputError("a review or message must belong to the decision it is recorded with")
                _insert(c, rec)

        await self._run(tx)

    async def get_decision(self, tenant: str, decision_id: str) -> AuditRecord:
        def tx(c: sqlite3.Connection) -> AuditRecord:
            row = c.execute(
                "SELECT * FROM decisions WHERE tenant=? AND decision_id=?", (tenant, decision_id)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"decision {decision_id!r} not found")
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
    ) -> list[AuditRecord]:
        def tx(c: sqlite3.Connection) -> list[AuditRecord]:
            q = "SELECT * FROM decisions WHERE tenant=?"
            args: list[Any] = [tenant]
            if policy:
                q += " AND policy=?"
                args.append(policy)
            if since is not None:
                q += " AND created_at>=?"
                args.append(float(since))
            if until is not None:
                q += " AND created_at<=?"
                args.append(float(until))
            q += " ORDER BY created_at DESC LIMIT ?"
            args.append(max(0, int(limit)))
            return [_record(AuditRecord, r) for r in c.execute(q, args).fetchall()]

        return await self._run(tx)

    async def count_decisions(self, tenant: str | None = None) -> int:
        def tx(c: sqlite3.Connection) -> int:
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
        def tx(c: sqlite3.Connection) -> list[ReviewRecord]:
            q = "SELECT * FROM reviews WHERE tenant=?"
            args: list[Any] = [tenant]
            if state is not None:
                q += " AND state=?"
                args.append(state.value)
            if policy:
                q += " AND policy=?"
                args.append(policy)
            q += " ORDER BY created_at, id LIMIT ?"
            args.append(max(0, int(limit)))
            return [_record(ReviewRecord, r) for r in c.execute(q, args).fetchall()]

        return await self._run(tx)

    async def auto_approve_due(self, tenant: str, now: float) -> int:
        def tx(c: sqlite3.Connection) -> int:
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
        def tx(c: sqlite3.Connection) -> ReviewRecord:
            row = c.execute("SELECT * FROM reviews WHERE tenant=? AND id=?", (tenant, review_id)).fetchone()
            if row is None:
                raise NotFoundError(f"review {review_id!r} not found")
            return _record(ReviewRecord, row)

        return await self._run(tx)

    async def resolve_review(
        self, tenant: str, review_id: str, state: ReviewState, *, reviewer: str = "", note: str = ""
    ) -> ReviewRecord:
        if state is ReviewState.OPEN:
            raise InvalidInputError("a review is resolved as approved, rejected or dismissed, not open")
        now = time.time()

        def tx(c: sqlite3.Connection) -> ReviewRecord:
            row = c.execute("SELECT * FROM reviews WHERE tenant=? AND id=?", (tenant, review_id)).fetchone()
            if row is None:
                raise NotFoundError(f"review {review_id!r} not found")
            if row["state"] != ReviewState.OPEN.value:
                raise ReviewAlreadyResolvedError(f"review {review_id!r} is already {row['state']}")
            _resolve(c, tenant, review_id, Resolution(state, reviewer, note), now)
            return _record(ReviewRecord, c.execute("SELECT * FROM reviews WHERE id=?", (review_id,)).fetchone())

        return await self._run(tx)

    async def add_feedback(
        self, tenant: str, decision_id: str, *, rule: str, label: str, comment: str = ""
    ) -> FeedbackRecord:
        now = time.time()

        def tx(c: sqlite3.Connection) -> FeedbackRecord:
            row = c.execute(
                "SELECT rules FROM decisions WHERE tenant=? AND decision_id=?", (tenant, decision_id)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"decision {decision_id!r} not found")
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
        def tx(c: sqlite3.Connection) -> dict[tuple[str, str], tuple[int, int, int]]:
            rows = c.execute(
                "SELECT d.policy, f.rule, COUNT(*), SUM(f.label = 'false_positive'), SUM(f.label = 'false_negative') "
                "FROM feedback f JOIN decisions d ON d.tenant = f.tenant AND d.decision_id = f.decision_id "
                "WHERE f.tenant = ? AND f.rule != '' GROUP BY d.policy, f.rule",
                (tenant,),
            ).fetchall()
            return {(r[0], r[1]): (int(r[2]), int(r[3] or 0), int(r[4] or 0)) for r in rows}

        return await self._run(tx)

    async def list_feedback(self, tenant: str, decision_id: str | None = None) -> list[FeedbackRecord]:
        def tx(c: sqlite3.Connection) -> list[FeedbackRecord]:
            q = "SELECT * FROM feedback WHERE tenant=?"
            args: list[Any] = [tenant]
            if decision_id:
                q += " AND decision_id=?"
                args.append(decision_id)
            rows = c.execute(q + " ORDER BY created_at, id", args).fetchall()
            return [_record(FeedbackRecord, r) for r in rows]

        return await self._run(tx)

    # --- outbox -------------------------------------------------------------------------

    async def claim_outbox(self, kinds: Sequence[str], now: float, *, limit: int, lease_s: float) -> list[OutboxRecord]:
        kinds = list(kinds)
        if not kinds or limit <= 0:
            return []

        def tx(c: sqlite3.Connection) -> list[OutboxRecord]:
            # BEGIN IMMEDIATE holds the write lock: two workers on one file never lease the same row.
            rows = c.execute(
                f"SELECT * FROM outbox WHERE state=? AND kind IN ({', '.join('?' * len(kinds))}) "
                "AND next_attempt_at<=? AND lease_until<=? ORDER BY next_attempt_at, created_at LIMIT ?",
                (OutboxState.PENDING.value, *kinds, now, now, int(limit)),
            ).fetchall()
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
        def tx(c: sqlite3.Connection) -> bool:
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
        def tx(c: sqlite3.Connection) -> list[OutboxRecord]:
            q, args = "SELECT * FROM outbox WHERE tenant=?", [tenant]
            if state is not None:
                q += " AND state=?"
                args.append(state.value)
            if kind:
                q += " AND kind=?"
                args.append(kind)
            q += " ORDER BY created_at DESC, id LIMIT ?"
            args.append(max(0, int(limit)))
            return [_record(OutboxRecord, r) for r in c.execute(q, args).fetchall()]

        return await self._run(tx)

    async def redeliver_outbox(
        self, tenant: str, message_id: str, now: float, *, kind: str | None = None
    ) -> OutboxRecord:
        def tx(c: sqlite3.Connection) -> OutboxRecord:
            row = c.execute("SELECT * FROM outbox WHERE tenant=? AND id=?", (tenant, message_id)).fetchone()
            if row is None or (kind is not None and row["kind"] != kind):
                raise NotFoundError(f"delivery {message_id!r} not found")
            if row["state"] == OutboxState.PENDING.value:
                raise DeliveryPendingError(f"delivery {message_id!r} is still pending (next attempt scheduled)")
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
        def tx(c: sqlite3.Connection) -> dict[tuple[str, str], int]:
            rows = c.execute("SELECT kind, state, COUNT(*) FROM outbox GROUP BY kind, state").fetchall()
            return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}

        return await self._run(tx)

    # --- misc ---------------------------------------------------------------------------

    async def get_meta(self, key: str) -> str | None:
        def tx(c: sqlite3.Connection) -> str | None:
            row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._run(tx)

    async def set_meta(self, key: str, value: str) -> None:
        def tx(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO meta VALUES (?,?) ON CONFLICT (key) DO UPDATE SET value=excluded.value", (key, value)
            )

        await self._run(tx)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)


PRIVATE_FILE_MODE = 0o600  # the database holds every tenant's code, policies and audit log
PRIVATE_DIR_MODE = 0o700


def _private_files(db: Path) -> None:
    """Create the database file owner-only before SQLite opens it, whatever the umask.

    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode, so creating the
    main file 0600 keeps all three private; files left by an older, laxer version are fixed.
    """
    db.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    fd = os.open(db, os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        side = db.with_name(db.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            side.chmod(PRIVATE_FILE_MODE)
