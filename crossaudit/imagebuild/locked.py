"""The images' Python packages, exactly as ``uv.lock`` pins them, with hashes.

``uv.lock`` (the repository root) is the one lock of every Python package CrossAudit installs. The
images install from it too, but an installed CrossAudit builds its model-server images with no
repository beside it, so ``make lock`` (``python -m tools.lockfiles``) derives one pip requirements
file per image from the lock and ships it in the package (``locked/*.txt``): each line pins a
version (``name==version``) with every file hash the lock knows, under an environment marker for
the architectures where the package is needed. pip installs them with ``--require-hashes --no-deps``:
no resolution happens at build time, and a file whose hash the lock does not list is refused.

:func:`closure` is the lock walk (roots, their extras, each dependency's marker evaluated for the
image's platform); :func:`render` writes the file; :func:`requirements_file` finds a shipped one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.kernel.errors import ConfigurationError

LOCKED_DIR = Path(__file__).resolve().parent / "locked"
# The images are CPython 3.11 on Linux, built for the host's architecture: these are the ones locked.
MACHINES = ("x86_64", "aarch64")
IMAGE_PYTHON = "3.11"
_NAME_NORMALIZE = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """PEP 503's normalized project name (what uv.lock stores)."""
    return _NAME_NORMALIZE.sub("-", name).lower()


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    hashes: tuple[str, ...]  # "sha256:…" of every wheel and the sdist the lock lists


def image_environment(machine: str) -> dict[str, str]:
    """PEP 508 marker values of an image: CPython 3.11 on Linux on ``machine``."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{IMAGE_PYTHON}.0",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_version": IMAGE_PYTHON,
        "python_full_version": f"{IMAGE_PYTHON}.0",
        "sys_platform": "linux",
        "extra": "",
    }


def _index(lock: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    packages: dict[str, dict[str, Any]] = {}
    for package in lock.get("package", []):
        name = normalize(package["name"])
        if name in packages:
            # A forked resolution (two versions of one package) would need resolution-markers here;
            # the lock is resolved for one platform and Python (pyproject.toml [tool.uv]), so none.
            raise ConfigurationError(f"uv.lock holds {name} twice: forked resolutions are not supported")
        packages[name] = package
    return packages


def _applies(marker: str | None, env: Mapping[str, str]) -> bool:
    if not marker:
        return True
    from packaging.markers import Marker

    return Marker(marker).evaluate(dict(env))


def closure(lock: Mapping[str, Any], roots: Iterable[tuple[str, tuple[str, ...]]],
            env: Mapping[str, str]) -> list[LockedPackage]:
    """Every package the ``roots`` (name, extras) need under ``env``, sorted by name."""
    index = _index(lock)
    seen: dict[str, LockedPackage] = {}
    todo = [(normalize(name), tuple(extras)) for name, extras in roots]
    expanded: set[tuple[str, str]] = set()
    while todo:
        name, extras = todo.pop()
        package = index.get(name)
        if package is None:
            raise ConfigurationError(f"{name} is not in uv.lock: add it to pyproject.toml and run `make lock`")
        if name not in seen:
            seen[name] = LockedPackage(name, package["version"], _hashes(package))
        edges: list[dict[str, Any]] = []
        if (name, "") not in expanded:
            expanded.add((name, ""))
            edges += package.get("dependencies", [])
        for extra in extras:
            if (name, extra) not in expanded:
                expanded.add((name, extra))
                edges += package.get("optional-dependencies", {}).get(extra, [])
        for dep in edges:
            if _applies(dep.get("marker"), env):
                todo.append((normalize(dep["name"]), tuple(dep.get("extra", ()))))
    return [seen[name] for name in sorted(seen)]


def _hashes(package: Mapping[str, Any]) -> tuple[str, ...]:
    files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
    hashes = tuple(sorted({f["hash"] for f in files if "hash" in f}))
    if not hashes and "registry" in package.get("source", {}):
        raise ConfigurationError(f"uv.lock has no hash for {package['name']}: run `make lock`")
    return hashes


def render(header: str, per_machine: Mapping[str, list[LockedPackage]]) -> str:
    """A pip requirements file: one pin per package with its hashes; a package needed on only some
    of the machines carries a ``platform_machine`` marker."""
    machines = list(per_machine)
    by_name: dict[str, tuple[LockedPackage, list[str]]] = {}
    for machine, packages in per_machine.items():
        for package in packages:
            known = by_name.setdefault(package.name, (package, []))
            if known[0] != package:
                raise ConfigurationError(
                    f"{package.name}: two pins for two machines ({known[0].version}, {package.version})")
            known[1].append(machine)
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for name in sorted(by_name):
        package, on = by_name[name]
        marker = "" if on == machines else " ; " + " or ".join(f"platform_machine == '{m}'" for m in on)
        lines.append(f"{package.name}=={package.version}{marker} \\")
        lines += [f"    --hash={h} \\" for h in package.hashes[:-1]]
        lines.append(f"    --hash={package.hashes[-1]}" if package.hashes else "")
    return "\n".join(lines) + "\n"


def requirements_file(image: str) -> Path:
    """The shipped requirements file of ``image`` (``orchestrator``, ``modelserver-presidio``, …)."""
    path = LOCKED_DIR / f"{image}.txt"
    if not path.is_file():
        raise ConfigurationError(f"no locked requirements for the {image} image ({path.name}): run `make lock`")
    return path


def pinned(path: Path) -> dict[str, str]:
    """name -> version of a requirements file written by :func:`render` (its pins, markers aside)."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if match:
            pins[normalize(match[1])] = match[2]
    return pins
