"""The one image builder: every CrossAudit image (the sandbox runner and dependency sets, the model
servers, the orchestrator, compose's PostgreSQL) is built here, through docker-py's low-level
``api.build`` on the classic builder, and nowhere else.

It sits in a layer of its own just above the kernel because its three users may not import each
other (``sandbox`` and ``crossaudit.modelserver`` are siblings, ``crossaudit.service`` is above
both) and the kernel imports no third-party client. It knows nothing of what an image holds:
callers prepare a build context (a directory or a tar) and name the parts that make its content.

* **Tagged and labelled by content.** :func:`content_tag` hashes what went into an image (its
  Dockerfile, sources, base image id, ...) *and its build arguments*, so one Dockerfile built
  with two arguments (the model servers') gives two tags. The hash is also put on the image as
  :data:`CONTENT_LABEL`.
* **Find before build.** :meth:`ImageBuilder.build` returns at once when the tag exists;
  :meth:`ImageBuilder.ensure` does not even prepare the context then (a pip resolve, a wheel build).
* **Streamed.** Every output line goes to a progress callback; a step line (``Step 2/5 : ...``)
  moves the fraction through the caller's span; an ``error`` message or a missing image after the
  stream ends fails the build, quoting the output's last lines.
* **Bounded.** Each limit is a named field of :class:`BuildLimits`.

What else more than one of those users needs of Docker lives beside it, once:
:mod:`~crossaudit.imagebuild.daemon` (the one docker-py client factory),
:mod:`~crossaudit.imagebuild.baseimage` (which local base an image builds FROM),
:mod:`~crossaudit.imagebuild.hardening` (the settings every container runs with),
:func:`build_step` (reading a build's step lines) and :mod:`~crossaudit.imagebuild.locked` (the
images' hashed requirements).

All calls block (docker-py): async callers use a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from crossaudit.imagebuild.daemon import docker_client
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.progress import ProgressCallback

TAG_HEX_CHARS = 16  # a content tag is this many hex digits of a SHA-256
CONTENT_LABEL = "crossaudit.content"  # on every image built here: the full content hash its tag abbreviates
IMAGE_LABEL = "crossaudit.image"  # what kind of image (runner, deps, modelserver, orchestrator, postgres)
STEP_LINE = re.compile(r"^Step (\d+)/(\d+) :")  # the classic builder's step lines (:func:`build_step`)


@dataclass(frozen=True)
class BuildLimits:
    """How long and how loud a build may be."""

    build_timeout_s: float = 1800.0  # one build, start to image: the orchestrator's first takes minutes
    client_timeout_s: float = 60.0  # every other daemon call (inspect, tag, list)
    max_progress_lines: int = 10_000  # output lines forwarded to the progress callback per build
    max_line_chars: int = 200  # each forwarded line is cut to this
    error_tail_lines: int = 20  # output lines quoted when a build fails
    apt_timeout_s: float = 1800.0  # fetching a context's Debian packages with the host's apt


def _noop(_message: str, _fraction: float) -> None:
    return None


def content_hash(*parts: bytes | str, buildargs: Mapping[str, str] | None = None) -> str:
    """SHA-256 hex of ``parts`` (each ended by a NUL, so no two lists collide) and then of the
    build arguments, sorted: the same context built with another argument is another image."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    for key, value in sorted((buildargs or {}).items()):
        h.update(f"--build-arg {key}={value}".encode())
        h.update(b"\0")
    return h.hexdigest()


def content_tag(repo: str, *parts: bytes | str, buildargs: Mapping[str, str] | None = None) -> str:
    """``repo:<TAG_HEX_CHARS hex digits of content_hash>``."""
    return f"{repo}:{content_hash(*parts, buildargs=buildargs)[:TAG_HEX_CHARS]}"


def build_step(line: str) -> tuple[int, int] | None:
    """``(n, total)`` of one of the classic builder's step lines (``Step 2/5 : COPY ...``), None for
    any other output line: what moves a build's progress, and what a log keeps of a build."""
    step = STEP_LINE.match(line)
    return (int(step.group(1)), int(step.group(2))) if step else None


