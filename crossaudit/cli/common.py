"""What every ``crossaudit`` command shares: its exit codes, how a command group is declared, and how
``--since``/``--until`` are read."""

from __future__ import annotations

import argparse
import datetime as dt
import re

from crossaudit.kernel.durations import DURATION_PATTERN, duration_seconds
from crossaudit.kernel.errors import InvalidInputError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2  # success; invalid input or failed checks; usage or internal error


def command_group(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, dest: str
) -> argparse._SubParsersAction:
    """``crossaudit NAME SUBCOMMAND ...``: a command whose subcommand is required (its name in ``dest``);
    returns the group's subparsers."""
    group = subparsers.add_parser(name, help=help)
    subcommands = group.add_subparsers(dest=dest, metavar="SUBCOMMAND")
    subcommands.required = True
    return subcommands


def parse_when(text: str | None, now: float, what: str) -> float | None:
    """Epoch seconds of ``--since``/``--until``: a duration back from ``now`` or an ISO-8601 time
    (a time without zone is UTC)."""
    if text is None or text == "":
        return None
    value = text.strip()
    if re.fullmatch(DURATION_PATTERN, value):
        return now - duration_seconds(value)
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(f"--{what} {text!r}: give a duration such as 7d or 12h, or an ISO time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()
