"""The orchestrator's container image, built locally: ``python -m crossaudit.service.image build``.

The image is ``FROM`` the locally built Python 3.11 base, so building it needs no image registry
(``crossaudit/base:*``, ``make images``; see ``images/base/README.md``), like the sandbox
runner and the model servers, and by the same image builder (:mod:`crossaudit.imagebuild`,
docker-py). Everything it installs is prepared on the host, so the build needs no network:

- ``wheels/own/``: CrossAudit's own wheel built from the working tree (``pip wheel . --no-deps``, in a
  copy of the tree so no ``build/`` is left behind); ``wheels/``: its dependencies (pip and tzdata
  among them), exactly as ``uv.lock`` pins them (``crossaudit/imagebuild/locked/orchestrator.txt``),
  fetched and (for the few sdists) built by the host's pip with ``--require-hashes --no-deps``: no
  resolution, and a file the lock has no hash of is refused (the host is CPython 3.11 on the base's
  architecture and glibc, and the image's pip refuses any wheel whose tags do not fit);
- ``rootfs/``: ``libstdc++6`` of the base's Debian suite (grpcio, re2 and spaCy link it), fetched
  with the host's apt and unpacked, as for the model-server images.

The tag is a hash of what went into the image: the Dockerfile, the base image's id, the contents of
CrossAudit's wheel, the locked requirements (versions and hashes) and the Debian packages' file
names. So a build whose tag exists stops before fetching a single dependency.
``crossaudit/orchestrator:latest`` is moved to the new build (for compose on this machine). The
Kubernetes manifests name the content tag itself, so a node with ``imagePullPolicy: IfNotPresent``
runs a new build when it gets a new tag (a moved ``:latest`` is never pulled again): ``pin``
writes it into ``deploy/k8s``.

    python -m crossaudit.service.image build [--base TAG] [--src DIR]   # prints the tag
    python -m crossaudit.service.image pin [TAG] [--manifests DIR]      # deploy/k8s runs that build
    python -m crossaudit.service.image context DEST                     # only the build context
    python -m crossaudit.service.image build-postgres                   # deploy/postgres/ for compose

Deploying it: ``docs/deploy.md`` (compose, Kubernetes, the Docker socket's trust implications).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from crossaudit.imagebuild import (
    IMAGE_LABEL,
    TAG_HEX_CHARS,
    ImageBuilder,
    build_step,
    content_tag,
    debian_rootfs,
    run_tool,
)
from crossaudit.imagebuild.baseimage import local_base
from crossaudit.imagebuild.locked import requirements_file
from crossaudit.kernel.errors import ConfigurationError, CrossAuditError
from crossaudit.kernel.resources import image_dir

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the ``crossaudit`` package
DOCKERFILE = image_dir("orchestrator") / "Dockerfile"
REPO = "crossaudit/orchestrator"
CONTENT_TAG = re.compile(rf"[0-9a-f]{{{TAG_HEX_CHARS}}}")
# Where ``pin`` writes the tag: the kustomization's images entry and every image: line naming REPO.
KUSTOMIZATION = "kustomization.yaml"
_NEW_TAG = re.compile(r"^(\s*newTag:\s*)\S+(.*)$", re.MULTILINE)
_IMAGE_LINE = re.compile(rf"^(\s*(?:-\s+)?image:\s*){re.escape(REPO)}(?::\S+)?(\s*(?:#.*)?)$", re.MULTILINE)
DEBIAN_PACKAGES = ("libstdc++6",)
LOCKED_REQUIREMENTS = "orchestrator"  # crossaudit/imagebuild/locked/orchestrator.txt (make lock)
PIP_TIMEOUT_S = 1800
OWN_WHEEL_DIR = "own"  # wheels/own/: CrossAudit's wheel; wheels/*.whl: its dependencies (two image layers)
# Not part of the wheel's source: kept out of the copy the wheel is built from.
_SKIP = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    ".crossaudit",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "tests",
    "docs",
    "policies",
    "deploy",
    "tools",
)


def source_root(src: Path | None = None) -> Path:
    """The working tree the wheel is built from: ``src``, else the checkout this package lives in."""
    root = Path(src) if src else PACKAGE_ROOT.parent
    if not (root / "pyproject.toml").is_file() or not (root / "crossaudit" / "__init__.py").is_file():
        raise ConfigurationError(
            f"{root} is not a CrossAudit source tree (pyproject.toml + crossaudit/): pass --src DIR"
        )
    return root


def _check_host_python() -> None:
    if sys.version_info[:2] != (3, 11):
        raise ConfigurationError(
            f"the host's pip resolves wheels for the image's Python 3.11; this is {sys.version.split()[0]}"
        )


def _pip() -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def build_own_wheel(dest: Path, src: Path | None = None, *, say=print) -> Path:  # type: ignore[no-untyped-def]
    """CrossAudit's wheel from the working tree, in ``dest/own/``."""
    _check_host_python()
    root = source_root(src)
    own_dir = dest / OWN_WHEEL_DIR
    own_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ca-src-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(root, copy, ignore=_SKIP)
        say("building the crossaudit wheel from the working tree")
        run_tool(
            [*_pip(), "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(own_dir), str(copy)],
            "pip wheel . --no-deps",
            PIP_TIMEOUT_S,
        )
    (built,) = sorted(own_dir.glob("crossaudit-*.whl"))
    return built


def fetch_dependency_wheels(dest: Path, *, say=print) -> None:  # type: ignore[no-untyped-def]
    """Every dependency's wheel as uv.lock pins it, checked against the lock's hashes, in ``dest``.
    CrossAudit's wheel sits apart (``own/``): the image installs the two in two layers, so a change
    of CrossAudit alone rebuilds seconds of image, not the whole environment."""
    _check_host_python()
    say("fetching the locked dependencies' wheels (uv.lock, hash-checked)")
    run_tool(
        [
            *_pip(),
            "wheel",
            "--require-hashes",
            "--no-deps",
            "-q",
            "-w",
            str(dest),
            "-r",
            str(requirements_file(LOCKED_REQUIREMENTS)),
        ],
        "pip wheel (locked dependencies)",
        PIP_TIMEOUT_S,
    )
    if not list(dest.glob("pip-*.whl")):
        raise ConfigurationError("the locked dependencies hold no wheel of pip (pyproject.toml lists it)")


def prepare_context(dest: Path, src: Path | None = None, *, say=print) -> tuple[Path, list[str]]:  # type: ignore[no-untyped-def]
    """Lay out a whole build context in ``dest``: Dockerfile, wheels/, rootfs/; returns (own wheel, debs)."""
    own, debs = _prepare_tagged_parts(dest, src, say=say)
    fetch_dependency_wheels(dest / "wheels", say=say)
    return own, debs


def _prepare_tagged_parts(dest: Path, src: Path | None, *, say=print) -> tuple[Path, list[str]]:  # type: ignore[no-untyped-def]
    """What the tag hashes: the Dockerfile, CrossAudit's wheel, the Debian packages (cheap beside the
    dependencies' wheels, which the locked requirements name exactly)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(DOCKERFILE, dest / "Dockerfile")
    (dest / ".dockerignore").write_text("*.deb\n")
    own = build_own_wheel(dest / "wheels", src, say=say)
    debs = debian_rootfs(dest / "rootfs", DEBIAN_PACKAGES)
    return own, debs


def context_tag(context: Path, own_wheel: Path, debs: list[str], base: str, base_id: str) -> str:
    """``crossaudit/orchestrator:<hash>`` of the Dockerfile, the base (its id and, as the build
    argument, its name), CrossAudit's wheel contents (not its zip timestamps), the locked
    requirements (every dependency's version and hashes) and the Debian packages' names."""
    own = hashlib.sha256()
    with zipfile.ZipFile(own_wheel) as zf:
        for name in sorted(zf.namelist()):
            own.update(name.encode() + b"\0" + zf.read(name) + b"\0")
    locked = requirements_file(LOCKED_REQUIREMENTS).read_bytes()
    return content_tag(
        REPO,
        (context / "Dockerfile").read_bytes(),
        base_id,
        own.hexdigest(),
        locked,
        *sorted(debs),
        buildargs={"BASE": base},
    )


def _say_as_progress(say):  # type: ignore[no-untyped-def]
    """The builder's (message, fraction) progress as this module's one-argument ``say``: only step
    lines, which mark where a long build is."""
    return lambda message, _fraction: say(message) if build_step(message) else None


def _base_id(builder: ImageBuilder, base: str) -> str:
    found = builder.image_id(base)
    if found is None:
        raise ConfigurationError(f"base image {base} not found on this Docker daemon (run `make images`)")
    return found


def build(  # type: ignore[no-untyped-def]
    base: str | None = None,
    src: Path | None = None,
    *,
    say=print,
    latest: bool = True,
    builder: ImageBuilder | None = None,
) -> str:
    """Build (or find) the orchestrator image; returns its content tag (also tagged ``:latest``)."""
    builder = builder or ImageBuilder()
    base = base or local_base(builder)
    base_id = _base_id(builder, base)
    with tempfile.TemporaryDirectory(prefix="ca-img-orchestrator-") as tmp:
        ctx = Path(tmp)
        own, debs = _prepare_tagged_parts(ctx, src, say=say)
        tag = context_tag(ctx, own, debs, base, base_id)
        if builder.exists(tag):
            say(f"{tag} is up to date")
        else:
            fetch_dependency_wheels(ctx / "wheels", say=say)
            say(f"building {tag} FROM {base}")
            t0 = time.monotonic()
            # labels: the Dockerfile's (crossaudit.image, crossaudit.base), and the builder's content hash
            builder.build(ctx, tag, buildargs={"BASE": base}, progress=_say_as_progress(say))
            say(f"built {tag} in {time.monotonic() - t0:.0f}s")
    if latest:
        builder.tag(tag, f"{REPO}:latest")
    return tag


# --- pinning the Kubernetes manifests to a build -------------------------------------------------


def latest_content_tag(builder: ImageBuilder | None = None) -> str:
    """The content tag of the last ``build`` (the one ``crossaudit/orchestrator:latest`` points to)."""
    try:
        builder = builder or ImageBuilder()
        image_id = builder.image_id(f"{REPO}:latest")
    except ConfigurationError:
        raise ConfigurationError("docker did not answer: give the tag to pin (the line `build` printed)") from None
    if image_id is None:
        raise ConfigurationError(f"no {REPO}:latest on this Docker daemon: run `make image` first, or give the tag")
    repo_tags = builder.client.api.inspect_image(image_id).get("RepoTags") or []
    tags = [t.split(":", 1)[1] for t in repo_tags if t.startswith(f"{REPO}:")]
    found = sorted(t for t in tags if CONTENT_TAG.fullmatch(t))
    if len(found) != 1:
        raise ConfigurationError(
            f"{REPO}:latest carries {len(found)} content tags ({', '.join(found) or 'none'}): give the tag to pin"
        )
    return found[0]


def pin_manifests(manifests: Path, tag: str) -> list[Path]:
    """Write content tag ``tag`` (``<hash>`` or ``crossaudit/orchestrator:<hash>``) into the
    kustomization's ``newTag`` and every ``image: crossaudit/orchestrator…`` line under
    ``manifests``; returns the files changed. Comments and layout are kept (a text edit)."""
    tag = tag.removeprefix(f"{REPO}:")
    if not CONTENT_TAG.fullmatch(tag):
        raise ConfigurationError(f"{tag!r} is not a content tag ({TAG_HEX_CHARS} hex digits, as `build` prints)")
    kustomization = Path(manifests) / KUSTOMIZATION
    if not kustomization.is_file():
        raise ConfigurationError(f"no {KUSTOMIZATION} in {manifests}: pass --manifests DIR (the repo's deploy/k8s)")
    changed = []
    for path in sorted(Path(manifests).glob("*.yaml")):
        text = path.read_text()
        new = _IMAGE_LINE.sub(lambda m: f"{m.group(1)}{REPO}:{tag}{m.group(2)}", text)
        if path.name == KUSTOMIZATION:
            new, n = _NEW_TAG.subn(lambda m: f'{m.group(1)}"{tag}"{m.group(2)}', new)
            if n != 1:
                raise ConfigurationError(f"{path} must hold exactly one images: newTag line (found {n})")
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


# --- PostgreSQL for deploy/compose.yaml ----------------------------------------------------------

POSTGRES_REPO = "crossaudit/postgres"
POSTGRES_PACKAGES = ("postgresql-15",)


def postgres_debs(builder: ImageBuilder, base: str, dest: Path) -> list[str]:
    """``POSTGRES_PACKAGES`` and what they need beyond ``base``, as .debs in ``dest``: the host's apt
    resolves against the base's own dpkg status (so nothing the base has is fetched again)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "partial").mkdir(exist_ok=True)
    try:
        status = builder.client.containers.run(
            base,
            ["/var/lib/dpkg/status"],
            entrypoint="cat",
            network_mode="none",
            remove=True,
            stdout=True,
            stderr=False,
        ).decode()
    except Exception as exc:  # the daemon, or cat in the base, refused
        raise ConfigurationError(f"reading the base's dpkg status failed: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="ca-pg-") as tmp:
        (Path(tmp) / "status").write_text(status)
        run_tool(
            [
                "apt-get",
                "-q",
                "-y",
                "-o",
                f"Dir::State::status={tmp}/status",
                "-o",
                f"Dir::Cache::archives={dest}",
                "-o",
                "Debug::NoLocking=1",
                "-o",
                "APT::Install-Recommends=false",
                "install",
                "--download-only",
                *POSTGRES_PACKAGES,
            ],
            "apt-get install --download-only " + " ".join(POSTGRES_PACKAGES),
            PIP_TIMEOUT_S,
        )
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / "lock").unlink(missing_ok=True)
    debs = sorted(p.name for p in dest.glob("*.deb"))
    if not debs:
        raise ConfigurationError("apt fetched no package for PostgreSQL")
    return debs


def build_postgres(  # type: ignore[no-untyped-def]
    base: str | None = None,
    src: Path | None = None,
    *,
    say=print,
    latest: bool = True,
    builder: ImageBuilder | None = None,
) -> str:
    """``crossaudit/postgres:<hash>`` (and ``:latest``) from ``deploy/postgres/`` of the source tree."""
    builder = builder or ImageBuilder()
    recipe = source_root(src) / "deploy" / "postgres"
    base = base or local_base(builder)
    base_id = _base_id(builder, base)
    with tempfile.TemporaryDirectory(prefix="ca-img-postgres-") as tmp:
        ctx = Path(tmp)
        for name in ("Dockerfile", "entrypoint.sh"):
            shutil.copy(recipe / name, ctx / name)
        say("fetching PostgreSQL's Debian packages with the host's apt")
        debs = postgres_debs(builder, base, ctx / "debs")
        recipe_files = [(ctx / name).read_bytes() for name in ("Dockerfile", "entrypoint.sh")]
        parts: list[bytes | str] = [base_id, *recipe_files, *debs]
        tag = content_tag(POSTGRES_REPO, *parts, buildargs={"BASE": base})
        if builder.exists(tag):
            say(f"{tag} is up to date")
        else:
            say(f"building {tag} FROM {base}")
            builder.build(
                ctx, tag, buildargs={"BASE": base}, labels={IMAGE_LABEL: "postgres"}, progress=_say_as_progress(say)
            )
    if latest:
        builder.tag(tag, f"{POSTGRES_REPO}:latest")
    return tag


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m crossaudit.service.image",
        description="Build the orchestrator image locally, FROM the local base image.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find) crossaudit/orchestrator:<content hash>, tag it :latest")
    b.add_argument("--base", default=None, help="base image (default: the local crossaudit/base of `make images`)")
    b.add_argument("--src", default=None, help="source tree to build the wheel from (default: this checkout)")
    b.add_argument("--no-latest", action="store_true", help="do not move crossaudit/orchestrator:latest")
    pg = sub.add_parser("build-postgres", help="build crossaudit/postgres:<hash> (deploy/postgres/) for compose")
    pg.add_argument("--base", default=None)
    pg.add_argument("--src", default=None)
    pin = sub.add_parser(
        "pin",
        help="make deploy/k8s run a build: its content tag in the kustomization and the "
        "Deployment (default: the build crossaudit/orchestrator:latest points to)",
    )
    pin.add_argument("tag", nargs="?", default=None, help="the content tag `build` printed")
    pin.add_argument("--manifests", default=None, help="Kubernetes manifests (default: deploy/k8s of this checkout)")
    c = sub.add_parser("context", help="only write the build context to a directory")
    c.add_argument("dest")
    c.add_argument("--src", default=None)
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        if args.cmd == "build":
            print(build(args.base, Path(args.src) if args.src else None, say=say, latest=not args.no_latest))
        elif args.cmd == "pin":
            manifests = Path(args.manifests) if args.manifests else source_root() / "deploy" / "k8s"
            tag = args.tag or latest_content_tag()
            changed = pin_manifests(manifests, tag)
            what = ", ".join(p.name for p in changed) if changed else "nothing changed"
            print(f"{REPO}:{tag.removeprefix(REPO + ':')} pinned in {manifests} ({what})")
        elif args.cmd == "build-postgres":
            print(build_postgres(args.base, Path(args.src) if args.src else None, say=say))
        else:
            prepare_context(Path(args.dest), Path(args.src) if args.src else None, say=say)
            print(os.path.abspath(args.dest))
    except CrossAuditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
