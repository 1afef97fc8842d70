"""Dependency specs of custom evaluators: what a declared pip requirement may look like.

A dependency string reaches ``pip`` on the host, so it is validated *before* anything runs: a
distribution name plus an optional PEP 440 version specifier, nothing else (no URLs, paths, pip
options, extras, markers, newlines or shell characters), under count/length caps and the optional
allow/deny lists of :class:`crossaudit.kernel.limits.DependencyLimits`. Validation is shared by
policy loading, uploads and the sandboxes; resolution lives in :mod:`sandbox.deps`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from crossaudit.kernel.errors import DependencyRejectedError
from crossaudit.kernel.limits import DependencyLimits

# A name (PEP 508 "identifier") then optional comma-separated clauses of a PEP 440 operator and a
# version made only of version characters. Checked *before* packaging parses the string, so
# anything packaging would accept beyond this (URLs, extras, markers, ``===`` arbitrary strings)
# is already refused.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_CLAUSE = r"(?:~=|==|!=|<=|>=|<|>)\s*[0-9][0-9A-Za-z.*+!]*"
_DEP_RE = re.compile(rf"^({_NAME})\s*({_CLAUSE}(?:\s*,\s*{_CLAUSE})*)?$")
MAX_SPECIFIER_CLAUSES = 8


@dataclass(frozen=True)
class Dependency:
    """One validated requirement: canonical name plus a (possibly empty) specifier set."""

    name: str
    specifier: str = ""

    def __str__(self) -> str:
        return f"{self.name}{self.specifier}"


def validate_dependencies(deps: Iterable[object], limits: DependencyLimits | None = None) -> tuple[Dependency, ...]:
    """Return the validated, canonical, sorted dependency set or raise :class:`DependencyRejectedError`.

    Every problem is reported (not just the first) so an uploader fixes them in one round.
    """
    limits = limits or DependencyLimits()
    items = list(deps) if not isinstance(deps, str | bytes) else [deps]
    problems: list[str] = []
    if len(items) > limits.max_count:
        raise DependencyRejectedError(f"too many dependencies: {len(items)} > {limits.max_count}")
    allow = {canonicalize_name(n) for n in limits.allowlist}
    deny = {canonicalize_name(n) for n in limits.denylist}
    seen: dict[str, Dependency] = {}
    for raw in items:
        try:
            dep = parse_dependency(raw, limits)
        except DependencyRejectedError as exc:
            problems.append(exc.message)
            continue
        if dep.name in deny:
            problems.append(f"dependency {dep.name!r} is not allowed (denylist)")
        elif allow and dep.name not in allow:
            problems.append(f"dependency {dep.name!r} is not in the allowlist")
        elif dep.name in seen:
            problems.append(f"dependency {dep.name!r} is declared twice")
        else:
            seen[dep.name] = dep
    if problems:
        raise DependencyRejectedError("; ".join(problems))
    return tuple(sorted(seen.values(), key=lambda d: d.name))


def parse_dependency(raw: object, limits: DependencyLimits | None = None) -> Dependency:
    """Validate one dependency string (see the module docstring for what is refused)."""
    limits = limits or DependencyLimits()
    if not isinstance(raw, str):
        raise DependencyRejectedError(f"dependency must be a string, got {type(raw).__name__}")
    shown = raw[:40] + ("..." if len(raw) > 40 else "")
    if not raw.strip():
        raise DependencyRejectedError("empty dependency string")
    if len(raw) > limits.max_length:
        raise DependencyRejectedError(f"dependency {shown!r} is longer than {limits.max_length} characters")
    if not raw.isascii() or not raw.isprintable():
        raise DependencyRejectedError(f"dependency {shown!r} contains control or non-ASCII characters")
    text = raw.strip()
    m = _DEP_RE.match(text)
    if not m:
        raise DependencyRejectedError(
            f"dependency {shown!r} is not a package name with an optional version specifier "
            "(URLs, paths, pip options, extras and markers are not accepted)"
        )
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise DependencyRejectedError(f"dependency {shown!r} is invalid: {exc}") from None
    if req.url or req.extras or req.marker:  # unreachable after the regex; kept as a second lock
        raise DependencyRejectedError(f"dependency {shown!r}: only a name and a version specifier are accepted")
    spec = SpecifierSet(str(req.specifier))
    if len(list(spec)) > MAX_SPECIFIER_CLAUSES:
        raise DependencyRejectedError(f"dependency {shown!r} has more than {MAX_SPECIFIER_CLAUSES} version clauses")
    clauses = sorted(str(s) for s in spec)
    return Dependency(name=canonicalize_name(req.name), specifier=",".join(clauses))
