"""Container images of the model servers (``images/<kind>/Dockerfile``), built locally.

No image registry is reachable, so an image is ``FROM`` the locally built Python 3.11 base
(``crossaudit/base:*``, see ``images/base/README.md``) plus two COPYs prepared on the host:

- ``site/``: the model stack installed with the host's pip (``pip install --target``; the host
  and the base are both CPython 3.11 on the same architecture), so the base needs no pip;
- ``app/``: the few CrossAudit modules a model server imports (errors, results, crossaudit.modelserver,
  the generated protos).

Models are not baked in: they are mounted read-only at ``/models`` (paths in the Dockerfile's
ENV). The container runs with no network and listens on a unix socket in a mounted directory::

    python -m crossaudit.modelserver.images build presidio      # prints the tag
    docker run --rm --network none --read-only -v SOCKDIR:/run/crossaudit -v MODELS:/models:ro TAG

``ModelServerPool(isolation="docker")`` builds and runs these images itself, hardened
(:mod:`crossaudit.modelserver.containers`). The detoxify image serves ONNX exports on onnxruntime and carries no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.resources import image_dir
from crossaudit.modelserver.builtins import RUNTIMES

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the installed ``crossaudit`` package
# The server's code: the packages the layering contract lets ``crossaudit.modelserver`` import
# (pyproject.toml [tool.importlinter]), copied whole; nothing is picked file by file.
APP_PACKAGES = ("kernel", "v1", "modelserver")
# The builtins with an image: those whose runtime module names its image's packages.
KINDS = tuple(kind for kind, runtime in RUNTIMES.items() if runtime.image_requirements is not None)
# What each image installs (kept in step with pyproject.toml's pins): the server's own stack plus
# the builtin's (``image_requirements`` in crossaudit/modelserver/builtins/<kind>.py).
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "_common": ("grpcio>=1.66,<2", "protobuf>=5.27,<8", "pydantic>=2.7,<3", "cachetools>=5.3,<7"),
    **{kind: RUNTIMES[kind].image_requirements or () for kind in KINDS},
}
# Shared libraries the wheels need that the minimal base lacks (grpcio, onnxruntime and spaCy link
# libstdc++): fetched as Debian packages of the base's suite with the host's apt, unpacked into
# rootfs/ and copied over ``/``.
DEBIAN_PACKAGES = ("libstdc++6",)
PIP_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 1800


def app_files() -> list[tuple[str, Path]]:
    """(path inside the image's app dir, source) of every module the model server may import."""
    files = [("crossaudit/__init__.py", PACKAGE_ROOT / "__init__.py")]
    for package in APP_PACKAGES:
        for source in sorted((PACKAGE_ROOT / package).rglob("*.py")):
            if "__pycache__" not in source.parts:
                files.append((f"crossaudit/{source.relative_to(PACKAGE_ROOT)}", source))
    return files


def prepare_context(kind: str, dest: Path) -> Path:
    """Lay out a build context for ``kind`` in ``dest``: Dockerfile, site/, app/."""
    if kind not in KINDS:
        raise ConfigurationError(f"no model server image for {kind!r} (expected one of {KINDS})")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(image_dir(kind) / "Dockerfile", dest / "Dockerfile")
    for rel, source in app_files():
        target = dest / "app" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    _debian_rootfs(dest / "rootfs")
    site = dest / "site"
    reqs = [*REQUIREMENTS["_common"], *REQUIREMENTS[kind]]
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--target", str(site),
           "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", *reqs]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise ConfigurationError(f"resolving the {kind} image's packages failed: {proc.stderr[-2000:]}")
    return dest


def _debian_rootfs(rootfs: Path) -> None:
    rootfs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ca-debs-") as tmp:
        got = subprocess.run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=tmp, capture_output=True, text=True,
                             timeout=PIP_TIMEOUT_S, check=False)
        if got.returncode != 0:
            raise ConfigurationError(f"apt-get download {' '.join(DEBIAN_PACKAGES)} failed: {got.stderr[-1000:]}")
        for deb in sorted(Path(tmp).glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(rootfs)], check=True, timeout=300)
    for doc in ("usr/share/doc", "usr/share/gcc", "usr/share/gdb"):
        shutil.rmtree(rootfs / doc, ignore_errors=True)


def context_tag(kind: str, base: str) -> str:
    """Tag by content: the Dockerfile, the app sources, the requirements and the base."""
    h = hashlib.sha256(base.encode())
    h.update((image_dir(kind) / "Dockerfile").read_bytes())
    for rel, source in app_files():
        h.update(rel.encode())
        h.update(source.read_bytes())
    h.update("\n".join((*REQUIREMENTS["_common"], *REQUIREMENTS[kind], *DEBIAN_PACKAGES)).encode())
    return f"crossaudit/modelserver-{kind}:{h.hexdigest()[:16]}"


def local_base() -> str:
    """The newest local ``crossaudit/base`` image (built by ``make images``)."""
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "crossaudit/base"],
                         capture_output=True, text=True, timeout=60, check=False)
    tags = [t for t in out.stdout.split() if t and "<none>" not in t]
    if out.returncode != 0 or not tags:
        raise ConfigurationError("no local crossaudit/base image: run `make images` first")
    return tags[0]


def build(kind: str, base: str | None = None) -> str:
    """Build (or reuse) the image of ``kind``; returns its tag."""
    base = base or local_base()
    tag = context_tag(kind, base)
    have = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=60, check=False)
    if have.returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix=f"ca-img-{kind}-") as tmp:
        ctx = prepare_context(kind, Path(tmp))
        proc = subprocess.run(["docker", "build", "--pull=false", "--build-arg", f"BASE={base}", "-t", tag, str(ctx)],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise ConfigurationError(f"docker build of {tag} failed: {proc.stderr[-2000:]}")
    return tag


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m crossaudit.modelserver.images")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a model server image from the local base")
    b.add_argument("kind", choices=KINDS)
    b.add_argument("--base", default=None, help="base image (default: newest local crossaudit/base)")
    c = sub.add_parser("context", help="only write the build context to a directory")
    c.add_argument("kind", choices=KINDS)
    c.add_argument("dest")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(build(args.kind, args.base))
    else:
        print(prepare_context(args.kind, Path(args.dest)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
