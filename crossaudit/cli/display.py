"""How the CLI shows records it reads from a server: ``rich`` tables for lists, JSON for machines,
and every timestamp as ISO-8601 UTC.

The store and the SDK keep timestamps as epoch seconds (``created_at: float``): that is what is
stored and what the gRPC API carries. People read ``2026-11-23T08:00:00Z``, so the CLI converts
the records' timestamp fields when it prints them — in tables and in ``--json`` — and nothing else:
a free-form document inside a record (a webhook payload, a review's params, an audit record's
rules) is printed as stored, even when one of its keys is called ``created_at``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from crossaudit.cli.render import printable

# The records' fields that hold epoch seconds (crossaudit/store/base.py). 0 and None mean "not set".
TIMESTAMP_FIELDS = frozenset(
    {"created_at", "deployed_at", "resolved_at", "delivered_at", "next_attempt_at", "lease_until"}
)
# Piped listings (scripts, grep) keep one item per line: the table may be this wide before rich
# wraps a cell. A terminal uses its own width.
LIST_PIPE_WIDTH = 1_000


def iso_utc(epoch: float | None, *, millis: bool = False) -> str | None:
    """``2026-11-23T08:00:00Z`` (``millis``: ``…08:00:00.123Z``); None for an unset time (None or 0)."""
    if epoch is None or isinstance(epoch, bool) or not isinstance(epoch, int | float) or epoch <= 0:
        return None
    try:
        moment = datetime.fromtimestamp(float(epoch), tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds" if millis else "seconds").replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """A record (dataclass, pydantic model, enum, tuple …) as JSON data, its timestamp fields as
    ISO-8601 UTC with milliseconds. Only a dataclass's own fields are converted, never the keys of
    a dict it holds."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.name in TIMESTAMP_FIELDS and (item is None or isinstance(item, int | float)):
                out[f.name] = iso_utc(item, millis=True)
            else:
                out[f.name] = jsonable(item)
        return out
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return value.model_dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def print_json(value: Any, file: TextIO | None = None) -> None:
    print(json.dumps(jsonable(value), indent=2, sort_keys=True), file=file or sys.stdout)


def when(epoch: float | None) -> str:
    """A timestamp for a table cell: ISO-8601 UTC to the second, ``-`` when unset."""
    return iso_utc(epoch) or "-"


def list_console(file: TextIO | None = None) -> Console:
    out = file or sys.stdout
    return Console(file=out, width=None if out.isatty() else LIST_PIPE_WIDTH, highlight=False, soft_wrap=False)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a listing: its header and how a record shows in it."""

    header: str
    cell: Callable[[Any], str]
    justify: str = "left"
    key: bool = False  # an id that scripts copy: never wrapped or cut


def print_table(items: Sequence[Any], columns: Iterable[Column], *, what: str, file: TextIO | None = None) -> None:
    """``items`` as one ``rich`` table (or ``no <what>``). Every cell is shown as text with control
    characters escaped: names, URLs and errors come from tenants and receivers, and neither rich
    markup nor terminal escapes in them may take effect."""
    out = list_console(file)
    if not items:
        out.print(f"no {what}")
        return
    cols = list(columns)
    rows = [[printable(c.cell(item)) for c in cols] for item in items]
    table = Table(show_lines=False, expand=False)
    for i, c in enumerate(cols):
        # a key column is as wide as its longest id: a narrow terminal wraps the other columns
        width = max(len(c.header), *(len(r[i]) for r in rows)) if c.key else None
        table.add_column(c.header, justify=c.justify, no_wrap=c.key, min_width=width, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out.print(table)
