"""Declared pip dependencies of custom evaluators: host-side wheel resolution and import names.

Why this shape:

* A dependency string reaches ``pip`` on the host, so it is validated *before* anything runs
  (:mod:`crossaudit.kernel.depspec`); only validated :class:`Dependency` values get here.
* Resolution happens on the host with ``pip download --only-binary=:all:`` for CPython 3.11 on
  manylinux x86_64 (no source builds, so no code of the package runs on the host), then
  ``pip install --no-index --target`` from that wheelhouse into a *site directory* which an
  image layer copies verbatim. Nothing is installed inside a container, nothing at call time.
* Everything is cached under ``<cache>/wheels/<key>`` and ``<cache>/sites/<key>``, keyed by the
  normalised requirement set, so a second build of the same set needs no network at all.
* The warm agent pre-imports the *import names* of the declared distributions (``scikit-learn``
  → ``sklearn``), read from the installed wheels' ``top_level.txt`` or ``RECORD``.
* Provenance (docs/provenance.md): the downloaded wheels are written as a hash-locked list
  (``requirements.lock``: ``name==version --hash=sha256:...`` per wheel, pip's
  ``--require-hashes`` format), the site is installed *from that list* with ``--require-hashes``
  (so pip itself checks every wheel against it), and a CycloneDX SBOM (``sbom.cdx.json``) is made
  from the list on the host by ``cyclonedx-py requirements`` (the maintained ``cyclonedx-bom``
  tool; no network). Both are copied into the dependency image and their sha256 become its labels.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from crossaudit.kernel.canonical import file_sha256
from crossaudit.kernel.depspec import Dependency
from crossaudit.kernel.errors import ConfigurationError, DependencyRejectedError, EvaluatorUnavailableError
from crossaudit.kernel.limits import DependencyLimits
from crossaudit.kernel.progress import ProgressCallback
from sandbox.streaming import run_streaming

# Platform tags accepted for CPython 3.11 in a Debian bookworm (glibc 2.36) image.
PYTHON_VERSION = "3.11"
PLATFORMS: tuple[str, ...] = (
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 37)),
)
_NETWORK_MARKERS = (  # pip output that means "index unreachable", not "no such wheel": retryable
    "Max retries exceeded", "Temporary failure in name resolution", "Connection refused",
    "Connection reset", "Read timed out", "ConnectTimeoutError", "Network is unreachable",
)  # fmt: skip
_RESOLVER_VERSION = "2"  # bump when the resolution recipe changes: new cache keys (2: hash-locked list + SBOM)
LOCK_FILE = "requirements.lock"  # the hash-locked list of a resolved set, beside its site directory
SBOM_FILE = "sbom.cdx.json"  # its CycloneDX SBOM (JSON)
SBOM_SPEC_VERSION = "1.6"  # the CycloneDX specification version the SBOMs are written in


def hash_lock(wheels: Iterable[Path]) -> str:
    """The hash-locked requirements of ``wheels`` (pip's ``--require-hashes`` format), one entry per
    distribution, sorted by canonical name: ``name==version \\`` then ``--hash=sha256:<hex>``.
    Two wheels of one distribution are refused (a lock pins one)."""
    entries: dict[str, str] = {}
    for wheel in wheels:
        try:
            name, version, _build, _tags = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename as exc:
            raise DependencyRejectedError(f"resolution produced a file that is not a wheel: {wheel.name}") from exc
        if name in entries:
            raise DependencyRejectedError(f"resolution produced two wheels of {name}: cannot lock one version")
        entries[name] = f"{name}=={version} \\\n    --hash=sha256:{file_sha256(wheel)}\n"
    return "".join(entries[n] for n in sorted(entries))


def dependency_key(deps: Iterable[Dependency]) -> str:
    """Content key of a validated set (plus the resolver recipe): names the wheelhouse, site and image."""
    doc = json.dumps(
        {"deps": sorted(str(d) for d in deps), "python": PYTHON_VERSION, "platforms": PLATFORMS, "v": _RESOLVER_VERSION}
    )
    return hashlib.sha256(doc.encode()).hexdigest()


# --- import names -----------------------------------------------------------------------------------

_SKIP_TOP = {"test", "tests", "testing", "docs", "doc", "examples", "bin", "scripts", "__pycache__"}


def import_names(site: Path, dists: Iterable[str]) -> dict[str, list[str]]:
    """Map each distribution to the top-level modules it installed into ``site`` (best effort).

    Reads ``top_level.txt`` when the wheel has one, else the first path component of
    ``RECORD`` entries; falls back to the normalised distribution name.
    """
    infos: dict[str, Path] = {}
    for info in site.glob("*.dist-info"):
        dist = info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        infos[canonicalize_name(dist)] = info
    result: dict[str, list[str]] = {}
    for dist in dists:
        key = canonicalize_name(dist)
        names: list[str] = []
        found = infos.get(key)
        if found is not None:
            names = _names_from_top_level(found) or _names_from_record(found)
        names = [n for n in names if n.isidentifier() and n not in _SKIP_TOP]
        public = [n for n in names if not n.startswith("_")]
        names = public or names
        if not names:
            names = [key.replace("-", "_")]
        guess = key.replace("-", "_")
        result[key] = sorted(set(names), key=lambda n: (n != guess, n))
    return result


def _names_from_top_level(info: Path) -> list[str]:
    path = info / "top_level.txt"
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:200]
    return [ln.strip().split("/")[0] for ln in lines if ln.strip()]


def _names_from_record(info: Path) -> list[str]:
    path = info / "RECORD"
    if not path.is_file():
        return []
    names: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        if n > 100_000:
            break
        entry = line.split(",", 1)[0].strip().strip('"')
        if not entry or entry.startswith(("..", "/")):
            continue
        first, _, rest = entry.partition("/")
        if first.endswith((".dist-info", ".data", ".pth")):
            continue
        if rest:
            if rest.endswith(".py") or rest.endswith(".so"):
                names.add(first)
        elif first.endswith(".py"):
            names.add(first[:-3])
        elif ".cpython-" in first and first.endswith(".so"):
            names.add(first.split(".", 1)[0])
    return sorted(names)


# --- wheelhouse -------------------------------------------------------------------------------------


ENV_CACHE_DIR = "CROSSAUDIT_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$CROSSAUDIT_CACHE_DIR`` or ``~/.cache/crossaudit`` (the data dir can pass its own)."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env) if env else Path.home() / ".cache" / "crossaudit"


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Cross-process exclusive lock (two services or test runs building the same set wait, not race)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigurationError(f"timed out waiting for lock {path.name}") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class ResolvedSite:
    """A dependency set installed into a host directory, ready to be copied into an image."""

    key: str
    path: Path
    imports: dict[str, list[str]]  # canonical distribution -> import names
    wheels: tuple[str, ...]
    lock_sha256: str = ""  # sha256 of LOCK_FILE (beside ``path``)
    sbom_sha256: str = ""  # sha256 of SBOM_FILE (beside ``path``)

    @property
    def lock_path(self) -> Path:
        return self.path.parent / LOCK_FILE

    @property
    def sbom_path(self) -> Path:
        return self.path.parent / SBOM_FILE

    @property
    def preload(self) -> list[str]:
        return sorted({name for names in self.imports.values() for name in names})


class Wheelhouse:
    """Resolves validated dependency sets to binary wheels and installs them into cached site dirs."""

    def __init__(self, cache_dir: Path | None = None, limits: DependencyLimits | None = None) -> None:
        self.root = Path(cache_dir or default_cache_dir())
        self.limits = limits or DependencyLimits()

    def _pip(self) -> list[str]:
        return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]

    def _target_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp", "--abi", "cp311"]
        for p in PLATFORMS:
            args += ["--platform", p]
        return args

    def cached(self, deps: tuple[Dependency, ...]) -> ResolvedSite | None:
        key = dependency_key(deps)
        site = self.root / "sites" / key
        meta = site / ".crossaudit.json"
        if not meta.is_file():
            return None
        doc = json.loads(meta.read_text())
        if not doc.get("lock_sha256") or not doc.get("sbom_sha256"):
            return None  # resolved by an older recipe: resolved again
        return ResolvedSite(
            key=key, path=site / "site", imports=doc["imports"], wheels=tuple(doc["wheels"]),
            lock_sha256=doc["lock_sha256"], sbom_sha256=doc["sbom_sha256"],
        )  # fmt: skip

    def resolve(self, deps: tuple[Dependency, ...], progress: ProgressCallback | None = None) -> ResolvedSite:
        """Download (once) and install a dependency set; safe across processes (file lock)."""
        say = progress or (lambda _m, _f: None)
        key = dependency_key(deps)
        hit = self.cached(deps)
        if hit:
            say(f"dependencies {key[:12]} cached", 0.3)
            return hit
        with file_lock(self.root / "locks" / f"{key}.lock", self.limits.resolve_timeout_s):
            hit = self.cached(deps)
            if hit:
                return hit
            deadline = time.monotonic() + self.limits.resolve_timeout_s
            wheels = self.root / "wheels" / key
            wheels.mkdir(parents=True, exist_ok=True)
            reqs = [str(d) for d in deps]
            lock = wheels / ".complete"
            if not lock.is_file():
                say(f"downloading wheels for {', '.join(reqs)}", 0.05)
                self._run(
                    [*self._pip(), "download", "--progress-bar", "off", "--dest", str(wheels), *self._target_args(),
                     "--", *reqs],
                    deadline,
                    say,
                    0.05,
                )
                lock.write_text("\n".join(sorted(p.name for p in wheels.glob("*.whl"))))
            say("installing wheels into the dependency layer", 0.2)
            sites = self.root / "sites"
            tmp = sites / f".{key}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "site").mkdir(parents=True)
            lock_file = tmp / LOCK_FILE
            lock_file.write_text(hash_lock(sorted(wheels.glob("*.whl"))))
            self._run(  # from the lock: pip checks every wheel's sha256 against it
                [*self._pip(), "install", "--no-index", "--find-links", str(wheels), "--target", str(tmp / "site"),
                 "--no-warn-script-location", "--progress-bar", "off", "--require-hashes",
                 *self._target_args(), "-r", str(lock_file)],
                deadline,
                say,
                0.2,
            )
            say("writing the CycloneDX SBOM of the dependency set", 0.25)
            self._run(
                [sys.executable, "-m", "cyclonedx_py", "requirements", "--output-reproducible", "--of", "JSON",
                 "--sv", SBOM_SPEC_VERSION, "-o", str(tmp / SBOM_FILE), str(lock_file)],
                deadline,
                say,
                0.25,
                what="the SBOM could not be written",
            )
            shutil.rmtree(tmp / "site" / "bin", ignore_errors=True)  # console scripts carry host shebangs
            size = sum(p.stat().st_size for p in (tmp / "site").rglob("*") if p.is_file())
            if size > self.limits.max_site_bytes:
                shutil.rmtree(tmp, ignore_errors=True)
                raise DependencyRejectedError(
                    f"dependencies install {size} bytes, more than the {self.limits.max_site_bytes} allowed"
                )
            imports = import_names(tmp / "site", [d.name for d in deps])
            names = tuple(sorted(p.name for p in wheels.glob("*.whl")))
            lock_sha256, sbom_sha256 = file_sha256(lock_file), file_sha256(tmp / SBOM_FILE)
            (tmp / ".crossaudit.json").write_text(json.dumps({
                "imports": imports, "wheels": names, "deps": reqs, "lock_sha256": lock_sha256,
                "sbom_sha256": sbom_sha256,
            }))  # fmt: skip
            final = sites / key
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            say(f"dependencies resolved: {len(names)} wheels", 0.3)
            return ResolvedSite(
                key=key, path=final / "site", imports=imports, wheels=names, lock_sha256=lock_sha256,
                sbom_sha256=sbom_sha256,
            )  # fmt: skip

    def _run(
        self, cmd: list[str], deadline: float, say: ProgressCallback, fraction: float, *, what: str = ""
    ) -> None:
        """Run pip with a deadline, streaming its lines as progress; a failure is a typed rejection."""
        if deadline - time.monotonic() <= 0:
            raise DependencyRejectedError("dependency resolution timed out")
        run = run_streaming(cmd, deadline, say, fraction)
        if run.timed_out:
            raise DependencyRejectedError("dependency resolution timed out")
        if run.returncode != 0:
            detail = "\n".join(run.tail[-8:])
            if what:
                raise ConfigurationError(f"{what}:\n{detail}")
            if any(marker in detail for marker in _NETWORK_MARKERS):
                raise EvaluatorUnavailableError(f"the package index could not be reached; try again:\n{detail}")
            raise DependencyRejectedError(
                f"dependencies could not be resolved to binary wheels for CPython {PYTHON_VERSION} "
                f"(source builds are not allowed):\n{detail}"
            )
