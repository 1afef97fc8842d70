"""PostgreSQL store: the shared SQL of :mod:`crossaudit.store.sql` on a psycopg 3 connection pool,
for several ``crossaudit serve`` replicas sharing one database.

``PostgresStore("postgresql://user:password@host:5432/crossaudit")`` (``crossaudit serve --store
URL``). Each operation is one transaction at SERIALIZABLE isolation, retried a few times when
PostgreSQL reports a serialization failure or a deadlock: two replicas deploying the same policy
at once, or leasing the same outbox rows, see one of them win and the other one retry, so the
invariants SQLite gets from its single writer hold across replicas too. Transactions run on a
bounded thread pool beside the event loop, one pool connection each. The schema is applied at
open from :mod:`crossaudit.store.migrations` under an advisory lock.

Unlike SQLite, opening does not void outbox leases: other replicas may hold them. A crashed
replica's leases expire after ``DeliveryLimits.lease_s``.

Outages: :meth:`PostgresStore.check` (the server calls it every ``store_check_interval_s``) asks
the database on a connection of its own, outside the pool. psycopg_pool replaces a dead
connection by retrying with exponential backoff (1 s, doubling, for up to its
``reconnect_timeout``), so after an outage of a minute the pool could stay empty for about as
long again once the database is back. The first check that succeeds after a failed one replaces
the pool with a fresh one instead, so the store works again within about one check interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import Field
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.limits import SETTINGS_SECTION, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from crossaudit.store import migrations
from crossaudit.store.base import NUL_REPLACEMENT, StoreUnavailableError
from crossaudit.store.sql import CLOSED, Conn, SqlStore

T = TypeVar("T")
MIGRATION_LOCK = 0x43524F5353  # pg_advisory_xact_lock key of schema migrations ("CROSS")
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")
_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)  # libpq takes it in the query too
# A replaced pool's worker threads get this long to stop (one may be inside a connection attempt).
OLD_POOL_CLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class PostgresLimits:
    """The PostgreSQL store's pool, retries and statement timeout (docs/storage.md)."""

    __pydantic_config__ = SETTINGS_SECTION

    pool_size: Annotated[PositiveInt, Field(description="connections (and transaction threads) per process")] = 10
    connect_timeout_s: Annotated[
        PositiveFloat, Field(description="opening a connection; also how long a call waits for a free one")
    ] = 10.0
    max_retries: Annotated[
        NonNegativeInt, Field(description="re-runs of a transaction after a serialization failure or deadlock")
    ] = 5
    retry_backoff_s: Annotated[NonNegativeFloat, Field(description="first wait before a re-run, doubling")] = 0.005
    statement_timeout_s: Annotated[
        PositiveFloat,
        Field(
            description=(
                "one statement, lock waits included (PostgreSQL `statement_timeout` on every pool connection; "
                "migrations at open are exempt): a query that runs long or waits on a lock held elsewhere gives its "
                "connection back and fails UNAVAILABLE (`StoreUnavailableError`) instead of holding one of "
                "`pool_size` connections every tenant shares"
            )
        ),
    ] = 30.0


def mask_url(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD.sub(r"\1***@", url))


class _Row(tuple):  # type: ignore[type-arg]
    """A result row readable by position and by column name, as sqlite3.Row is."""

    index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.index[key])
        return tuple.__getitem__(self, key)


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], _Row]:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}
    cls = type("Row", (_Row,), {"index": names})
    return lambda values: cls(values)


def _sql(query: str) -> str:
    """The shared SQL's ``?`` placeholders in psycopg's form."""
    return query.replace("%", "%%").replace("?", "%s")


# PostgreSQL text cannot hold NUL (U+0000): psycopg refuses such a parameter with an untyped
# DataError, so a tenant's id, filter or raw prompt holding one would fail its call (or lose an
# answered decision's audit record). Written and looked up as NUL_REPLACEMENT (store/base.py)
# instead, on every statement, so a value stored this way is found again by the same string.


