"""Durations as the DSL writes them (``30m``, ``24h``, ``500ms``): the pattern and the seconds.
A module of its own, free of pydantic, so the CLI parses ``--since 30d`` without the DSL's models."""

from __future__ import annotations

import re

DURATION_PATTERN = r"^\s*(\d+(\.\d+)?)\s*(ms|s|m|h|d|w)\s*$"


DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_seconds(text: str) -> float:
    """Seconds of a duration such as ``30m`` or ``24h`` (``DURATION_PATTERN``)."""
    m = re.match(DURATION_PATTERN, text)
    if not m:
        raise ValueError(f"bad duration {text!r}")
    return float(m.group(1)) * DURATION_UNITS[m.group(3)]
