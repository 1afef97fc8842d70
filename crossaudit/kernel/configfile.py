"""Configuration files (the server's, the guard proxy's) and the secret files they name: read by
the policies' hardened YAML reader, capped in size, and refused when others may read a secret."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.kernel.errors import ConfigurationError, PolicyValidationError
from crossaudit.kernel.files import read_capped_text
from crossaudit.kernel.limits import PolicyLimits
from crossaudit.kernel.shell import command
from crossaudit.kernel.yamlsafe import load_yaml

MAX_CONFIG_FILE_BYTES = 1024 * 1024  # a larger configuration file (the server's, the proxy's) is refused unread


# The hardened YAML reader's caps for a configuration file: its size, and as many nodes as a file
# of that size can hold (each takes two bytes at least), so only the size ever refuses one.
CONFIG_YAML_LIMITS = PolicyLimits(max_file_bytes=MAX_CONFIG_FILE_BYTES, max_nodes=MAX_CONFIG_FILE_BYTES // 2)


@dataclass
class ConfigFile:
    path: Path
    data: dict[str, Any]
    positions: dict[tuple[str | int, ...], tuple[int, int]] = dataclasses.field(default_factory=dict)

    def where(self, path: tuple[Any, ...]) -> str:
        p = tuple(path)
        while p:
            if p in self.positions:
                line, col = self.positions[p]
                return f"{self.path}:{line}:{col}"
            p = p[:-1]
        return str(self.path)


def read_yaml_file(path: Path, what: str) -> ConfigFile:
    """A YAML configuration file (the server's, the guard proxy's) whose top level is a mapping,
    read by the policies' hardened reader: at most MAX_CONFIG_FILE_BYTES (a larger one is refused
    unread), safe tags only, no aliases, no duplicate keys, every value's line:col kept. Each
    error is a ConfigurationError naming ``what`` and the file (and line:col where there is one)."""
    text = read_config_text(path, what)
    try:
        data, smap = load_yaml(text, str(path), CONFIG_YAML_LIMITS, allow_empty=True)
    except PolicyValidationError as e:
        first = e.issues[0] if e.issues else None
        where = f":{first.line}:{first.column}" if first is not None and first.line else ""
        message = (first.message if first else str(e)).replace(" in policies", "")  # the policies' reader
        raise ConfigurationError(f"{what} {path}{where}: {message}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigurationError(f"{what} {path}: the top level must be a mapping of keys to values")
    return ConfigFile(path, data, {**smap.values, **smap.keys})


def read_config_text(path: Path, what: str) -> str:
    """A configuration file's text, refused unread past MAX_CONFIG_FILE_BYTES."""
    return read_capped_text(path, MAX_CONFIG_FILE_BYTES, what, ConfigurationError)


def check_private_file(path: Path, what: str) -> None:
    """Refuse a secret file (API keys, TLS private key) that group or others may access."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        raise ConfigurationError(f"{what} {path} not found") from None
    except OSError as e:
        raise ConfigurationError(f"cannot read {what} {path}: {e.strerror}") from None
    if mode & 0o077:
        raise ConfigurationError(
            f"{what} {path} is accessible by group or others (mode {mode & 0o777:04o}); run: "
            + command("chmod", "600", path)
        )
