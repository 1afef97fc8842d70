"""Embedded SQLite store (WAL). One connection, one dedicated thread: every call is a short
transaction run off the event loop, so the service stays async end to end. The SQL itself is
shared with PostgreSQL (:mod:`crossaudit.store.sql`); the schema is :mod:`crossaudit.store.migrations`.

Durability: WAL with ``synchronous=NORMAL`` (default) keeps every committed transaction
across a process crash or ``kill -9`` (the OS holds the WAL pages); ``synchronous=FULL``
also survives power loss at the cost of an fsync per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.store import migrations
from crossaudit.store.base import StoreUnavailableError
from crossaudit.store.sql import Conn, SqlStore

T = TypeVar("T")
log = logging.getLogger("crossaudit.store.sqlite")

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")



class SQLiteStore(SqlStore):
    """``SQLiteStore(path)``; ``path=":memory:"`` for tests. Call :meth:`aclose` when done."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 5_000,
        release_leases: bool = True,
        shared: bool = False,
    ) -> None:
        """``shared``: other processes write this file too (the workers of ``serve --workers N``):
        transactions then queue on a file lock beside it (``-writer``), which wakes the next one
        as soon as one commits, instead of on SQLite's busy handler, which sleeps 1 to 100 ms
        between tries (at the rates a worker commits, that sleeping halved the throughput).
        ``release_leases``: see :meth:`_open`."""
        sync = synchronous.upper()
        if sync not in SYNCHRONOUS_MODES:
            raise InvalidInputError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, not {synchronous!r}")
        self.path = str(path)
        self._writer: int | None = None
        if self.path != ":memory:":
            _private_files(Path(self.path))
            if shared:
                lock = Path(self.path + WRITER_LOCK_SUFFIX)
                self._writer = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        # One thread owns the connection: sqlite3 objects never cross threads concurrently.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crossaudit-store")
        try:
            self._conn = self._executor.submit(self._open, sync, busy_timeout_ms, release_leases).result()
        except sqlite3.Error as e:  # corrupt file, not a database, locked by another program, I/O error
            self._executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open the database {self.path}: {e}") from None
        self._closed = False

    def _open(self, sync: str, busy_timeout_ms: int, release_leases: bool) -> sqlite3.Connection:
        # Bounded by busy_timeout_ms: a database another program holds locked fails start-up with
        # one clear error instead of hanging.
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        # PostgreSQL's octet_length (SQLite has it only from 3.43): the evaluator code quota counts bytes.
        conn.create_function("octet_length", 1, _octet_length, deterministic=True)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys=ON")
        # Deleted and overwritten content is zeroed in the file, not left in free space: an erased
        # prompt or a purged sealed row must not be readable from a copy of the data dir.
        conn.execute("PRAGMA secure_delete=ON")
        done = int(conn.execute("PRAGMA user_version").fetchone()[0])
        for version, step in enumerate(migrations.SQLITE[done:], start=done + 1):
            conn.executescript(f"BEGIN IMMEDIATE; {step}; PRAGMA user_version={version}; COMMIT;")
        # The process that owns an SQLite store (the server locks its data dir) releases the leases
        # a previous process held, which died with it: its in-flight messages are due now, not after
        # lease_s. Workers of `serve --workers N` open it with release_leases=False: their siblings'
        # leases are alive (a dead worker's expire after lease_s, as a PostgreSQL replica's do).
        if release_leases:
            conn.execute("UPDATE outbox SET lease_until=0 WHERE lease_until>0")
        return conn

    def _tx(self, fn: Callable[[Conn], T], contended: bool = False) -> T:
        """A write transaction from its start (``BEGIN IMMEDIATE``), so it never has to upgrade a
        read lock; ``contended`` changes nothing, SQLite's writers already queue on its lock."""
        conn = self._conn
        if self._writer is not None:
            fcntl.flock(self._writer, fcntl.LOCK_EX)  # released below, whatever happens
            try:
                return self._tx_unshared(conn, fn)
            finally:
                fcntl.flock(self._writer, fcntl.LOCK_UN)
        return self._tx_unshared(conn, fn)

    def _tx_unshared(self, conn: sqlite3.Connection, fn: Callable[[Conn], T]) -> T:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        except sqlite3.OperationalError as e:  # locked, disk full, I/O error: typed, retryable
            raise StoreUnavailableError(f"database unavailable: {e}") from None

    async def _scrub(self) -> None:
        """Copy the WAL into the file and truncate it: the WAL still holds the page images an
        erasure or purge just replaced (docs/retention.md). Best effort: a reader outside this
        process can hold the checkpoint back; the next erasure or purge tries again."""
        if self._closed:
            return

        def checkpoint() -> None:
            # without waiting: a reader outside the server (a backup) must not stall this thread,
            # which every store call of the server queues on
            timeout = self._conn.execute("PRAGMA busy_timeout").fetchone()[0]
            self._conn.execute("PRAGMA busy_timeout=0")
            try:
                busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            except sqlite3.Error as e:
                log.warning("store: the WAL was not truncated after an erasure or purge: %s", e)
                return
            finally:
                self._conn.execute(f"PRAGMA busy_timeout={int(timeout)}")
            if busy:
                log.warning("store: the WAL was not truncated after an erasure or purge: another reader holds it")

        with contextlib.suppress(RuntimeError):  # shut down under us
            await asyncio.get_running_loop().run_in_executor(self._executor, checkpoint)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None


WRITER_LOCK_SUFFIX = "-writer"  # the shared store's transaction lock file, beside the database
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
    for suffix in ("-wal", "-shm", "-journal", WRITER_LOCK_SUFFIX):
        side = db.with_name(db.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            side.chmod(PRIVATE_FILE_MODE)


def _octet_length(value: object) -> int | None:
    if value is None:
        return None
    return len(value.encode() if isinstance(value, str) else bytes(value))  # type: ignore[arg-type]
