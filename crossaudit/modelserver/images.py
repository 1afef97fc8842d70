"""Container images of the model servers: one recipe (``images/modelserver/Dockerfile``) built once
per model with the model as its ``MODEL`` build argument, locally, by the one image builder
(:mod:`crossaudit.imagebuild`).

No image registry is reachable, so an image is ``FROM`` the locally built Python 3.11 base
(``crossaudit/base:*``, see ``images/base/README.md``; which one:
:func:`crossaudit.imagebuild.baseimage.local_base`) plus COPYs prepared on the host:

- ``site/``: the model's stack installed with the host's pip (``pip install --target``; the host
  and the base are both CPython 3.11 on the same architecture), so the base needs no pip; exactly the
  versions ``uv.lock`` pins, hash-checked (``crossaudit/imagebuild/locked/modelserver-<kind>.txt``,
  written by ``make lock`` from :func:`requirements`);
- ``app/``: the few CrossAudit modules a model server imports (errors, results, crossaudit.modelserver,
  the generated protos);
- ``rootfs/``: shared libraries the minimal base lacks, from the base suite's Debian packages.

Models are not baked in: they are mounted read-only at ``/models`` (paths in the Dockerfile's
ENV). The container runs with no network and listens on a unix socket in a mounted directory::

    python -m crossaudit.modelserver.images build presidio      # prints the tag
    docker run --rm --network none --read-only -v SOCKDIR:/run/crossaudit -v MODELS:/models:ro TAG

``ModelServerPool(isolation="docker")`` builds and runs these images itself, hardened
(:mod:`crossaudit.modelserver.containers`). The detoxify image serves ONNX exports on onnxruntime and carries no torch.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from crossaudit.imagebuild import ImageBuilder, content_tag, debian_rootfs
from crossaudit.imagebuild.baseimage import local_base
from crossaudit.imagebuild.locked import requirements_file
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.resources import image_dir
from crossaudit.modelserver.builtins import RUNTIMES

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the installed ``crossaudit`` package
DOCKERFILE = image_dir("modelserver") / "Dockerfile"
REPO_PREFIX = "crossaudit/modelserver-"  # + the model: one repository per model, one tag per content
# The server's code: the packages ``crossaudit.modelserver.server`` imports (the layering contract
# holds it to them: pyproject.toml [tool.importlinter]), copied whole; nothing is picked file by file.
# The image builder this module uses runs on the host only.
APP_PACKAGES = ("kernel", "v1", "modelserver")
# The builtins with an image: those whose runtime module names its image's packages.
KINDS = tuple(kind for kind, runtime in RUNTIMES.items() if runtime.image_requirements is not None)
# What each image installs: the server's own stack plus the builtin's (``image_requirements`` in
# crossaudit/modelserver/builtins/<kind>.py). `make lock` pins them (and what they need) from uv.lock
# into the file the build installs (:func:`locked_requirements`), refusing a range the lock misses.
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "_common": ("grpcio>=1.66,<2", "protobuf>=5.27,<8", "pydantic>=2.7,<3", "cachetools>=5.3,<7"),
    **{kind: RUNTIMES[kind].image_requirements or () for kind in KINDS},
}
# Shared libraries the wheels need that the minimal base lacks (grpcio, onnxruntime and spaCy link
# libstdc++): fetched as Debian packages of the base's suite with the host's apt, unpacked into
# rootfs/ and copied over ``/``.
DEBIAN_PACKAGES = ("libstdc++6",)
PIP_TIMEOUT_S = 1800


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ConfigurationError(f"no model server image for {kind!r} (expected one of {KINDS})")


def app_files() -> list[tuple[str, Path]]:
    """(path inside the image's app dir, source) of every module the model server may import."""
    files = [("crossaudit/__init__.py", PACKAGE_ROOT / "__init__.py")]
    for package in APP_PACKAGES:
        for source in sorted((PACKAGE_ROOT / package).rglob("*.py")):
            if "__pycache__" not in source.parts:
                files.append((f"crossaudit/{source.relative_to(PACKAGE_ROOT)}", source))
    return files


def requirements(kind: str) -> tuple[str, ...]:
    """The packages ``kind``'s image installs into site/: the server's, then the model's."""
    _check_kind(kind)
    return (*REQUIREMENTS["_common"], *REQUIREMENTS[kind])


def locked_requirements(kind: str) -> Path:
    """The hashed requirements file ``kind``'s image installs (shipped in the package)."""
    _check_kind(kind)
    return requirements_file(f"modelserver-{kind}")


def build_args(kind: str, base: str) -> dict[str, str]:
    """The Dockerfile's arguments: the base to build FROM and the model the image serves."""
    _check_kind(kind)
    return {"BASE": base, "MODEL": kind}


def prepare_context(kind: str, dest: Path) -> Path:
    """Lay out a build context for ``kind`` in ``dest``: Dockerfile, site/, app/, rootfs/."""
    locked = locked_requirements(kind)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(DOCKERFILE, dest / "Dockerfile")
    for rel, source in app_files():
        target = dest / "app" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    debian_rootfs(dest / "rootfs", DEBIAN_PACKAGES)
    site = dest / "site"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "install",
        "-q",
        "--target",
        str(site),
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--require-hashes",
        "--no-deps",
        "-r",
        str(locked),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigurationError(f"resolving the {kind} image's packages timed out after {PIP_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        raise ConfigurationError(f"resolving the {kind} image's packages failed: {proc.stderr[-2000:]}")
    return dest


def context_tag(kind: str, base: str) -> str:
    """Tag by content: the Dockerfile, the app sources, the requirements, and the build arguments
    (the base and the model), so each model's image of the one recipe has its own tag."""
    parts: list[bytes | str] = [DOCKERFILE.read_bytes()]
    for rel, source in app_files():
        parts += [rel, source.read_bytes()]
    parts += [locked_requirements(kind).read_bytes(), "\n".join(DEBIAN_PACKAGES)]
    return content_tag(f"{REPO_PREFIX}{kind}", *parts, buildargs=build_args(kind, base))


def build(kind: str, base: str | None = None, builder: ImageBuilder | None = None) -> str:
    """Find (by content tag) or build the image of ``kind``; returns its tag."""
    builder = builder or ImageBuilder()
    base = base or local_base(builder)
    return builder.ensure(
        context_tag(kind, base),
        lambda ctx: prepare_context(kind, ctx),
        buildargs=build_args(kind, base),  # the Dockerfile labels it crossaudit.image=modelserver
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m crossaudit.modelserver.images")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a model server image from the local base")
    b.add_argument("kind", choices=KINDS)
    b.add_argument("--base", default=None, help="base image (default: the local crossaudit/base of `make images`)")
    c = sub.add_parser("context", help="only write the build context to a directory")
    c.add_argument("kind", choices=KINDS)
    c.add_argument("dest")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build(args.kind, args.base))
        else:
            print(prepare_context(args.kind, Path(args.dest)))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
