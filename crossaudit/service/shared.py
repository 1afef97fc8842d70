"""What the processes of one server (``serve --workers N``, and its restarts) share through its
data directory, beside the store and outside it.

It rests on ``flock``: the kernel drops a lock when its holder's descriptor closes, and so when
the process dies, ``kill -9`` included, so nothing here is left held by a dead worker.

* :class:`Witness`: the newest checkpoint this server signed of each tenant's log (size and
  root), one owner-only file per tenant in ``evidence-witness/``, replaced whole (write, fsync,
  rename) under the directory's lock. The signer checks the store against it before it extends
  or signs anything (:mod:`crossaudit.governance.evidence`): a checkpoint deleted from the database
  is noticed by every worker and after every restart, not only by the process that signed it.
* :class:`Slots`: at most ``cap`` holders per tenant across every process of the data dir, each
  slot a lock on a file of its own (``slots/<kind>/<tenant digest>.<i>``), taken without waiting:
  a slot is free again the moment its holder's block ends or its process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.errors import ConfigurationError

WITNESS_DIR = "evidence-witness"  # in the data directory
WITNESS_LOCK = ".lock"
WITNESS_FORMAT = "crossaudit.witness/v1"
MAX_WITNESS_FILE_BYTES = 4 << 10  # one tenant's entry is under 300 bytes
SLOTS_DIR = "slots"  # in the data directory
WITNESS_LOCK_POLL_S = 0.002  # how often a waiting signer tries the witness lock again (never blocks the loop)
_DIR_MODE, _FILE_MODE = 0o700, 0o600
_LOCK_OPEN = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC  # a lock file: never through a link
_ROOT_HEX = re.compile(r"[0-9a-f]{64}")


def _tenant_file(tenant: str) -> str:
    """A file name for ``tenant`` whatever its characters (tenant names are the operator's)."""
    return sha256_text(tenant)[:40]


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    return path


class Witness:
    """The newest checkpoint this server signed of each log, kept in ``data_dir`` (see the module)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / WITNESS_DIR
        self._in_process = asyncio.Lock()  # one waiter per process on the file lock

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Every process of the data dir in turn (the store's checkpoints and the witness read or
        changed together). Polled without blocking, so a cancelled waiter leaves nothing held."""
        async with self._in_process:
            fd = await asyncio.to_thread(self._open_lock)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(WITNESS_LOCK_POLL_S)
                yield
            finally:
                os.close(fd)  # releases the lock

    def _open_lock(self) -> int:
        try:
            _private_dir(self.dir)
            return os.open(self.dir / WITNESS_LOCK, _LOCK_OPEN, _FILE_MODE)
        except OSError as e:
            raise ConfigurationError(f"cannot use the evidence witness {self.dir}: {e.strerror}") from None

    def get(self, tenant: str) -> tuple[int, bytes] | None:
        """(size, root) of the newest checkpoint of ``tenant``'s log this server signed; None: none.
        A file that cannot be read or does not parse is a ConfigurationError: the signer signs
        nothing of that log until the operator looks (it never guesses the witness away)."""
        path = self.dir / _tenant_file(tenant)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ConfigurationError(f"cannot read the evidence witness {path}: {e.strerror}") from None
        try:
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_WITNESS_FILE_BYTES + 1)
        except OSError as e:
            raise ConfigurationError(f"cannot read the evidence witness {path}: {e.strerror}") from None
        try:
            doc: Any = json.loads(data) if len(data) <= MAX_WITNESS_FILE_BYTES else None
            size, root = doc["size"], doc["root"]
            ok = doc["format"] == WITNESS_FORMAT and doc["tenant"] == tenant
            ok = ok and type(size) is int and size > 0 and isinstance(root, str) and _ROOT_HEX.fullmatch(root)
        except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: nested past the parser's limit
            ok = False
        if not ok:
            raise ConfigurationError(
                f"the evidence witness {path} of tenant {tenant!r} does not parse: nothing more of its log is signed "
                "until it is restored (docs/evidence.md)"
            )
        return size, bytes.fromhex(root)

    def record(self, tenant: str, size: int, root: bytes) -> None:
        """Remember a checkpoint this server signed, when it is larger than the one remembered
        (call under :meth:`locked`). Replaced whole: a crash leaves the old file or the new one."""
        known = self.get(tenant)
        if known is not None and known[0] >= size:
            return
        doc = {"format": WITNESS_FORMAT, "tenant": tenant, "size": size, "root": root.hex()}
        try:
            self._replace(tenant, json.dumps(doc, sort_keys=True).encode() + b"\n")
        except OSError as e:  # the checkpoint is stored: the witness is only behind (the next one retries)
            raise ConfigurationError(f"cannot write the evidence witness in {self.dir}: {e.strerror}") from None

    def _replace(self, tenant: str, data: bytes) -> None:
        _private_dir(self.dir)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")  # 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / _tenant_file(tenant))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class Slots:
    """At most ``cap`` holders of a tenant's ``kind`` at once across every process of ``data_dir``
    (None: this process's alone, counted in memory)."""

    def __init__(self, data_dir: Path | None, kind: str) -> None:
        self.dir = None if data_dir is None else Path(data_dir) / SLOTS_DIR / kind
        self._held: dict[str, int] = {}  # without a data dir

    @contextlib.contextmanager
    def hold(self, tenant: str, cap: int) -> Iterator[bool]:
        """One of ``tenant``'s ``cap`` slots while the block runs: True; False (nothing held) when
        every one is held, by this process or any other of the server (the caller refuses)."""
        fd = self._take(tenant, cap)
        if fd is None:
            yield False
            return
        try:
            yield True
        finally:
            self._give(tenant, fd)

    def _take(self, tenant: str, cap: int) -> int | None:
        if self.dir is None:
            if self._held.get(tenant, 0) >= cap:
                return None
            self._held[tenant] = self._held.get(tenant, 0) + 1
            return -1
        try:
            _private_dir(self.dir)
        except OSError as e:
            raise ConfigurationError(f"cannot use {self.dir}: {e.strerror}") from None
        name = _tenant_file(tenant)
        for i in range(cap):
            try:
                fd = os.open(self.dir / f"{name}.{i}", _LOCK_OPEN, _FILE_MODE)
            except OSError as e:
                raise ConfigurationError(f"cannot use {self.dir}: {e.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue  # held: by a sibling, or by this process on another descriptor
                raise ConfigurationError(f"cannot lock a slot in {self.dir}: {e.strerror}") from None
            return fd
        return None

    def _give(self, tenant: str, fd: int) -> None:
        if fd >= 0:
            os.close(fd)  # the slot is free again (as it is when this process dies)
            return
        self._held[tenant] -= 1
        if not self._held[tenant]:
            del self._held[tenant]
