"""The CrossAudit model store: model files kept under the data directory, each entry with a manifest.

Builtins find their models here (step 2 of the resolution order in
:mod:`crossaudit.modelserver.locate`), after an explicit path and before the libraries' own
caches; ``crossaudit models pull|import`` fill it and ``verify`` re-hashes it. Layout::

    <store>/<name>/<variant>/manifest.json   name, variant, source, created, files [{path, sha256, size}]
    <store>/<name>/<variant>/files/...       the checkpoint file, or the pipeline directory's content
    <store>/.staging/                        entries being written (same filesystem: the commit is a rename)

The store is ``CROSSAUDIT_MODEL_STORE``, else ``<data dir>/models`` with the service's default
data dir (``.crossaudit``, relative to the working directory, as for ``crossaudit serve``; the
server uses ``<--data-dir>/models``). Like the rest of the data dir, directories are 0700 and files
0600 whatever the umask: Detoxify checkpoints are pickles, so nobody else may write them.

Names and variants are one path component each (``[a-z0-9][a-z0-9._-]*``, no ``..``), so no
entry lies outside the store. An entry appears whole or not at all: it is written in a staging
directory and renamed into place; readers never see a half-written model. Sizes are capped by
:class:`ModelStoreLimits`. Nothing here reaches the network (``crossaudit.modelserver.download`` does).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossaudit.kernel.errors import ConfigurationError, InvalidInputError, NotFoundError
from crossaudit.kernel.shell import command

ENV_MODEL_STORE = "CROSSAUDIT_MODEL_STORE"
# The service's default data directory (crossaudit.service.config.ServerConfig.data_dir, the default
# of `crossaudit serve --data-dir`); the service layer sits above this one, so a unit test keeps
# the two equal instead of an import.
DEFAULT_DATA_DIR = ".crossaudit"
STORE_SUBDIR = "models"
DEFAULT_VARIANT = "default"
MANIFEST = "manifest.json"
FILES = "files"
STAGING = ".staging"
MANIFEST_FORMAT = 1
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
_HASH_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ModelStoreLimits:
    """Caps of the model store and of downloads into it (see ``docs/limits.md``)."""

    max_file_bytes: int = 4 * 1024**3  # one model file (a multilingual Detoxify checkpoint is ~1.1 GB)
    max_entry_bytes: int = 8 * 1024**3  # all files of one entry
    max_entry_files: int = 10_000  # files of one entry (a spaCy pipeline has tens)
    max_manifest_bytes: int = 4 * 1024 * 1024  # a manifest larger than this is refused unread
    max_entries_listed: int = 10_000  # entries `list`/`verify` walk
    download_timeout_s: float = 3_600.0  # one file's whole download
    download_connect_timeout_s: float = 30.0
    download_read_timeout_s: float = 60.0  # longest silence of the server mid-download
    max_redirects: int = 10  # release assets redirect to a CDN
    max_archive_members: int = 10_000  # members of a downloaded model archive (spaCy wheel)
    # Its central directory (the member index), checked before it is read: Python's zipfile reads
    # and parses the whole of it, whatever the member count says, before any member count check.
    max_archive_index_bytes: int = 16 * 1024 * 1024


DEFAULT_LIMITS = ModelStoreLimits()


def validate_name(value: str, what: str = "model name") -> str:
    """One safe path component: lowercase letters, digits, ``.``, ``_``, ``-``; never ``.``/``..``."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or ".." in value:
        raise InvalidInputError(
            f"{what} {value!r} is not valid: use lowercase letters, digits, '.', '_' and '-' "
            "(at most 100 characters, starting with a letter or digit)"
        )
    return value


def store_root(environ: Mapping[str, str] | None = None) -> Path:
    """The store directory for these settings, absolute (so model servers receive absolute paths)."""
    environ = os.environ if environ is None else environ
    configured = environ.get(ENV_MODEL_STORE, "").strip()
    root = Path(configured).expanduser() if configured else Path(DEFAULT_DATA_DIR) / STORE_SUBDIR
    return Path(os.path.abspath(root))


