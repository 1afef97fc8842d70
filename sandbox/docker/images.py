"""Sandbox images, built locally and tagged by content: base → runner → one image per dependency set.

* **base**: a configured Python 3.11 image (``python:3.11-slim``) when present (or pullable, when
  no local base was built before: see :meth:`ImageManager.ensure_base`), else a Debian bookworm
  root filesystem made by ``mmdebstrap`` from the *host's* apt sources and
  ``docker import``-ed (no registry needed; see ``images/base/README.md``); its recipe and tag,
  and which local base the other images use, are :mod:`crossaudit.imagebuild.baseimage`'s.
* **runner**: ``images/runner/Dockerfile`` FROM the base: non-root user, the agent copied in.
* **deps**: FROM the runner plus one ``COPY`` of a site directory resolved on the host
  (:mod:`sandbox.deps`); labels carry the import names the warm agent preloads. The set's
  hash-locked list and CycloneDX SBOM are copied in too (``/opt/crossaudit/requirements.lock``,
  ``/opt/crossaudit/sbom.cdx.json``) and their sha256 are labels (``LOCK_LABEL``, ``SBOM_LABEL``),
  so an evaluator's provenance is read from the image without starting a container.

Every tag is a hash of what went into it (:func:`crossaudit.imagebuild.content_tag`), so a build
happens once per change, is found again by name afterwards (also across processes: builds hold a
file lock), and never happens at call time. The runner and dependency images are built by the one
image builder (:class:`crossaudit.imagebuild.ImageBuilder`); only the base is imported, not built.
All functions here are blocking (docker-py, subprocess): async callers use an executor.

CLI (``make images``): ``python -m sandbox.docker build-base [--force]``,
``build-deps NAME[SPEC]...``, ``reap``, ``prune``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.imagebuild import IMAGE_LABEL, BuildLimits, ImageBuilder, content_tag
from crossaudit.imagebuild.baseimage import IMPORT_CHANGES, MMDEBSTRAP_ARGS, SUITE, local_base_tag
from crossaudit.kernel.depspec import Dependency, validate_dependencies
from crossaudit.kernel.errors import ConfigurationError, CrossAuditError
from crossaudit.kernel.limits import DependencyLimits
from crossaudit.kernel.progress import ProgressCallback
from crossaudit.kernel.resources import image_dir
from sandbox.deps import LOCK_FILE, SBOM_FILE, Wheelhouse, default_cache_dir, file_lock
from sandbox.streaming import run_streaming

RUNNER_DIR = image_dir("runner")
# Where the image steps end within a whole evaluator's preparation progress (0..1).
RUNNER_READY = 0.4
DEPS_READY = 0.9
AGENT_DIR = Path(__file__).resolve().parents[1] / "agent"  # copied into the runner image
AGENT_ENTRY_FILES = frozenset({"__init__.py", "__main__.py", "launch.py"})  # what entry.py needs to run it

DEFAULT_BASE_IMAGE = "python:3.11-slim"
ENV_BASE_IMAGE = "CROSSAUDIT_BASE_IMAGE"  # a local Python 3.11 image to build FROM instead
LABEL = "crossaudit.sandbox"  # on every container this backend starts (reaped by label)
PRELOAD_LABEL = "crossaudit.preload"
RUNNER_LABEL = "crossaudit.runner"  # on dependency images: the runner tag they were built FROM
LOCK_LABEL = "crossaudit.lock.sha256"  # on dependency images: sha256 of their hash-locked dependency list
SBOM_LABEL = "crossaudit.sbom.sha256"  # on dependency images: sha256 of their CycloneDX SBOM
IMAGE_FILES_DIR = "/opt/crossaudit"  # where a dependency image keeps its site, lock and SBOM
MAX_PRUNE = 1_000  # images examined per prune pass
SANDBOX_UID = 10001


def _noop(_m: str, _f: float) -> None:
    return None


@dataclass(frozen=True)
class DepsImage:
    """An image able to run bundles with one dependency set; ``preload`` = import names to warm;
    ``image_id`` the daemon's id of ``tag`` (``sha256:...``) and, for a dependency image, the sha256
    of its hash-locked list and SBOM (its labels)."""

    tag: str
    preload: tuple[str, ...] = ()
    image_id: str = ""
    lock_sha256: str = ""
    sbom_sha256: str = ""

    def provenance(self) -> dict[str, str]:
        """Its facts under the keys of docs/provenance.md (empty values left out)."""
        facts = {"image_id": self.image_id, "dependencies_sha256": self.lock_sha256, "sbom_sha256": self.sbom_sha256}
        return {k: v for k, v in facts.items() if v}


class ImageManager:
    """Finds or builds the three image layers. Thread-safe; builds are serialised per process and file-locked."""

    def __init__(
        self,
        client: Any,
        *,
        cache_dir: Path | None = None,
        dep_limits: DependencyLimits | None = None,
        base_image: str | None = None,
        pull_timeout_s: float = 20.0,
    ) -> None:
        self.client = client
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.dep_limits = dep_limits or DependencyLimits()
        env_base = os.environ.get(ENV_BASE_IMAGE)
        if base_image is None:
            base_image = env_base if env_base is not None else DEFAULT_BASE_IMAGE
        self.base_image = base_image
        # an operator named this image (argument or $CROSSAUDIT_BASE_IMAGE): worth a pull before
        # falling back; the built-in default is not
        self.base_configured = base_image != DEFAULT_BASE_IMAGE
        self.pull_timeout_s = pull_timeout_s
        self.wheelhouse = Wheelhouse(self.cache_dir, self.dep_limits)
        self.builder = ImageBuilder(client, BuildLimits(build_timeout_s=self.dep_limits.build_timeout_s))
        self._lock = threading.RLock()
        self._runner: str | None = None
        self._pull_failed = False

    # --- helpers ---------------------------------------------------------------------------------

    def exists(self, ref: str) -> bool:
        return self.builder.exists(ref)

    def _image_id(self, ref: str) -> str:
        found = self.builder.image_id(ref)
        if found is None:
            raise ConfigurationError(f"image {ref} is not on this Docker daemon")
        return found

    # --- base ------------------------------------------------------------------------------------

    def ensure_base(self, progress: ProgressCallback | None = None, *, force: bool = False) -> str:
        """The base every runner image builds FROM, found locally whenever it can be.

        In order: the configured image if present; else, for the default (``python:3.11-slim``,
        nothing configured), the local bookworm base if it was built before — so a machine that
        has one never asks a registry (no pull attempt on every start); else one short pull of the
        configured image (once per process; an explicitly configured image is pulled before the
        local base is used); else the local bookworm base, built without any registry.
        """
        say = progress or _noop
        with self._lock:
            configured = self.base_image
            if configured and configured.lower() != "none":
                if not force and self.exists(configured):
                    return configured
                if not force and not self.base_configured and self.exists(self.local_base_tag()):
                    return self.local_base_tag()
                if not self._pull_failed and self._try_pull(configured, say):
                    return configured
            return self._local_base(say, force=force)

    def _try_pull(self, ref: str, say: ProgressCallback) -> bool:
        """One short pull attempt in a side thread (a blackholed registry must not stall a build)."""
        say(f"trying to pull {ref}", 0.01)
        repo, _, tag = ref.partition(":")
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        fut = pool.submit(self.client.api.pull, repo, tag=tag or "latest")
        pool.shutdown(wait=False)
        try:
            fut.result(timeout=self.pull_timeout_s)
            ok = self.exists(ref)
        except Exception as exc:  # registry unreachable, unknown image, timeout: fall back
            say(f"pull of {ref} unavailable ({type(exc).__name__}); building the base locally", 0.02)
            ok = False
        self._pull_failed = not ok
        return ok

    def local_base_tag(self) -> str:
        """The local bookworm base's tag (:func:`crossaudit.imagebuild.baseimage.local_base_tag`)."""
        return local_base_tag()

    def _local_base(self, say: ProgressCallback, *, force: bool) -> str:
        tag = self.local_base_tag()
        if not force and self.exists(tag):
            return tag
        with file_lock(self.cache_dir / "locks" / "base.lock", self.dep_limits.build_timeout_s):
            if not force and self.exists(tag):
                return tag
            mmdebstrap = ensure_mmdebstrap(say)
            sources = host_apt_sources()
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="base-", dir=self.cache_dir) as tmp:
                tar = Path(tmp) / "rootfs.tar"
                cmd = [mmdebstrap, *MMDEBSTRAP_ARGS, "--format=tar", SUITE, str(tar), *map(str, sources)]
                say("building a Debian bookworm base with mmdebstrap (host apt sources)", 0.05)
                _run_streaming(cmd, self.dep_limits.build_timeout_s, say, 0.05)
                say("importing the base root filesystem", 0.2)
                repo, _, version = tag.partition(":")
                self.client.api.import_image_from_file(
                    str(tar), repository=repo, tag=version, changes=list(IMPORT_CHANGES)
                )
            if not self.exists(tag):
                raise ConfigurationError("docker import of the local base image produced no image")
            say(f"base image {tag} ready", 0.25)
            return tag

    # --- runner ----------------------------------------------------------------------------------

    def _agent_files(self) -> list[Path]:
        """Every module of the agent package (flat: one module per job), hashed into the tag and copied."""
        files = sorted(AGENT_DIR.glob("*.py"))
        missing = sorted(AGENT_ENTRY_FILES - {f.name for f in files})
        if missing:
            raise ConfigurationError(f"sandbox/agent/ lacks {', '.join(missing)}: the runner image needs it")
        return files

    def runner_tag(self, base: str) -> str:
        parts: list[bytes | str] = [
            (RUNNER_DIR / "Dockerfile").read_bytes(),
            (RUNNER_DIR / "entry.py").read_bytes(),
            self._image_id(base),
        ]
        for f in self._agent_files():
            parts += [f.name, f.read_bytes()]
        return content_tag("crossaudit/runner", *parts, buildargs={"BASE": base})

    def _runner_context(self, ctx: Path) -> None:
        shutil.copy(RUNNER_DIR / "Dockerfile", ctx / "Dockerfile")
        shutil.copy(RUNNER_DIR / "entry.py", ctx / "entry.py")
        (ctx / "agent").mkdir()
        for f in self._agent_files():
            shutil.copy(f, ctx / "agent" / f.name)

    def ensure_runner(self, progress: ProgressCallback | None = None, *, force: bool = False) -> str:
        """Base + agent image; its tag changes whenever the Dockerfile, the agent or the base changes."""
        say = progress or _noop
        with self._lock:
            if self._runner and not force and self.exists(self._runner):
                return self._runner
            base = self.ensure_base(say, force=force)
            tag = self.runner_tag(base)
            if force or not self.exists(tag):
                with file_lock(self.cache_dir / "locks" / "runner.lock", self.dep_limits.build_timeout_s):
                    if force or not self.exists(tag):
                        say(f"building runner image {tag}", 0.3)
                        self.builder.ensure(
                            tag,
                            self._runner_context,
                            force=True,
                            buildargs={"BASE": base},
                            labels={IMAGE_LABEL: "runner"},
                            progress=say,
                            frac=0.35,
                            span=0.05,
                        )
            self._runner = tag
            say(f"runner image {tag} ready", RUNNER_READY)
            return tag

    # --- dependency images -----------------------------------------------------------------------

    def deps_tag(self, runner: str, deps: tuple[Dependency, ...]) -> str:
        from sandbox.deps import dependency_key

        return content_tag("crossaudit/deps", runner, dependency_key(deps))

    def find(self, deps: tuple[Dependency, ...]) -> DepsImage | None:
        """The image for this set if it already exists (no build, no network): the call-time path."""
        import docker.errors

        with self._lock:
            runner = self._runner
        if runner is None:
            try:
                base = self.base_image if self.base_image and self.exists(self.base_image) else self.local_base_tag()
                runner = self.runner_tag(base)
            except (docker.errors.ImageNotFound, ConfigurationError):
                return None
        if not deps:
            runner_id = self.builder.image_id(runner)
            return DepsImage(runner, image_id=runner_id) if runner_id else None
        tag = self.deps_tag(runner, deps)
        try:
            image = self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return None
        return _described(tag, image)

    def ensure_deps(
        self, deps: tuple[Dependency, ...], progress: ProgressCallback | None = None, *, force: bool = False
    ) -> DepsImage:
        """Validated set → image (resolve wheels on the host, one COPY layer); reused when present."""
        say = progress or _noop
        runner = self.ensure_runner(say)
        if not deps:
            return DepsImage(runner, image_id=self._image_id(runner))
        tag = self.deps_tag(runner, deps)
        if not force:
            found = self.find(deps)
            if found:
                say(f"dependency image {tag} cached", 0.9)
                return found
        site = self.wheelhouse.resolve(deps, say)
        context = site.path.parent
        with file_lock(self.cache_dir / "locks" / f"image-{site.key}.lock", self.dep_limits.build_timeout_s):
            if force or not self.exists(tag):
                (context / "Dockerfile").write_text(
                    f"FROM {runner}\nCOPY site/ {IMAGE_FILES_DIR}/site/\n"
                    f"COPY {LOCK_FILE} {SBOM_FILE} {IMAGE_FILES_DIR}/\n"
                )
                (context / ".dockerignore").write_text(".crossaudit.json\n")
                say(f"building dependency image {tag}", 0.5)
                self.builder.build(
                    context,
                    tag,
                    progress=say,
                    frac=0.6,
                    span=0.3,
                    nocache=force,
                    force=True,
                    labels={
                        IMAGE_LABEL: "deps",
                        PRELOAD_LABEL: json.dumps(site.preload),
                        "crossaudit.deps": json.dumps([str(d) for d in deps]),
                        RUNNER_LABEL: runner,
                        LOCK_LABEL: site.lock_sha256,
                        SBOM_LABEL: site.sbom_sha256,
                    },
                )
        say(f"dependency image {tag} ready", DEPS_READY)
        return _described(tag, self.client.images.get(tag))

    def _current_deps(self, runner: str, labels: dict[str, str], tags: list[str]) -> bool:
        """For images built before RUNNER_LABEL existed: is this the current tag of its dependency set?"""
        try:
            deps = validate_dependencies(json.loads(labels.get("crossaudit.deps", "[]")), self.dep_limits)
        except (ValueError, CrossAuditError):
            return False
        return self.deps_tag(runner, deps) in tags

    def prune(self, progress: ProgressCallback | None = None, *, dry_run: bool = False) -> list[str]:
        """Remove runner and dependency images that are not built on the current runner.

        Images still used by a container are kept (docker refuses to remove them; that is fine).
        """
        import docker.errors

        say = progress or _noop
        current = self.ensure_runner(say)
        removed = []
        images = self.client.api.images(filters={"label": IMAGE_LABEL})[:MAX_PRUNE]
        for image in images:
            labels = image.get("Labels") or {}
            kind = labels.get(IMAGE_LABEL)
            tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
            stale = (kind == "runner" and current not in tags) or (
                kind == "deps" and labels.get(RUNNER_LABEL) != current and not self._current_deps(current, labels, tags)
            )
            if not stale or not tags:  # untagged parents go with their child (noprune=False)
                continue
            for tag in tags:
                if dry_run:
                    removed.append(tag)
                    continue
                try:
                    self.client.api.remove_image(tag, noprune=False)
                    removed.append(tag)
                    say(f"removed {tag}", 1.0)
                except docker.errors.APIError:
                    continue
        return removed