class ImageBuilder:
    """Finds, builds and tags images on one daemon. ``client`` is a docker-py ``DockerClient``
    (made from the environment on first use when None)."""

    def __init__(self, client: Any = None, limits: BuildLimits | None = None) -> None:
        self.limits = limits or BuildLimits()
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client(self.limits.client_timeout_s)
        return self._client

    # --- finding -----------------------------------------------------------------------------

    def image_id(self, ref: str) -> str | None:
        """The id of image ``ref`` on the daemon, None when it has none by that name."""
        import docker.errors

        try:
            return str(self.client.api.inspect_image(ref)["Id"])
        except docker.errors.ImageNotFound:
            return None

    def exists(self, ref: str) -> bool:
        return self.image_id(ref) is not None

    def newest(self, repo: str) -> str | None:
        """The most recently created tagged image of ``repo`` (``crossaudit/base``), if any."""
        images = self.client.api.images(name=repo)
        for image in sorted(images, key=lambda i: int(i.get("Created") or 0), reverse=True):
            for tag in image.get("RepoTags") or []:
                if tag.startswith(f"{repo}:") and "<none>" not in tag:
                    return str(tag)
        return None

    def tag(self, ref: str, new_ref: str) -> None:
        """Give image ``ref`` another name (``crossaudit/orchestrator:latest``), moving it if taken."""
        repo, _, tag = new_ref.rpartition(":")
        if not self.client.api.tag(ref, repo, tag or "latest", force=True):
            raise ConfigurationError(f"could not tag {ref} as {new_ref}")

    # --- building ----------------------------------------------------------------------------

    def ensure(self, tag: str, prepare: Callable[[Path], object], *, force: bool = False, **build: Any) -> str:
        """``tag`` if the daemon has it; else a context laid out by ``prepare(dir)`` in a temporary
        directory, built as ``tag`` (``build``: :meth:`build`'s keywords). For images whose tag is
        known before their context is made, so a found image costs no preparation."""
        if not force and self.exists(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="ca-build-") as tmp:
            prepare(Path(tmp))
            return self.build(Path(tmp), tag, force=True, **build)

    def build(
        self,
        context: Path,
        tag: str,
        *,
        buildargs: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        nocache: bool = False,
        force: bool = False,
        progress: ProgressCallback | None = None,
        frac: float = 0.0,
        span: float = 0.0,
    ) -> str:
        """Build ``context`` (a directory, honouring its ``.dockerignore``, or a tar file, ``.tar.gz``
        allowed) as ``tag``, never pulling; returns ``tag``. Found instead unless ``force``.

        ``tag``'s content hash goes on the image as :data:`CONTENT_LABEL`, next to ``labels``.
        Output lines go to ``progress`` at a fraction that starts at ``frac`` and moves towards
        ``frac + span`` step by step.
        """
        if not force and self.exists(tag):
            return tag
        say = progress or _noop
        lim = self.limits
        all_labels = {**(labels or {}), CONTENT_LABEL: tag.rpartition(":")[2]}
        deadline = time.monotonic() + lim.build_timeout_s
        tail: list[str] = []
        error = ""
        start = frac
        with _context(Path(context)) as source:
            try:
                stream = self.client.api.build(
                    **source,
                    tag=tag,
                    buildargs=dict(buildargs or {}),
                    labels=all_labels,
                    nocache=nocache,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    decode=True,
                    timeout=int(lim.build_timeout_s),
                )
                for n, chunk in enumerate(stream):
                    if "error" in chunk:
                        error = str(chunk.get("error") or "").strip()
                    line = str(chunk.get("stream") or chunk.get("status") or "").strip()
                    step = build_step(line)
                    if step:
                        frac = max(frac, start + span * (step[0] - 1) / max(1, step[1]))
                    if line:
                        tail = [*tail[-(lim.error_tail_lines - 1) :], line[: lim.max_line_chars]]
                        if n < lim.max_progress_lines:
                            say(line[: lim.max_line_chars], frac)
                    if time.monotonic() > deadline:
                        raise ConfigurationError(f"image build of {tag} exceeded {lim.build_timeout_s:.0f}s")
            except ConfigurationError:
                raise
            except Exception as exc:  # the daemon refused the request, or went silent past the timeout
                raise ConfigurationError(f"image build of {tag} failed: {type(exc).__name__}: {exc}") from None
        if error or not self.exists(tag):
            output = "\n".join(tail)
            raise ConfigurationError(f"image build of {tag} failed: {error or 'no image produced'}\n{output}")
        return tag


@contextlib.contextmanager
def _context(context: Path) -> Iterator[dict[str, Any]]:
    """``api.build``'s arguments for a context directory or a tar file."""
    if context.is_dir():
        yield {"path": str(context)}
        return
    if not context.is_file():
        raise ConfigurationError(f"no build context at {context}")
    with open(context, "rb") as f:
        fileobj: IO[bytes] = f
        gz = context.name.endswith((".tar.gz", ".tgz"))
        yield {"fileobj": fileobj, "custom_context": True, **({"encoding": "gzip"} if gz else {})}


# --- preparing contexts on the host ----------------------------------------------------------------


def debian_rootfs(rootfs: Path, packages: tuple[str, ...], limits: BuildLimits | None = None) -> list[str]:
    """``packages`` of the host's Debian suite (the base's: both bookworm), fetched with the host's
    apt and unpacked into ``rootfs`` for a ``COPY rootfs/ /``: shared libraries the minimal base
    lacks, installed with no apt and no network inside the build. Returns the .deb file names (their
    versions belong in the content hash)."""
    timeout = (limits or BuildLimits()).apt_timeout_s
    rootfs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ca-debs-") as tmp:
        run_tool(["apt-get", "download", *packages], f"apt-get download {' '.join(packages)}", timeout, cwd=tmp)
        debs = sorted(Path(tmp).glob("*.deb"))
        for deb in debs:
            run_tool(["dpkg-deb", "-x", str(deb), str(rootfs)], f"dpkg-deb -x {deb.name}", timeout)
    for doc in ("usr/share/doc", "usr/share/gcc", "usr/share/gdb", "usr/share/lintian"):
        shutil.rmtree(rootfs / doc, ignore_errors=True)
    return [d.name for d in debs]


def run_tool(cmd: list[str], what: str, timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A build tool (pip, apt-get, dpkg-deb) run to completion; its failure a ConfigurationError quoting
    the end of its output."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired:
        raise ConfigurationError(f"{what} timed out after {timeout:.0f}s") from None
    except FileNotFoundError:
        raise ConfigurationError(f"{what}: {cmd[0]} is not installed") from None
    if proc.returncode != 0:
        tail = "\n".join(s.strip()[-2000:] for s in (proc.stdout, proc.stderr) if s and s.strip())
        raise ConfigurationError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc
