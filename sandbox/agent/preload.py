"""Dependency preloading: the declared dependencies (and, restricted, the whitelist) imported once.

Why in the warm parent: every call child is forked from it, so a call never pays for an import,
and restricted code gets exactly the declared third-party distributions, never the standard
library's or the platform's own packages under a dependency's name.
"""

from __future__ import annotations

import importlib
import sys

from .framing import exc_text
from .restrictions import IMPORT_NAME_RE, SAFE_MODULES

WARM_EXTRA = frozenset({"_strptime"})  # imported lazily by datetime.strptime; preloaded with the whitelist
# This package's own top-level name as it runs: "crossaudit_agent" through launch.py, "crossaudit" under
# ``python -m sandbox.agent``. Its modules hold the guards' tables and libc (ctypes): a
# dependency declared under that name would hand them to restricted code, a full escape.
AGENT_PACKAGE = __name__.partition(".")[0]
# Declared dependencies become importable by restricted code (process backend). Only third-party
# distributions qualify: declaring "os", "ctypes", the agent itself or the platform's own packages
# (which would reach the server's database and sockets through the host interpreter) must not unlock them.
PLATFORM_PACKAGES = frozenset(
    {"crossaudit", "orchestrator", "sandbox", "protos", "RestrictedPython", "grpc", "grpc_tools", "docker",
     "google", "pip", "setuptools", "pkg_resources", "importlib_metadata", "pytest", "_pytest", AGENT_PACKAGE}
)  # fmt: skip


def is_dependency_name(name: str) -> bool:
    root = name.split(".")[0]
    return root not in sys.stdlib_module_names and root not in PLATFORM_PACKAGES


def preload_modules(preload: object, declared: list[str], warnings: list[str], *, restricted: bool) -> None:
    """Import the declared dependencies (and, restricted, the whitelist) once, in the warm parent.

    Appends every valid dependency name to ``declared`` (importable by restricted code even when
    its import fails) and every problem to ``warnings``.
    """
    for name in preload if isinstance(preload, list) else []:
        if not isinstance(name, str) or not IMPORT_NAME_RE.match(name):
            warnings.append(f"ignored preload name {name!r}")
            continue
        if not is_dependency_name(name):
            warnings.append(f"ignored preload {name!r}: the standard library's or the platform's, not a dependency")
            continue
        declared.append(name)  # declared: importable by restricted code even if this import fails
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a dependency failing to import is reported, not fatal
            warnings.append(f"preload {name}: {exc_text(exc)}")
            if not isinstance(exc, Exception):
                raise
    if restricted:
        for name in sorted(SAFE_MODULES | WARM_EXTRA):  # warm the whitelist: calls never pay for imports
            try:
                importlib.import_module(name)
            except Exception as exc:
                warnings.append(f"preload {name}: {exc_text(exc)}")