def _described(tag: str, image: Any) -> DepsImage:
    """A dependency image as its labels describe it (docker-py ``Image``)."""
    labels = image.labels or {}
    return DepsImage(
        tag,
        tuple(json.loads(labels.get(PRELOAD_LABEL, "[]"))),
        image_id=str(image.id or ""),
        lock_sha256=labels.get(LOCK_LABEL, ""),
        sbom_sha256=labels.get(SBOM_LABEL, ""),
    )


# --- host tools ------------------------------------------------------------------------------------


def host_apt_sources() -> list[Path]:
    """The host's apt source files for bookworm (passed to mmdebstrap as files: no host name in the repo)."""
    override = os.environ.get("CROSSAUDIT_APT_SOURCES")
    if override:
        paths = [Path(p) for p in override.split(os.pathsep) if p]
    else:
        etc = Path("/etc/apt")
        paths = [
            etc / "sources.list",
            *sorted((etc / "sources.list.d").glob("*.list")),
            *sorted((etc / "sources.list.d").glob("*.sources")),
        ]
    found = []
    for p in paths:
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        if SUITE in text and any(
            ln.strip().startswith(("deb ", "Types:")) for ln in text.splitlines() if not ln.lstrip().startswith("#")
        ):
            found.append(p)
    if not found:
        raise ConfigurationError(
            f"no base image: {DEFAULT_BASE_IMAGE} cannot be pulled and the host has no apt sources for {SUITE} "
            "(set CROSSAUDIT_APT_SOURCES to a sources file, or CROSSAUDIT_BASE_IMAGE to a local Python 3.11 image)"
        )
    return found