def sha256_file(path: Path, *, limit: int | None = None) -> tuple[str, int]:
    """SHA-256 and size of ``path``, read in chunks; more than ``limit`` bytes is an error."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            size += len(chunk)
            if limit is not None and size > limit:
                raise InvalidInputError(f"{path} is larger than {limit} bytes")
            digest.update(chunk)
    return digest.hexdigest(), size


def _utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _mkdir_private(path: Path) -> None:
    """``path`` and each missing parent created 0700 (``mkdir(parents=True)`` would use the umask for parents)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=PRIVATE_DIR_MODE)
        d.chmod(PRIVATE_DIR_MODE)


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the entry's files/ directory, '/'-separated
    sha256: str
    size: int
    source: str = ""  # where this file came from when it differs from the entry's source

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "sha256": self.sha256, "size": self.size}
        if self.source:
            doc["source"] = self.source
        return doc


@dataclass(frozen=True)
class StoreEntry:
    """One model in the store; ``files_dir`` is what a runtime loads."""

    name: str
    variant: str
    source: str
    created: str
    files: tuple[StoredFile, ...]
    directory: Path  # <store>/<name>/<variant>
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def files_dir(self) -> Path:
        return self.directory / FILES

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def path_of(self, relative: str) -> Path:
        return self.files_dir.joinpath(*relative.split("/"))

    def single_file(self) -> Path | None:
        """The entry's file when it holds exactly one at top level (an imported or pulled checkpoint)."""
        top = [f for f in self.files if "/" not in f.path]
        return self.path_of(top[0].path) if len(self.files) == 1 and top else None

    def as_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "name": self.name,
            "variant": self.variant,
            "source": self.source,
            "created": self.created,
            "size": self.size,
            "files": [f.as_json() for f in self.files],
            **dict(self.extra),
        }


@dataclass(frozen=True)
class Mismatch:
    """A problem ``verify`` found: ``path`` is relative to the entry's files/ ('' = the entry itself)."""

    name: str
    variant: str
    path: str
    problem: str


