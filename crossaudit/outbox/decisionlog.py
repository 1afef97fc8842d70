"""The decision log: every audit record pushed to the operator's sinks, in batches, at least once.

In the spirit of OPA's decision logs. The operator turns sinks on (``crossaudit serve
--decision-log-url URL`` and/or ``--decision-log-dir DIR``); each decision then writes one outbox
row per sink in its audit transaction, and the worker ships them in batches:

- HTTP: ``POST`` of a gzip-compressed JSON array of entries (``Content-Encoding: gzip``), with
  ``Authorization: Bearer $CROSSAUDIT_DECISION_LOG_TOKEN`` when that is set. 2xx = delivered;
  anything else is retried with backoff, as webhooks are.
- Files: JSON Lines appended to ``DIR/decisions-YYYY-MM-DD.jsonl`` (UTC day of the decision),
  flushed and fsynced before the rows are marked delivered; files are owner-only.

At least once: a crash between the write and the mark sends the batch again, so consumers
deduplicate on ``decision_id``. The entry schema (:func:`entry`) is documented in
``docs/decision-log.md``; ``schema_version`` changes when a field changes meaning.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from crossaudit.api.records import AuditRecord, OutboxRecord
from crossaudit.outbox.attempts import Attempt
from crossaudit.outbox.limits import DeliveryLimits

HTTP_KIND = "decision_log:http"
FILE_KIND = "decision_log:file"
SCHEMA_VERSION = 1
TOKEN_ENV = "CROSSAUDIT_DECISION_LOG_TOKEN"
FILE_MODE = 0o600
DIR_MODE = 0o700


def entry(audit: AuditRecord) -> dict[str, Any]:
    """One decision-log entry: the audit record, with an ISO timestamp and the schema version."""
    doc = asdict(audit)
    doc["timestamp"] = dt.datetime.fromtimestamp(audit.created_at, dt.UTC).isoformat(timespec="microseconds")
    doc["schema_version"] = SCHEMA_VERSION
    return {k: v for k, v in doc.items() if v is not None}


class HttpSink:
    kind = HTTP_KIND

    def __init__(self, url: str, limits: DeliveryLimits) -> None:
        self.url = url
        self.limits = limits
        self.client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(limits.request_timeout_s, connect=limits.connect_timeout_s),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(self, batch: Sequence[OutboxRecord]) -> Attempt:
        body = gzip.compress(json.dumps([m.payload for m in batch], separators=(",", ":")).encode())
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        token = os.environ.get(TOKEN_ENV)
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            response = await self.client.post(self.url, content=body, headers=headers)
        except httpx.TimeoutException:
            return Attempt(False, error=f"no answer within {self.limits.request_timeout_s:g}s")
        except (httpx.HTTPError, OSError) as exc:
            return Attempt(False, error=f"{type(exc).__name__}: {exc}")
        attempt = Attempt.from_status(
            response.status_code,
            response.headers.get("retry-after"),
            response.text[:200],
            retry_after_max_s=self.limits.retry_after_max_s,
        )
        # The sink is the operator's: a 4xx is a misconfiguration to fix, not a reason to drop entries.
        return (
            attempt
            if attempt.delivered
            else Attempt(False, attempt.status, attempt.error, False, attempt.retry_after_s)
        )


class FileSink:
    kind = FILE_KIND

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    async def aclose(self) -> None:
        return None

    async def send(self, batch: Sequence[OutboxRecord]) -> Attempt:
        try:
            await asyncio.to_thread(self._write, batch)
        except OSError as exc:
            return Attempt(False, error=f"cannot write the decision log in {self.directory}: {exc.strerror or exc}")
        return Attempt(True)

    def _write(self, batch: Sequence[OutboxRecord]) -> None:
        self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        by_day: dict[str, list[str]] = {}
        for m in sorted(batch, key=lambda m: m.created_at):
            day = dt.datetime.fromtimestamp(m.created_at, dt.UTC).strftime("%Y-%m-%d")
            by_day.setdefault(day, []).append(json.dumps(m.payload, separators=(",", ":")) + "\n")
        for day, lines in by_day.items():
            path = self.directory / f"decisions-{day}.jsonl"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
            try:
                data = memoryview("".join(lines).encode())
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
