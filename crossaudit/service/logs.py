"""The service's logs: plain text (default) or one JSON object per line (``--log-format json``).

A JSON line has ``time`` (ISO-8601, UTC), ``level``, ``logger`` and ``message``; a line logged
while a decision is being made also has its ``decision_id``, ``tenant``, ``policy`` and
``request_id``, and, while tracing is on and a span is current, its ``trace_id`` and ``span_id``.
The Evaluate path sets them once per decision in a context variable
(:func:`decision_scope`), which asyncio copies into every task the decision starts, so the
engine's, evaluators' and sandboxes' lines carry them without passing anything down.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from contextvars import ContextVar, Token
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from crossaudit.kernel import tracing

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WORKER_TEXT_FORMAT = "%(asctime)s %(levelname)s [worker %(worker)s] %(name)s: %(message)s"
DECISION_FIELDS = ("decision_id", "tenant", "policy", "request_id")

# (decision_id, tenant, policy, request_id) of the decision the current task works for.
_DECISION: ContextVar[tuple[str, str, str, str] | None] = ContextVar("crossaudit_decision", default=None)


def decision_scope(decision_id: str, tenant: str, policy: str, request_id: str = "") -> Token[Any]:
    """Mark what follows (and the tasks it starts) as this decision's; undo with :func:`end_scope`."""
    return _DECISION.set((decision_id, tenant, policy, request_id))


def end_scope(token: Token[Any]) -> None:
    _DECISION.reset(token)


def current_decision() -> dict[str, str]:
    ctx = _DECISION.get()
    return {} if ctx is None else {k: v for k, v in zip(DECISION_FIELDS, ctx, strict=True) if v}


class DecisionFilter(logging.Filter):
    """Copies the current decision's fields onto each record (a handler filter: every logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _DECISION.get()
        if ctx is not None:
            for name, value in zip(DECISION_FIELDS, ctx, strict=True):
                if value and not hasattr(record, name):
                    setattr(record, name, value)
        if tracing.enabled():  # the span the line was logged in: a log line joins its trace
            ids = tracing.current_ids()
            if ids is not None and not hasattr(record, "trace_id"):
                record.trace_id, record.span_id = ids
        return True


class JsonLineFormatter(JsonFormatter):
    """python-json-logger with the field names above and an ISO-8601 UTC time."""

    def __init__(self) -> None:
        super().__init__(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            json_ensure_ascii=False,
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")


class WorkerFilter(logging.Filter):
    """Marks every line of a worker of ``serve --workers N`` with its index (``worker``)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


def configure_logging(
    level: str = "INFO", fmt: str = "text", stream: Any = None, *, worker: int | None = None
) -> logging.Handler:
    """Replace the root logger's handlers with one that writes ``fmt`` lines to ``stream`` (stderr).
    ``worker``: this process is that worker of ``serve --workers N``; its lines say so."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    text = TEXT_FORMAT if worker is None else WORKER_TEXT_FORMAT
    handler.setFormatter(JsonLineFormatter() if fmt == "json" else logging.Formatter(text))
    handler.addFilter(DecisionFilter())
    if worker is not None:
        handler.addFilter(WorkerFilter(worker))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
