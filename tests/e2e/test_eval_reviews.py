"""Labels from production through a real server on both stores (``server_store_env``): decisions,
resolved reviews and feedback become ``crossaudit eval-labels`` JSONL rows carrying each rule's
label and recorded scores, with the retained text for a tenant that retains inputs (an operator
key, as tests/e2e/test_retention.py starts it) and without it for one that does not; an auditor
key reads them, a reviewer key may not; the review console's /rules page shows each rule's
measured precision with its count and Wilson interval, "undefined" without a labelled failure."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import AsyncClient, Client
from crossaudit.kernel.errors import PermissionDeniedError
from orchestrator.engine.calibration import wilson
from orchestrator.reviews import ReviewState
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.console_http import console_url, sign_in
from tests.e2e.policies import custom_policy, returns

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "acme-admin-key-0123456789abcdef"
AUDITOR = "acme-auditor-key-0123456789abcdef"
REVIEWER = "acme-rita-key-0123456789abcdef"
GLOBEX = "globex-admin-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {{key: {ADMIN}, role: admin, name: dpo}}
      - {{key: {AUDITOR}, role: auditor, name: eve}}
      - {{key: {REVIEWER}, role: reviewer, name: rita}}
    retention: {{inputs: 7d}}
  globex: {{keys: [{GLOBEX}]}}
"""
# tox scores what the request context says (so each decision's score is known); other always passes
POLICY = custom_policy(
    "labelled",
    returns('{"score": float(context.get("score", 1.0))}'),
    evaluator="scored",
    rules=["tox"],
    action="require_review",
) + "\n".join(
    [
        "  - name: other",
        "    evaluator: scored",
        "    threshold: 0.0",
        "    action: warn",
        "",
    ]
)