def ensure_mmdebstrap(say: ProgressCallback = _noop) -> str:
    """``mmdebstrap`` path, installing it with apt-get on a fresh machine (root or passwordless sudo)."""
    found = shutil.which("mmdebstrap")
    if found:
        return found
    prefix: list[str] = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else [])
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    say("installing mmdebstrap with apt-get", 0.02)
    for cmd in (
        [*prefix, "apt-get", "install", "-y", "-q", "mmdebstrap"],
        [*prefix, "apt-get", "update", "-q"],
        [*prefix, "apt-get", "install", "-y", "-q", "mmdebstrap"],
    ):
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, check=False)
        found = shutil.which("mmdebstrap")
        if found:
            return found
    raise ConfigurationError("mmdebstrap is not installed and apt-get could not install it")


def _run_streaming(cmd: list[str], timeout_s: float, say: ProgressCallback, frac: float) -> None:
    run = run_streaming(cmd, time.monotonic() + timeout_s, say, frac)
    if run.returncode != 0:
        status = f"timed out after {timeout_s:.0f}s" if run.timed_out else f"exit {run.returncode}"
        raise ConfigurationError(f"{Path(cmd[0]).name} failed ({status}):\n" + "\n".join(run.tail[-10:]))


# --- CLI ---------------------------------------------------------------------------------------------
