"""Labels from production: the store's label listing (both backends), what each label means, the
service's pages with retained inputs, and the rows and JSONL a dataset is built from."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from crossaudit.api.models import LabelledDecision
from crossaudit.api.records import LabelRecord
from crossaudit.evals.production import read_labels, rows_from_labels, suggested_threshold, write_jsonl
from crossaudit.governance.labels import Labels, labelled, should_pass
from crossaudit.governance.retention import Retention
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.service.config import ServiceLimits
from orchestrator.reviews import ReviewState
from tests.records import audit_record, review_record


@pytest.fixture
def store(any_store):  # both backends (tests/conftest.py)
    return any_store


RULES = [
    {"rule": "tox", "status": "fail", "passed": False, "score": 0.2, "threshold": 0.5},
    {"rule": "pii", "status": "pass", "passed": True, "score": 0.9, "threshold": 0.7},
    {"rule": "llm", "status": "error", "passed": False, "score": None, "threshold": 0.5},
]


async def _decision(store, decision_id: str, *, env: str = "production", policy: str = "p", at: float = 0.0):
    rec = audit_record(decision_id, policy=policy, environment=env, rules=RULES, created_at=at or time.time())
    reviews = [review_record(decision_id, id=f"rv-{decision_id}", policy=policy, environment=env, rule="tox")]
    await store.record_decision(rec, reviews)


@pytest.mark.parametrize(
    ("source", "label", "expected"),
    [
        ("review", "approved", True),  # a person let it through: the rule should have passed
        ("review", "rejected", False),  # a person confirmed it: the rule should have failed
        ("review", "dismissed", None),
        ("feedback", "false_positive", True),
        ("feedback", "false_negative", False),
        ("feedback", "correct", None),
    ],
)
def test_what_each_label_means(source: str, label: str, expected: bool | None) -> None:
    assert should_pass(source, label) is expected


def test_a_label_row_carries_the_recorded_scores_thresholds_and_verdicts() -> None:
    rec = LabelRecord("review", "rv1", "d1", "tox", "approved", 20.0, 10.0, RULES)
    row = labelled(rec)
    assert row is not None and row.should_pass is True
    assert row.scores == {"tox": 0.2, "pii": 0.9}  # the errored rule recorded no score
    assert row.thresholds == {"tox": 0.5, "pii": 0.7, "llm": 0.5}
    assert row.recorded == {"tox": False, "pii": True}  # no verdict for the errored rule
    assert row.prompt is None and row.response is None and row.context is None
    assert labelled(LabelRecord("review", "rv2", "d1", "tox", "dismissed", 20.0, 10.0, RULES)) is None


async def test_the_store_lists_people_s_labels_oldest_first_in_pages(store) -> None:
    for i in range(3):
        await _decision(store, f"d{i}")
    await _decision(store, "staging", env="staging")
    await _decision(store, "other", policy="q")
    await store.resolve_review("t1", "rv-d0", ReviewState.APPROVED, reviewer="ann")
    await store.resolve_review("t1", "rv-d1", ReviewState.DISMISSED, reviewer="ann")  # no label
    await store.resolve_review("t1", "rv-staging", ReviewState.REJECTED, reviewer="ann")  # another environment
    await store.resolve_review("t1", "rv-other", ReviewState.REJECTED, reviewer="ann")  # another policy
    await store.add_feedback("t1", "d1", rule="pii", label="false_negative")
    await store.add_feedback("t1", "d2", rule="tox", label="false_positive")
    await store.add_feedback("t1", "d2", rule="tox", label="correct")  # not a label of the rule
    await store.add_feedback("t1", "d2", rule="", label="false_positive")  # the whole decision: no rule
    got = await store.page_labels("t1", policy="p", environment="production", since=None, after=None, limit=10)
    assert [(r.source, r.decision_id, r.rule, r.label) for r in got] == [
        ("review", "d0", "tox", "approved"),
        ("feedback", "d1", "pii", "false_negative"),
        ("feedback", "d2", "tox", "false_positive"),
    ]
    assert got[0].decision_rules == RULES and got[0].labelled_at >= got[0].decided_at
    first = await store.page_labels("t1", policy="p", environment="production", since=None, after=None, limit=2)
    after = (first[-1].labelled_at, first[-1].id)
    rest = await store.page_labels("t1", policy="p", environment="production", since=None, after=after, limit=2)
    assert [r.id for r in first + rest] == [r.id for r in got]
    later = await store.page_labels(
        "t1", policy="p", environment="production", since=got[1].labelled_at, after=None, limit=10
    )
    assert [r.id for r in later] == [r.id for r in got[1:]]
    assert await store.page_labels("t2", policy="p", environment="production", since=None, after=None, limit=10) == []


async def test_an_auto_approval_is_no_one_s_label(store) -> None:
    rec = audit_record("d1", rules=RULES)
    due = review_record("d1", id="rv1", rule="tox", params={"auto_approve_at": "2000-01-01T00:00:00+00:00"})
    await store.record_decision(rec, [due])
    assert await store.auto_approve_due("t1", time.time()) == 1
    assert await store.page_labels("t1", policy="p", environment="production", since=None, after=None, limit=10) == []


async def test_feedback_scores_are_the_rules_recorded_scores_most_recent_first(store) -> None:
    await _decision(store, "d1")
    await store.add_feedback("t1", "d1", rule="tox", label="false_positive")
    await store.add_feedback("t1", "d1", rule="llm", label="false_negative")
    await store.add_feedback("t1", "d1", rule="pii", label="correct")  # not a label
    got = await store.feedback_scores("t1", limit=10)
    assert sorted(got, key=lambda r: r[1]) == [
        ("p", "llm", "false_negative", None),
        ("p", "tox", "false_positive", 0.2),
    ]
    assert len(await store.feedback_scores("t1", limit=1)) == 1


async def test_the_service_pages_labels_and_refuses_a_token_it_did_not_give(store) -> None:
    for i in range(5):
        await _decision(store, f"d{i}")
        await store.resolve_review("t1", f"rv-d{i}", ReviewState.REJECTED, reviewer="ann")
    labels = Labels(store, Retention(store), limits=ServiceLimits(label_page_size=2))
    seen, token = [], ""
    for _ in range(5):
        page = await labels.page("t1", policy="p", page_token=token, page_size=10)  # capped at 2
        assert len(page.labels) <= 2
        seen += [row.decision_id for row in page.labels]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"d{i}" for i in range(5)]
    assert all(row.should_pass is False and row.context is None for row in page.labels)  # nothing retained
    with pytest.raises(InvalidInputError, match="page_token"):
        await labels.page("t1", policy="p", page_token="not-a-token")
    with pytest.raises(InvalidInputError):
        await labels.page("t1", policy="p", page_size=-1)
    precision = await labels.precision("t1", policy="p")
    assert precision["tox"].count == 5 and precision["tox"].precision == 1.0


def _label(
    decision_id: str, rule: str, should: bool, at: float, *, text: bool = False, lid: str = ""
) -> LabelledDecision:
    return LabelledDecision(
        source="review",
        id=lid or f"{decision_id}-{rule}-{at}",
        decision_id=decision_id,
        rule=rule,
        label="approved" if should else "rejected",
        should_pass=should,
        labelled_at=at,
        decided_at=1.0,
        scores={"tox": 0.2, "pii": 0.9, "odd": 7.0},
        thresholds={"tox": 0.5},
        recorded={"tox": False},
        prompt="hi" if text else None,
        response="there" if text else None,
        context={"user": "u1"} if text else None,
    )


def test_rows_merge_a_decision_s_labels_the_later_winning(tmp_path: Path) -> None:
    labels = [
        _label("d1", "tox", True, 1.0),
        _label("d2", "tox", False, 2.0, text=True),
        _label("d1", "tox", False, 3.0, lid="last"),  # a later label on the same rule wins
        _label("d1", "pii", True, 4.0, lid="pii"),
    ]
    rows, skipped = rows_from_labels(labels)
    assert skipped == 0
    d1, d2 = rows
    assert (d1.line, d1.id, d1.rules, d1.prompt, d1.response, d1.context) == (
        1,
        "d1",
        {"tox": False, "pii": True},
        None,
        None,
        {},
    )
    assert d1.scores == {"tox": 0.2, "pii": 0.9}  # a score outside [0, 1] is not a dataset score
    assert d1.source == "review:pii" and d1.passed is None and d1.action is None
    assert (d2.prompt, d2.response, d2.context) == ("hi", "there", {"user": "u1"})
    out = tmp_path / "ds.jsonl"
    write_jsonl(rows, out)
    docs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert docs[0] == {"id": "d1", "rules": {"tox": "fail", "pii": "pass"}, "scores": {"tox": 0.2, "pii": 0.9}}
    assert docs[1]["prompt"] == "hi" and docs[1]["context"] == {"user": "u1"} and docs[1]["rules"] == {"tox": "fail"}
    assert [p.name for p in tmp_path.iterdir()] == ["ds.jsonl"]  # no temporary file left


def test_a_decision_with_no_text_and_no_score_is_left_out() -> None:
    lab = _label("d1", "tox", True, 1.0)
    bare = LabelledDecision(**{**lab.__dict__, "scores": {}})
    assert rows_from_labels([bare]) == ([], 1)


class _Pages:
    """A label source answering fixed pages (what Client.list_labels returns)."""

    def __init__(self, pages: list[list[LabelledDecision]]) -> None:
        self.pages = pages
        self.calls: list[str] = []

    def list_labels(self, policy, environment="", since=None, *, page_token="", page_size=0):
        from crossaudit.api.models import LabelPage

        self.calls.append(page_token)
        i = int(page_token or 0)
        nxt = str(i + 1) if i + 1 < len(self.pages) else ""
        return LabelPage(self.pages[i], nxt)


def test_read_labels_follows_pages_up_to_its_limit() -> None:
    pages = [[_label(f"d{i}{j}", "tox", True, i * 10 + j) for j in range(3)] for i in range(3)]
    src = _Pages(pages)
    found = read_labels(src, "p")
    assert len(found.labels) == 9 and not found.more and src.calls == ["", "1", "2"]
    capped = read_labels(_Pages(pages), "p", limit=4)
    assert len(capped.labels) == 4 and capped.more


def test_the_suggested_threshold_uses_the_rows_scores_and_labels() -> None:
    from crossaudit.evals.dataset import Row

    rows = [
        Row(i, f"r{i}", None, None, {}, None, None, {"tox": s >= 0.5}, {"tox": s}, "review:x")
        for i, s in enumerate([0.1, 0.2, 0.3, 0.6, 0.7, 0.8], start=1)
    ]
    cal = suggested_threshold(rows, "tox", 0.2, max_step=1.0, min_count=3)
    assert cal.target == pytest.approx(0.45) and cal.threshold == pytest.approx(0.45) and cal.objective == "f1"
    assert suggested_threshold(rows, "tox", 0.2, max_step=0.1, min_count=3).threshold == pytest.approx(0.3)
    assert suggested_threshold(rows, "tox", 0.2, max_step=0.1, min_count=7).threshold == 0.2  # too few labels



async def test_a_page_of_retained_texts_stops_within_half_the_answer_limit(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three decisions of a tenant that retains inputs (the real service and engine, sealed with an
    operator key), each with 40 KB of text: with a 100 KB answer limit a page holds one (the first
    always goes), and each next page picks up where the last stopped."""
    import base64
    import os

    from crossaudit.service.config import RetentionConfig
    from crossaudit.service.core import CrossAuditService
    from crossaudit.service.grants import TenantGrants
    from orchestrator.engine.engine import Engine
    from tests.unit.test_replay_service import KEY_ENV, Factory, policy

    monkeypatch.setenv(KEY_ENV, base64.b64encode(os.urandom(32)).decode())
    svc = CrossAuditService(
        store,
        lambda tenant, uploads, feedback: Engine(Factory(), scope=tenant, feedback=feedback),
        limits=ServiceLimits(max_send_message_bytes=100_000),
        grants=TenantGrants(retention={"acme": 86_400.0}),
        retention=RetentionConfig(operator_key_env=KEY_ENV),
    )
    await svc.deploy_policy("acme", policy(0.5))
    for i in range(3):
        out = await svc.evaluate("acme", policy="judged", prompt="p" * 40_000, response=f"r{i}", context={"s": 0.2})
        await svc.submit_feedback("acme", out.decision.decision_id, rule="verdict", label="false_positive")
    seen, token, pages = [], "", 0
    for _ in range(10):
        page = await svc.list_labels("acme", policy="judged", page_token=token)
        pages += 1
        seen += [row.response for row in page.labels]
        assert all(row.prompt == "p" * 40_000 and row.context == {"s": 0.2} for row in page.labels)
        token = page.next_page_token
        if not token:
            break
    assert seen == ["r0", "r1", "r2"] and pages == 3