def _params(params: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(p.replace("\0", NUL_REPLACEMENT) if isinstance(p, str) and "\0" in p else p for p in params)


class _Conn:
    """A psycopg connection seen through the shared SQL's DB-API-like interface."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, query: str, params: Sequence[Any] = ()) -> Any:
        cur = self._conn.cursor(row_factory=_row_factory)
        cur.execute(_sql(query), _params(params))
        return cur

    def executemany(self, query: str, params: Sequence[Sequence[Any]]) -> Any:
        cur = self._conn.cursor()
        if params:
            cur.executemany(_sql(query), [_params(p) for p in params])
        return cur


class PostgresStore(SqlStore):
    """Open with ``await PostgresStore.open(url)`` or synchronously with ``PostgresStore(url)``."""

    TEXT_AS_BYTES = "convert_to({}, 'UTF8')"

    def __init__(self, url: str, *, limits: PostgresLimits | None = None) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        self.limits = limits or PostgresLimits()
        self.url = url
        self.display_url = mask_url(url)
        self._psycopg = psycopg
        self._pool_class = ConnectionPool
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=self.limits.pool_size, thread_name_prefix="crossaudit-pg")
        # Checks run on a thread of their own, one at a time: a check stuck on an unreachable host
        # never holds a transaction thread, and checks never pile up behind it.
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crossaudit-pg-check")
        self._check_running: Future[None] | None = None
        self._probe: Any = None  # the checks' own connection (checker thread only)
        self._pool_suspect = False  # a check failed: the pool may hold dead connections, or be backing off
        self._pool_lock = threading.Lock()  # replacing the pool vs. closing the store
        try:
            self._pool = self._open_pool()
            self._migrate()
        except Exception as exc:
            self._executor.shutdown(wait=False)
            self._checker.shutdown(wait=False)
            pool = getattr(self, "_pool", None)
            if pool is not None:
                pool.close()
            raise StoreUnavailableError(f"cannot open the database {self.display_url}: {self._describe(exc)}") from None

    def _open_pool(self) -> Any:
        """A connection pool holding one open connection (or an exception)."""
        isolation = self._psycopg.IsolationLevel.SERIALIZABLE

        def configure(conn: Any) -> None:
            conn.isolation_level = isolation
            conn.autocommit = False

        pool = self._pool_class(
            self.url,
            min_size=1,
            max_size=self.limits.pool_size,
            timeout=self.limits.connect_timeout_s,
            kwargs={
                "connect_timeout": max(1, int(self.limits.connect_timeout_s)),
                "options": self._options(),
            },
            configure=configure,
            open=False,
            name="crossaudit",
        )
        try:
            pool.open(wait=True, timeout=self.limits.connect_timeout_s)
        except BaseException:
            pool.close()
            raise
        return pool

    def _options(self) -> str:
        """The URL's own ``options`` (kept: a keyword argument would replace them), then the
        statement timeout."""
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = str(conninfo_to_dict(self.url).get("options") or "")
        except self._psycopg.ProgrammingError:  # a malformed URL fails when the pool connects
            given = ""
        timeout = f"-c statement_timeout={max(1, round(self.limits.statement_timeout_s * 1000))}"
        return f"{given} {timeout}".strip()

    def _describe(self, exc: BaseException) -> str:
        return mask_url(f"{type(exc).__name__}: {exc}".strip().splitlines()[0])

    def _migrate(self) -> None:
        levels = self._psycopg.IsolationLevel
        with self._pool.connection() as conn:
            # READ COMMITTED: after waiting for the lock, the next statements see what the replica
            # that held it committed (a SERIALIZABLE snapshot would predate the wait).
            conn.isolation_level = levels.READ_COMMITTED
            try:
                with conn.transaction():
                    c = _Conn(conn)
                    # Waiting for another replica's migration, and a migration itself, may take
                    # longer than one statement may.
                    c.execute("SET LOCAL statement_timeout = 0")
                    c.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
                    c.execute(
                        "CREATE TABLE IF NOT EXISTS schema_migrations "
                        "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
                    )
                    done = int(c.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0])
                    for version, step in enumerate(migrations.POSTGRES[done:], start=done + 1):
                        conn.execute(step)  # DDL without parameters: no placeholder translation
                        c.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
            finally:
                conn.isolation_level = levels.SERIALIZABLE

    def schema_version(self) -> int:
        with self._pool.connection() as conn:
            return int(_Conn(conn).execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0])

    FOR_UPDATE = " FOR UPDATE"

    def _tx(self, fn: Callable[[Conn], T], contended: bool = False) -> T:
        from psycopg_pool import PoolClosed

        pool = self._pool
        try:
            return self._tx_on(pool, fn, contended)
        except PoolClosed:
            if self._closed or self._pool is pool:
                raise StoreUnavailableError(CLOSED) from None
        # A check replaced the pool (the database is back) while this call waited on the old one.
        try:
            return self._tx_on(self._pool, fn, contended)
        except PoolClosed:
            raise StoreUnavailableError(CLOSED) from None

    def _tx_on(self, pool: Any, fn: Callable[[Conn], T], contended: bool) -> T:
        """One transaction, re-run after a serialization failure or a deadlock (the database's
        "try again"): at most ``max_retries`` more times, waiting ``retry_backoff_s`` doubling.
        A pure retry loop, so tenacity's."""
        errors = self._psycopg.errors
        busy = (errors.SerializationFailure, errors.DeadlockDetected)
        retrying = Retrying(
            retry=retry_if_exception_type(busy),
            stop=stop_after_attempt(self.limits.max_retries + 1),
            wait=wait_exponential(multiplier=self.limits.retry_backoff_s),
            reraise=True,
        )
        try:
            return retrying(self._tx_once, pool, fn, contended)
        except busy:
            raise StoreUnavailableError("the database stayed too busy to commit; retry") from None

    def _tx_once(self, pool: Any, fn: Callable[[Conn], T], contended: bool) -> T:
        """One run of ``fn`` in a transaction; failures other than "try again" typed here."""
        from psycopg_pool import PoolClosed, PoolTimeout

        errors = self._psycopg.errors
        levels = self._psycopg.IsolationLevel
        try:
            with pool.connection() as conn:
                # A contended read-modify-write locks its row FOR UPDATE: at READ COMMITTED the
                # callers queue on the lock and each sees the last one's write.
                conn.isolation_level = levels.READ_COMMITTED if contended else levels.SERIALIZABLE
                with conn.transaction():
                    return fn(_Conn(conn))
        except (errors.SerializationFailure, errors.DeadlockDetected, PoolClosed):
            raise  # "try again" (for _tx_on) or a replaced pool (for _tx): OperationalErrors, not outages
        except self._psycopg.DataError as exc:  # a value PostgreSQL cannot take (a number out of range)
            raise InvalidInputError(f"the database refused a value: {self._describe(exc)}") from None
        except (self._psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailableError(f"database unavailable: {self._describe(exc)}") from None

    async def check(self, timeout_s: float) -> None:
        """``SELECT 1`` on the checks' own connection (outside the pool, so a busy pool is not an
        outage), reconnecting at once when it broke; StoreUnavailableError when the database does
        not answer within ``timeout_s``. The first success after a failure replaces the pool."""
        if self._closed:
            raise StoreUnavailableError(CLOSED)
        running = self._check_running
        if running is not None and not running.done():
            raise StoreUnavailableError(f"the previous check of {self.display_url} is still waiting for an answer")
        try:
            self._check_running = running = self._checker.submit(self._check, timeout_s)
        except RuntimeError:  # shut down under us
            raise StoreUnavailableError(CLOSED) from None
        try:
            # Not shielded: on a timeout the asyncio side is cancelled and the thread's outcome is
            # dropped with its concurrent future (no asyncio future is left holding an exception).
            await asyncio.wait_for(asyncio.wrap_future(running), timeout_s)
        except TimeoutError:
            raise StoreUnavailableError(f"the database did not answer within {timeout_s:g} s") from None

    def _check(self, timeout_s: float) -> None:
        reused = self._probe is not None
        try:
            self._probe_once(timeout_s)
        except self._psycopg.Error as exc:
            self._drop_probe()
            self._pool_suspect = True
            if not reused:
                raise StoreUnavailableError(f"database unreachable: {self._describe(exc)}") from None
            try:  # the old connection may only have been cut (a restart): one fresh attempt
                self._probe_once(timeout_s)
            except self._psycopg.Error as again:
                self._drop_probe()
                raise StoreUnavailableError(f"database unreachable: {self._describe(again)}") from None
        if self._pool_suspect:
            try:
                self._replace_pool()
            except Exception as exc:
                raise StoreUnavailableError(f"database unreachable: {self._describe(exc)}") from None

    def _probe_once(self, timeout_s: float) -> None:
        if self._probe is None:
            seconds = min(timeout_s, self.limits.connect_timeout_s)
            self._probe = self._psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(1, math.ceil(seconds)),
                # unacknowledged data fails the socket after this long (a host that went away)
                tcp_user_timeout=max(1, int(seconds * 1000)),
            )
        self._probe.execute("SELECT 1")

    def _drop_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(Exception):  # already broken: nothing more to release
                probe.close()

    def _replace_pool(self) -> None:
        """A fresh pool in place of one whose connections died in an outage: the old pool's
        replacement attempts back off exponentially and would leave the store unusable for a
        while after the database is back. Calls in flight on the old pool finish on it; it is
        closed on a thread of its own, so the check (and health) does not wait for that."""
        new = self._open_pool()
        with self._pool_lock:
            if self._closed:
                old = new
            else:
                old, self._pool = self._pool, new
                self._pool_suspect = False
        threading.Thread(
            target=old.close, kwargs={"timeout": OLD_POOL_CLOSE_TIMEOUT_S}, name="crossaudit-pg-old-pool", daemon=True
        ).start()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()

        def close_pool() -> None:
            with self._pool_lock:
                self._pool.close()

        await loop.run_in_executor(self._executor, close_pool)
        self._executor.shutdown(wait=True)
        self._checker.submit(self._drop_probe)  # after a check still running, on its thread
        self._checker.shutdown(wait=False)
