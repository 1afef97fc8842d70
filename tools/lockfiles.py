"""Write what is derived from ``uv.lock``: ``python -m tools.lockfiles`` (part of ``make lock``).

- ``tools/uv.requirements.txt``: uv's own pin and hashes, which the Makefile bootstraps uv from
  with the system pip before uv installs everything else (uv is in the lock, through the dev extra).
- ``crossaudit/imagebuild/locked/<image>.txt``: the hashed requirements of each image that installs
  Python packages (the orchestrator: CrossAudit's runtime dependencies; each model server: the
  server's stack and its builtin's), for every architecture the images are built on.

``--check`` writes nothing and exits 1 when a committed file differs from what the lock gives.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from crossaudit.imagebuild.locked import (
    LOCKED_DIR,
    MACHINES,
    closure,
    image_environment,
    normalize,
    render,
)
from crossaudit.kernel.errors import ConfigurationError

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK = REPO_ROOT / "uv.lock"
UV_REQUIREMENTS = REPO_ROOT / "tools" / "uv.requirements.txt"
PROJECT = "crossaudit"
HEADER = "Generated from uv.lock by `make lock` (python -m tools.lockfiles): do not edit.\n"


def _lock() -> dict:
    with LOCK.open("rb") as f:
        return tomllib.load(f)


def _package(lock: dict, name: str) -> dict:
    for package in lock["package"]:
        if normalize(package["name"]) == normalize(name):
            return package
    raise ConfigurationError(f"{name} is not in uv.lock")


def _roots_of(lock: dict, specs: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """(name, extras) of requirement specs, each checked against the version the lock pins."""
    roots = []
    for spec in specs:
        req = Requirement(spec)
        version = _package(lock, req.name)["version"]
        if not req.specifier.contains(version, prereleases=True):
            raise ConfigurationError(f"{spec!r} does not admit uv.lock's {req.name} {version}: align them")
        roots.append((req.name, tuple(sorted(req.extras))))
    return roots


def image_roots(lock: dict) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    from crossaudit.modelserver import images as model_images

    project = _package(lock, PROJECT)
    runtime = [(dep["name"], tuple(dep.get("extra", ()))) for dep in project.get("dependencies", [])]
    roots = {"orchestrator": runtime}
    for kind in model_images.KINDS:
        roots[f"modelserver-{kind}"] = _roots_of(lock, model_images.requirements(kind))
    return roots


def expected_files() -> dict[Path, str]:
    lock = _lock()
    uv_only = closure(lock, [("uv", ())], image_environment("x86_64"))  # uv has no dependencies
    files = {UV_REQUIREMENTS: render(HEADER + "uv installs .venv from uv.lock; the Makefile installs uv from here.\n",
                                     {"any": uv_only})}
    for image, roots in image_roots(lock).items():
        per_machine = {m: closure(lock, roots, image_environment(m)) for m in MACHINES}
        files[LOCKED_DIR / f"{image}.txt"] = render(HEADER + f"The {image} image's Python packages.\n", per_machine)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.lockfiles", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file is not what uv.lock gives")
    args = ap.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        current = path.read_text() if path.is_file() else None
        if current == text:
            continue
        stale.append(path.relative_to(REPO_ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"stale (run `make lock`): {', '.join(map(str, stale))}", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