class ModelStore:
    """A model store directory. Reads take no lock; each commit is one rename, under a store-wide lock."""

    _thread_locks: dict[str, threading.Lock] = {}
    _thread_locks_guard = threading.Lock()

    def __init__(self, root: str | os.PathLike[str], limits: ModelStoreLimits = DEFAULT_LIMITS) -> None:
        self.root = Path(os.path.abspath(root))
        self.limits = limits

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ModelStore:
        return cls(store_root(environ))

    # --- reading ---------------------------------------------------------------------------

    def entry_dir(self, name: str, variant: str = DEFAULT_VARIANT) -> Path:
        return self.root / validate_name(name) / validate_name(variant, "variant")

    def get(self, name: str, variant: str = DEFAULT_VARIANT) -> StoreEntry | None:
        """The entry, or None when absent; an unreadable manifest or a missing file is an error
        (a damaged entry must not be skipped silently in favour of a download)."""
        directory = self.entry_dir(name, variant)
        manifest = directory / MANIFEST
        if not manifest.is_file():
            return None
        if directory.is_symlink() or directory.parent.is_symlink():  # `list` and `verify` skip these too
            raise ConfigurationError(
                f"model store entry {name}/{variant} in {self.root} is a link out of the store: "
                "remove it and pull or import the model"
            )
        entry = self._read(directory)
        if entry.name != name or entry.variant != variant:
            raise ConfigurationError(
                f"model store manifest {manifest} names {entry.name}/{entry.variant}, not {name}/{variant}: "
                "remove the entry and pull or import it again"
            )
        files_dir = entry.files_dir.resolve()
        for f in entry.files:
            p = entry.path_of(f.path)
            try:
                # What is loaded is a regular file of this entry: never a link (to a file, or through a
                # linked directory) out of it, which import, pull and verify all refuse too.
                size = os.lstat(p).st_size if stat.S_ISREG(os.lstat(p).st_mode) else -1
                if not p.resolve().is_relative_to(files_dir):
                    size = -1
            except OSError:
                size = -1
            if size != f.size:
                raise ConfigurationError(
                    f"model store entry {name}/{variant} in {self.root} is damaged ({f.path} is missing, a link or "
                    f"has the wrong size): run `{command('crossaudit', 'models', 'verify', name)}`, then pull or "
                    "import it again"
                )
        return entry

    def _read(self, directory: Path) -> StoreEntry:
        manifest = directory / MANIFEST
        try:
            if manifest.stat().st_size > self.limits.max_manifest_bytes:
                raise ValueError("manifest too large")
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            files = tuple(
                StoredFile(str(f["path"]), str(f["sha256"]), int(f["size"]), str(f.get("source", "")))
                for f in doc["files"]
            )
            for f in files:
                parts = f.path.split("/")
                if not f.path or any(p in ("", ".", "..") for p in parts) or f.path.startswith("/") or "\0" in f.path:
                    raise ValueError(f"unsafe path {f.path!r}")
            known = {"format", "name", "variant", "source", "created", "size", "files"}
            return StoreEntry(
                name=validate_name(str(doc["name"])),
                variant=validate_name(str(doc["variant"]), "variant"),
                source=str(doc["source"]),
                created=str(doc["created"]),
                files=files,
                directory=directory,
                extra={k: v for k, v in doc.items() if k not in known},
            )
        # RecursionError (JSON nested deeper than the parser's stack) and OverflowError (a size of
        # 1e999) are a damaged manifest too: one typed error, never a traceback from `models list`.
        except (OSError, ValueError, KeyError, TypeError, RecursionError, OverflowError, InvalidInputError) as exc:
            raise ConfigurationError(
                f"model store manifest {manifest} is unreadable ({type(exc).__name__}: {exc}): "
                "remove the entry and pull or import it again"
            ) from None

    def entries(self) -> list[StoreEntry]:
        """Every entry, sorted by name and variant (at most ``max_entries_listed``)."""
        found: list[StoreEntry] = []
        if not self.root.is_dir():
            return found
        for name_dir in sorted(self.root.iterdir()):
            if name_dir.name.startswith(".") or not name_dir.is_dir() or name_dir.is_symlink():
                continue
            for variant_dir in sorted(name_dir.iterdir()):
                if len(found) >= self.limits.max_entries_listed:
                    return found
                if not variant_dir.is_symlink() and (variant_dir / MANIFEST).is_file():
                    found.append(self._read(variant_dir))
        return found

    def verify(self, name: str | None = None, variant: str | None = None) -> tuple[list[StoreEntry], list[Mismatch]]:
        """Re-hash every file of the selected entries; a file not in the manifest is a mismatch too."""
        if name is not None:
            validate_name(name)
        if variant is not None:
            validate_name(variant, "variant")
        checked: list[StoreEntry] = []
        problems: list[Mismatch] = []
        for entry in self.entries():
            if (name is not None and entry.name != name) or (variant is not None and entry.variant != variant):
                continue
            checked.append(entry)
            listed = {f.path for f in entry.files}
            for f in entry.files:
                p = entry.path_of(f.path)
                if p.is_symlink() or not p.is_file():
                    problems.append(Mismatch(entry.name, entry.variant, f.path, "missing"))
                    continue
                digest, size = sha256_file(p)
                if size != f.size:
                    problems.append(Mismatch(entry.name, entry.variant, f.path, f"size {size}, manifest {f.size}"))
                elif digest != f.sha256:
                    problems.append(Mismatch(entry.name, entry.variant, f.path, "sha256 differs from the manifest"))
            for rel in _walk_files(entry.files_dir, self.limits.max_entry_files + 1):
                if rel not in listed:
                    problems.append(Mismatch(entry.name, entry.variant, rel, "not in the manifest"))
        if name is not None and not checked:
            raise NotFoundError(f"no model {name!r}{f' variant {variant!r}' if variant else ''} in store {self.root}")
        return checked, problems

    # --- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A private directory on the store's filesystem, removed afterwards whatever happens."""
        _mkdir_private(self.root / STAGING)
        tmp = Path(tempfile.mkdtemp(prefix="entry-", dir=self.root / STAGING))
        try:
            (tmp / FILES).mkdir(mode=PRIVATE_DIR_MODE)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextlib.contextmanager
    def entry_lock(self, name: str, variant: str = DEFAULT_VARIANT) -> Iterator[None]:
        """Serialise writers of one entry (threads and processes), so two resolutions needing the
        same model download it once: the second finds the entry when it gets the lock."""
        key = f"{validate_name(name)}--{validate_name(variant, 'variant')}"
        with self._thread_locks_guard:
            tlock = self._thread_locks.setdefault(f"{self.root}/{key}", threading.Lock())
        with tlock:
            _mkdir_private(self.root / STAGING)
            fd = os.open(self.root / STAGING / f"{key}.lock", os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def commit(
        self,
        staged: Path,
        name: str,
        variant: str,
        source: str,
        *,
        file_sources: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        replace: bool = False,
    ) -> StoreEntry:
        """Hash ``staged/files``, write the manifest and rename the entry into place (atomic).

        An existing entry is an error unless ``replace``; replacing renames the old entry away
        first, so readers see the old entry or the new one (or, for an instant, none), never a mix.
        """
        directory = self.entry_dir(name, variant)
        files = self._hash_tree(staged / FILES, file_sources or {})
        entry = StoreEntry(name, variant, source, _utc_now(), files, directory, dict(extra or {}))
        manifest = staged / MANIFEST
        fd = os.open(manifest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entry.as_json(), fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        _make_private(staged)
        _mkdir_private(directory.parent)
        old: Path | None = None
        if directory.exists():
            if not replace:
                raise InvalidInputError(
                    f"model {name}/{variant} is already in store {self.root}: pass --force to replace it"
                )
            old = Path(tempfile.mkdtemp(prefix="old-", dir=self.root / STAGING))
            os.rename(directory, old / "entry")
        try:
            os.rename(staged, directory)
        except OSError:
            if old is not None:
                os.rename(old / "entry", directory)
            raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):  # the rename is durable once its directory is synced
            dfd = os.open(directory.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return entry

    def import_path(
        self, name: str, source_path: str | os.PathLike[str], variant: str = DEFAULT_VARIANT, *, replace: bool = False
    ) -> StoreEntry:
        """Copy a local checkpoint file or pipeline directory into the store (no symlinks, sizes capped)."""
        validate_name(name)
        validate_name(variant, "variant")
        src = Path(source_path).expanduser()
        if src.is_symlink():
            src = src.resolve()
        if not src.exists():
            raise InvalidInputError(f"{source_path} does not exist")
        with self.entry_lock(name, variant), self.staging() as staged:
            if src.is_file():
                self._copy_file(src, staged / FILES / _safe_basename(src.name))
            elif src.is_dir():
                self._copy_tree(src, staged / FILES)
            else:
                raise InvalidInputError(f"{source_path} is neither a regular file nor a directory")
            return self.commit(staged, name, variant, f"import:{src.name}", replace=replace)

    def remove(self, name: str, variant: str = DEFAULT_VARIANT) -> bool:
        directory = self.entry_dir(name, variant)
        if not directory.exists():
            return False
        with self.entry_lock(name, variant):
            _mkdir_private(self.root / STAGING)
            old = Path(tempfile.mkdtemp(prefix="old-", dir=self.root / STAGING))
            os.rename(directory, old / "entry")
            shutil.rmtree(old, ignore_errors=True)
        return True

    # --- helpers ---------------------------------------------------------------------------

    def _copy_file(self, src: Path, dest: Path) -> None:
        size = src.stat().st_size
        if size > self.limits.max_file_bytes:
            raise InvalidInputError(
                f"{src} is {size} bytes, more than the store's limit of {self.limits.max_file_bytes} per file"
            )
        fd = os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
        copied = 0
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            while chunk := fin.read(_HASH_CHUNK):
                copied += len(chunk)
                if copied > self.limits.max_file_bytes:  # the file grew while being copied
                    raise InvalidInputError(f"{src} is larger than {self.limits.max_file_bytes} bytes")
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())

    def _copy_tree(self, src: Path, dest: Path) -> None:
        """Copy a directory tree: regular files and directories only (a symlink could name any file
        of the machine), within the entry's file-count and size limits."""
        count = total = 0
        for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
            rel = Path(dirpath).relative_to(src)
            for d in sorted(dirnames):
                s = Path(dirpath) / d
                if s.is_symlink():
                    raise InvalidInputError(f"{s} is a symbolic link: copy the model without links")
                _safe_basename(d)
                (dest / rel / d).mkdir(mode=PRIVATE_DIR_MODE)
            for f in sorted(filenames):
                s = Path(dirpath) / f
                mode = os.lstat(s).st_mode
                if stat.S_ISLNK(mode):
                    raise InvalidInputError(f"{s} is a symbolic link: copy the model without links")
                if not stat.S_ISREG(mode):
                    raise InvalidInputError(f"{s} is not a regular file")
                count += 1
                total += os.lstat(s).st_size
                if count > self.limits.max_entry_files:
                    raise InvalidInputError(f"{src} has more than {self.limits.max_entry_files} files")
                if total > self.limits.max_entry_bytes:
                    raise InvalidInputError(f"{src} is larger than {self.limits.max_entry_bytes} bytes")
                self._copy_file(s, dest / rel / _safe_basename(f))
        if count == 0:
            raise InvalidInputError(f"{src} holds no files")

    def _hash_tree(self, files_dir: Path, sources: Mapping[str, str]) -> tuple[StoredFile, ...]:
        out: list[StoredFile] = []
        total = 0
        for rel in _walk_files(files_dir, self.limits.max_entry_files + 1):
            if len(out) >= self.limits.max_entry_files:
                raise InvalidInputError(f"a model entry may hold at most {self.limits.max_entry_files} files")
            digest, size = sha256_file(files_dir / rel, limit=self.limits.max_file_bytes)
            total += size
            if total > self.limits.max_entry_bytes:
                raise InvalidInputError(f"a model entry may hold at most {self.limits.max_entry_bytes} bytes")
            out.append(StoredFile(rel, digest, size, sources.get(rel, "")))
        if not out:
            raise InvalidInputError("a model entry needs at least one file")
        return tuple(out)


def _safe_basename(name: str) -> str:
    if name in ("", ".", "..") or "/" in name or "\0" in name or name in (MANIFEST,):
        raise InvalidInputError(f"unsafe file name {name!r}")
    return name


def _walk_files(root: Path, limit: int) -> list[str]:
    """Regular files under ``root`` as '/'-separated relative paths, sorted; symlinks are listed
    (so verify reports them) but never followed."""
    out: list[str] = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for f in sorted(filenames) + sorted(d for d in dirnames if (Path(dirpath) / d).is_symlink()):
            out.append((Path(dirpath) / f).relative_to(root).as_posix())
            if len(out) >= limit:
                return sorted(out)
    return sorted(out)


def _make_private(root: Path) -> None:
    """0700 directories and 0600 files under ``root`` (symlinks untouched), whatever the umask."""
    root.chmod(PRIVATE_DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink():
                p.chmod(PRIVATE_DIR_MODE)
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                p.chmod(PRIVATE_FILE_MODE)


def format_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
