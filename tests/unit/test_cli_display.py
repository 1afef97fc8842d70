"""How the CLI shows records: ISO-8601 UTC timestamps, integers as integers, and tables whose
cells cannot drive the terminal (crossaudit/cli/display.py)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

from crossaudit.api.models import ReviewInfo
from crossaudit.api.records import DeploymentRecord, OutboxRecord, OutboxState, PolicySummaryRecord
from crossaudit.cli import display
from orchestrator.reviews import ReviewKind, ReviewState

EPOCH = datetime(2026, 11, 23, 8, 0, 0, tzinfo=UTC).timestamp()


def test_iso_utc() -> None:
    assert display.iso_utc(EPOCH) == "2026-11-23T08:00:00Z"
    assert display.iso_utc(EPOCH + 0.25, millis=True) == "2026-11-23T08:00:00.250Z"
    assert display.iso_utc(int(EPOCH)) == "2026-11-23T08:00:00Z"
    for unset in (None, 0, 0.0, -5.0, True):
        assert display.iso_utc(unset) is None
    assert display.iso_utc(1e300) is None  # out of range: not an error
    assert display.when(None) == "-"


def test_json_shows_record_timestamps_as_iso_and_leaves_documents_alone() -> None:
    review = ReviewInfo(
        id="r1", tenant="acme", decision_id="d1", policy="p", policy_revision=3, environment="production",
        rule="x", kind=ReviewKind.REQUIRE_REVIEW, state=ReviewState.OPEN,
        params={"created_at": 5, "count": 2, "review_due_at": "2026-11-23T10:00:00+00:00"},
        created_at=EPOCH, resolved_at=None,
    )  # fmt: skip
    doc = json.loads(json.dumps(display.jsonable([review])))[0]
    assert doc["created_at"] == "2026-11-23T08:00:00.000Z" and doc["resolved_at"] is None
    assert doc["params"] == {"created_at": 5, "count": 2, "review_due_at": "2026-11-23T10:00:00+00:00"}
    assert doc["policy_revision"] == 3 and isinstance(doc["policy_revision"], int)
    assert doc["kind"] == "require_review" and doc["state"] == "open"

    summary = PolicySummaryRecord("p", 2, (DeploymentRecord("acme", "p", "production", 2, EPOCH),))
    assert display.jsonable(summary)["deployments"][0]["deployed_at"] == "2026-11-23T08:00:00.000Z"

    delivery = OutboxRecord(
        id="m1", tenant="acme", kind="webhook", decision_id="d1", rule="x",
        payload={"url": "https://hooks.example/x", "body": {"lease_until": 7}}, state=OutboxState.DEAD,
        attempts=2, last_status=410, created_at=EPOCH,
    )  # fmt: skip
    doc = display.jsonable(delivery)
    assert doc["next_attempt_at"] is None and doc["lease_until"] is None and doc["delivered_at"] is None
    assert doc["payload"]["body"] == {"lease_until": 7} and doc["attempts"] == 2 and doc["last_status"] == 410


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_tables_show_tenant_text_as_text_one_row_per_line_when_piped() -> None:
    hostile = "[bold red]x[/] \x1b[2J" + "y" * 300
    out = io.StringIO()
    columns = [display.Column("Id", lambda r: "id-" + r.name[-3:], key=True), display.Column("Name", lambda r: r.name)]
    display.print_table([_Named(hostile), _Named("plain")], columns, what="things", file=out)
    text = out.getvalue()
    assert "[bold red]x[/]" in text and "\\x1b[2J" in text and "\x1b" not in text
    rows = [line for line in text.splitlines() if "plain" in line or "yyy" in line]
    assert len(rows) == 2 and "y" * 300 in rows[0]  # neither wrapped nor cut

    empty = io.StringIO()
    display.print_table([], columns, what="things", file=empty)
    assert empty.getvalue() == "no things\n"
