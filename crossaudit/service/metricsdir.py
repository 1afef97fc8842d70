"""The prometheus multiprocess directory of ``serve --workers N``: made at a supervisor's start,
removed when it stops, and found and removed by a later start when the supervisor was killed.

A directory is ``crossaudit-metrics-<random>`` in the temporary directory (0700, this user's),
holding :data:`LOCK_NAME`, a file the supervisor holds an exclusive ``flock`` on for its whole
life; its workers inherit the open file, so the lock is held while any of them lives (a killed
supervisor's workers still write their metrics while they drain). The directory is made under a
name the sweep does not look at (:data:`STAGING_PREFIX`) and renamed once its lock is held, so a
sweep never sees a live supervisor's directory without its lock.

At a supervisor's start, :func:`sweep` removes every ``crossaudit-metrics-*`` entry of the
temporary directory that is a real directory (never a link, never followed), owned by this uid,
whose lock file is a regular file nobody holds. Other entries (files, links, another user's
directories: anyone may make them) are passed over while the directory is listed; at most
:data:`MAX_SWEPT` of this user's directories are examined a start, whatever the listing holds. A
directory without the lock file (made by an older version, which cannot be told live or dead) and
another user's are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile

log = logging.getLogger("crossaudit.service.workers")

PREFIX = "crossaudit-metrics-"  # a supervisor's directory, once its lock is held
STAGING_PREFIX = ".crossaudit-metrics-new-"  # while it is made (not swept)
LOCK_NAME = "supervisor.lock"  # held (flock) by the supervisor and its workers while any lives
MAX_SWEPT = 1_000  # this user's directories one start examines (a crash loop's worth; the rest wait for the next)


class MetricsDir:
    """This supervisor's directory and the open, locked file that says it is alive."""

    def __init__(self, path: str, lock_fd: int) -> None:
        self.path = path
        self.lock_fd = lock_fd

    def remove(self) -> None:
        """Remove the directory, then let go of the lock (a sweep never removes it meanwhile)."""
        if self.lock_fd < 0:
            return
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self.lock_fd)
            self.lock_fd = -1


def create(parent: str | None = None) -> MetricsDir:
    """A new directory (0700) in ``parent`` (default: the temporary directory), locked."""
    parent = parent or tempfile.gettempdir()
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)
    fd = -1
    try:
        fd = os.open(
            os.path.join(staging, LOCK_NAME),
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        final = os.path.join(parent, PREFIX + os.path.basename(staging)[len(STAGING_PREFIX) :])
        os.rename(staging, final)  # mkdtemp's random part is unique in parent: no existing name
        return MetricsDir(final, fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise


def sweep(parent: str | None = None) -> list[str]:
    """Remove the directories of dead supervisors in ``parent`` (module docstring); the names
    removed."""
    parent = parent or tempfile.gettempdir()
    removed: list[str] = []
    examined = 0
    try:
        with os.scandir(parent) as listing:
            for entry in listing:
                if examined >= MAX_SWEPT:
                    break
                st = _candidate(entry)
                if st is None:
                    continue
                examined += 1
                with contextlib.suppress(OSError):
                    if _dead(entry.path, st):
                        removed.append(entry.name)
    except OSError:
        pass  # the listing failed part way: what was removed stays removed
    if removed:
        log.info("removed %d metrics director%s of dead supervisors", len(removed), "y" if len(removed) == 1 else "ies")
    return removed


def _candidate(entry: os.DirEntry[str]) -> os.stat_result | None:
    """The entry's own status when it may be a supervisor's directory of this user: named
    ``crossaudit-metrics-*``, a real directory (a link is never followed), owned by this uid. Anyone
    can fill the temporary directory with such names (files, links, their own directories): they
    are passed over here, from the listing's own type and one ``lstat``, and never count towards
    :data:`MAX_SWEPT`."""
    if not entry.name.startswith(PREFIX):
        return None
    try:
        if not entry.is_dir(follow_symlinks=False):
            return None
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() else None


def _dead(path: str, st: os.stat_result) -> bool:
    """Remove ``path`` if the supervisor that made it is gone (its lock is free); whether it did."""
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        here = os.fstat(dfd)
        if (here.st_dev, here.st_ino) != (st.st_dev, st.st_ino):
            return False  # replaced since it was looked at
        try:
            lock = os.open(
                LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=dfd
            )
        except FileNotFoundError:
            return False  # an older version's, or not a supervisor's: cannot tell, left alone
        try:
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                return False
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its supervisor (or one of its workers) lives
            # Held by us now: no other start removes it meanwhile, and no supervisor can take it
            # back (a live one never lets go before removing its directory).
            shutil.rmtree(path, ignore_errors=True)  # fd-based: links inside are removed, not followed
            return not os.path.lexists(path)
        finally:
            os.close(lock)
    finally:
        os.close(dfd)