@pytest.fixture
def srv(tmp_path: Path, server_store_env: dict[str, str]) -> Iterator[ServerProcess]:
    key = base64.b64encode(os.urandom(32)).decode()
    env = {**server_store_env, "CROSSAUDIT_RETENTION__OPERATOR_KEY_ENV": "TEST_OPERATOR_KEY", "TEST_OPERATOR_KEY": key}
    server = ServerProcess(tmp_path, keys_text=KEYS_FILE, env=env, extra=("--console-port", "0"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _label_traffic(c: Client) -> dict[str, str]:
    """Four decisions of ``labelled``: three fail tox (held for review), one passes; two reviews
    resolved by a person (rejected, approved), one dismissed; feedback on the passing one."""
    c.deploy_policy(POLICY)
    ids = {}
    for name, score in (("bad", 0.2), ("fine", 0.3), ("unsure", 0.4), ("missed", 0.9)):
        d = c.evaluate("labelled", f"prompt {name}", f"response {name}", {"score": score, "who": name}, timeout=30)
        ids[name] = d.decision_id
    reviews = {r.decision_id: r.id for r in c.list_reviews(state=ReviewState.OPEN, policy="labelled")}
    assert set(reviews) == {ids["bad"], ids["fine"], ids["unsure"]}
    c.resolve_review(reviews[ids["bad"]], ReviewState.REJECTED, note="harmful")  # tox was right to fail
    c.resolve_review(reviews[ids["fine"]], ReviewState.APPROVED, note="fine")  # tox should have passed
    c.resolve_review(reviews[ids["unsure"]], ReviewState.DISMISSED)  # no label
    c.submit_feedback(ids["missed"], "false_negative", rule="tox")  # tox should have failed
    c.submit_feedback(ids["missed"], "false_negative", rule="other")  # other too (it always passes)
    return ids


def _rows(path: Path) -> dict[str, dict]:
    return {doc["id"]: doc for doc in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def test_reviews_and_feedback_become_a_dataset_with_text_and_scores(srv: ServerProcess, tmp_path: Path) -> None:
    with Client(srv.address, api_key=ADMIN) as c:
        ids = _label_traffic(c)
    out = tmp_path / "labels.jsonl"
    res = run_cli("eval-labels", "labelled", "--since", "1d", "--out", str(out), server=srv, api_key=ADMIN)
    assert res.returncode == 0, res.stderr
    assert "wrote 3 row(s)" in res.stdout and "4 label(s) (2 review(s), 2 feedback)" in res.stdout, res.stdout
    rows = _rows(out)
    assert set(rows) == {ids["bad"], ids["fine"], ids["missed"]}  # the dismissed review is no label
    bad, fine, missed = rows[ids["bad"]], rows[ids["fine"]], rows[ids["missed"]]
    assert bad["rules"] == {"tox": "fail"} and fine["rules"] == {"tox": "pass"}
    assert missed["rules"] == {"tox": "fail", "other": "fail"}
    assert bad["scores"] == {"tox": 0.2, "other": 0.2} and missed["scores"]["tox"] == 0.9
    # acme retains inputs: the rows carry the retained text and context
    assert (bad["prompt"], bad["response"]) == ("prompt bad", "response bad")
    assert bad["context"] == {"score": 0.2, "who": "bad"}
    assert "passed" not in bad and "action" not in bad  # people labelled rules, not decisions
    # an auditor gets the same labels and scores, never the retained text (admins alone read it)
    audited = tmp_path / "audited.jsonl"
    res = run_cli("eval-labels", "labelled", "--since", "1d", "--out", str(audited), server=srv, api_key=AUDITOR)
    assert res.returncode == 0, res.stderr
    for doc in _rows(audited).values():
        assert "prompt" not in doc and "response" not in doc and doc["scores"]

    # the author's loop: eval the policy file on the production labels directly
    policy_file = tmp_path / "labelled.yaml"
    policy_file.write_text(POLICY)
    kept = tmp_path / "kept.jsonl"
    ev = run_cli(
        "eval", str(policy_file), "--from-reviews", "labelled", "--since", "1d", "--out", str(kept), "--json",
        server=None, env={"CROSSAUDIT_SERVER": srv.address, "CROSSAUDIT_API_KEY": ADMIN},
    )  # fmt: skip
    assert ev.returncode in (0, 1), ev.stderr  # 1: rows the policy gets wrong are listed, not a failure of eval
    report = json.loads(ev.stdout)
    assert _rows(kept) == rows and report["rows"] == 3, report.get("rows")

    # the SDK pages the same labels; a reviewer key may not read them (retained text)
    with Client(srv.address, api_key=AUDITOR) as a:
        first = a.list_labels("labelled", page_size=1)
        assert len(first.labels) == 1 and first.next_page_token
        assert first.labels[0].should_pass is False and first.labels[0].thresholds["tox"] == 0.5

    async def every_label() -> list[str]:  # the AsyncClient pages the same labels to the end
        async with AsyncClient(srv.address, api_key=AUDITOR) as a:
            seen, token = [], ""
            for _ in range(10):
                page = await a.list_labels("labelled", since=time.time() - 86_400, page_token=token, page_size=1)
                seen += [f"{lab.source}:{lab.decision_id}:{lab.rule}" for lab in page.labels]
                token = page.next_page_token
                if not token:
                    return seen
            raise AssertionError("more pages than labels")

    expected = [f"review:{ids['bad']}:tox", f"review:{ids['fine']}:tox", f"feedback:{ids['missed']}:tox"]
    assert sorted(asyncio.run(every_label())) == sorted([*expected, f"feedback:{ids['missed']}:other"])
    with Client(srv.address, api_key=REVIEWER) as r, pytest.raises(PermissionDeniedError, match="ListLabels"):
        r.list_labels("labelled")
    res = run_cli("eval-labels", "labelled", "--out", str(tmp_path / "r.jsonl"), server=srv, api_key=REVIEWER)
    assert res.returncode == 1 and "ListLabels" in res.stderr and not (tmp_path / "r.jsonl").exists()
    res = run_cli("eval-labels", "labelled", "--since", "soon", "--out", str(tmp_path / "x.jsonl"), server=srv)
    assert res.returncode == 2 and "--since" in res.stderr


def test_without_retention_rows_carry_scores_and_no_text(srv: ServerProcess, tmp_path: Path) -> None:
    with Client(srv.address, api_key=GLOBEX) as g:  # globex retains nothing
        ids = _label_traffic(g)
    out = tmp_path / "globex.jsonl"
    res = run_cli("eval-labels", "labelled", "--out", str(out), "--json", server=srv, api_key=GLOBEX)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["rows"], summary["with_text"], summary["skipped"]) == (3, 0, 0)
    rows = _rows(out)
    assert all("prompt" not in r and "response" not in r and "context" not in r for r in rows.values())
    assert rows[ids["fine"]] == {"id": ids["fine"], "rules": {"tox": "pass"}, "scores": {"tox": 0.3, "other": 0.3}}
    # a policy nobody labelled: nothing written, exit 2
    res = run_cli("eval-labels", "nothing-here", "--out", str(tmp_path / "none.jsonl"), server=srv, api_key=GLOBEX)
    assert res.returncode == 2 and "no labels" in res.stderr and not (tmp_path / "none.jsonl").exists()


def test_the_console_shows_each_rule_s_precision_from_reviews(srv: ServerProcess) -> None:
    with Client(srv.address, api_key=ADMIN) as c:
        _label_traffic(c)
    h = sign_in(console_url(srv.start_line), ADMIN)
    page = h.get("/rules", params={"policy": "labelled"})
    assert page.status_code == 200, page.text

    def cells(rule: str) -> dict[str, str]:
        row = re.search(rf'<tr class="rule" data-rule="{rule}">(.*?)</tr>', page.text, re.S)
        assert row, page.text
        return dict(re.findall(r'<td class="([a-z-]+)">(.*?)</td>', row.group(1), re.S))

    tox = cells("tox")  # labelled failures: one rejected (confirmed), one approved: 1 of 2
    low, high = wilson(1, 2)
    assert (tox["precision"], tox["count"], tox["missed"]) == ("50.0%", "2", "1")
    assert tox["interval"] == f"{100 * low:.1f}% – {100 * high:.1f}%"
    other = cells("other")  # only a missed failure: no labelled failure, precision undefined
    assert (other["precision"], other["count"], other["interval"]) == ("undefined", "0", "undefined")
    assert h.get("/rules", params={"policy": "nothing-here"}).text.count('id="no-labels"') == 1
