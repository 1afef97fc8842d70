"""Files: those the CLI writes for its user (reports, datasets, plots): private, and whole or not at all;
and the one size-capped read of a file a user, an operator or a tenant hands us (:func:`read_capped`).

A report carries policy details (rule names, thresholds, decision ids) and a labelled dataset the
retained text of decisions, so another local user has no business reading either, whatever the
umask says. Each is written to a temporary file beside the target (created 0600, as ``mkstemp``
does) and renamed over it: a reader never sees half a report, a failed write leaves the old file
as it was, and a file that was world-readable before is replaced, not written through.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from crossaudit.kernel.errors import CrossAuditError, InvalidInputError

PRIVATE_FILE_MODE = 0o600  # what every file written here ends up as (mkstemp's own mode)


@contextlib.contextmanager
def private_file(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file to write ``path``'s new content to; renamed into place, mode 0600, when the
    block ends without an error (and removed otherwise). InvalidInputError names the path."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise InvalidInputError(f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), PRIVATE_FILE_MODE)  # mkstemp's mode already; said here, not assumed
            yield f
        os.replace(tmp, target)
    except OSError as e:
        raise InvalidInputError(f"cannot write {path}: {e.strerror}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_private(path: str | Path, data: str | bytes) -> None:
    """``data`` (text as UTF-8) to ``path``, whole, mode 0600 (:func:`private_file`)."""
    with private_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def read_capped(path: str | Path, cap: int, what: str, error: type[CrossAuditError] = InvalidInputError) -> bytes:
    """A whole file of at most ``cap`` bytes, read without trusting its size on disk (at most
    ``cap + 1`` bytes are read, so a file that grows or a device never fills the memory). Every
    refusal is one ``error`` naming ``what`` and the path: missing, unreadable, or too large."""
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or type(e).__name__}") from None
    if len(data) > cap:
        raise error(f"{what} {path} is larger than {cap} bytes")
    return data


def read_capped_text(
    path: str | Path, cap: int, what: str, error: type[CrossAuditError] = InvalidInputError, encoding: str = "utf-8"
) -> str:
    """:func:`read_capped`, decoded; text that is not ``encoding`` is the same ``error``."""
    data = read_capped(path, cap, what, error)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise error(f"cannot read {what} {path}: not {encoding} text (byte {e.start})") from None
