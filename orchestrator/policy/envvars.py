"""``${VAR}`` references in policies: found at validation, expanded only when used.

Values are never printed or stored: errors name the variable, not its content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import ConfigurationError

ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def references(value: Any) -> set[str]:
    """Every variable name referenced anywhere inside ``value``."""
    if isinstance(value, str):
        return set(ENV_RE.findall(value))
    if isinstance(value, Mapping):
        out: set[str] = set()
        for v in value.values():
            out |= references(v)
        return out
    if isinstance(value, list | tuple):
        out = set()
        for v in value:
            out |= references(v)
        return out
    return set()


def expand(value: Any, env: Mapping[str, str]) -> Any:
    """Replace ``${VAR}`` recursively; a missing variable raises ConfigurationError by name."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                raise ConfigurationError(f"environment variable {name} is not set")
            return env[name]

        return ENV_RE.sub(sub, value)
    if isinstance(value, Mapping):
        return {k: expand(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, env) for v in value]
    return value
