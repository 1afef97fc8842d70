"""A restart, and a ``kill -9`` under load, keep deployments, evaluators and every answered
decision's audit record."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import CrossAuditError
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import KEYWORDS, UPLOAD_CODE, uses_upload

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LOAD_THREADS = 8
MIN_ANSWERED = 50  # the kill comes once this many decisions were answered (so in-flight ones exist)
MAX_LOAD_SECONDS = 60.0  # bound on waiting for them on a slow machine
MAX_CALLS_PER_THREAD = 5_000  # bounded loop


def audited_ids(data_dir: Path) -> set[str]:
    with sqlite3.connect(data_dir / "data" / "crossaudit.db") as db:
        return {row[0] for row in db.execute("SELECT decision_id FROM decisions")}


def test_restart_keeps_deployments_evaluators_audit_and_reviews(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    srv.start()
    with Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(KEYWORDS, environment="staging")
        ev = c.upload_evaluator("kept", UPLOAD_CODE)
        c.deploy_policy(uses_upload(ev.id))
        ids = [c.evaluate("keywords", "p", r, environment="staging", timeout=10).decision_id for r in ("ok", "bad")]
        reviews = {r.id for r in c.list_reviews(state="open")}
    assert srv.stop() == 0  # graceful

    (srv.policies_dir / "late.yaml").write_text(KEYWORDS.replace("name: keywords", "name: late"))
    srv.start()
    try:
        with Client(srv.address, api_key=key("acme")) as c:
            assert {p.name for p in c.list_policies()} == {"keywords", "uses-upload"}  # no second bootstrap
            assert c.get_policy("keywords", environment="staging").version.version == 1
            assert c.get_evaluator(ev.id, include_code=True).code == UPLOAD_CODE
            assert c.evaluate("uses-upload", "", "block me", timeout=10).rules[0].score == 0.25
            for decision_id in ids:  # feedback needs the decision's audit record
                assert c.submit_feedback(decision_id, "correct")
            assert {r.id for r in c.list_reviews(state="open")} == reviews
    finally:
        srv.stop()


def test_kill_9_under_load_keeps_every_answered_decision(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    srv.start()
    with Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(KEYWORDS)
        ev = c.upload_evaluator("survivor", UPLOAD_CODE)
    answered: list[str] = []
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def load(n: int) -> None:
        with Client(srv.address, api_key=key("acme")) as c:
            for i in range(MAX_CALLS_PER_THREAD):
                if stop.is_set():
                    return
                try:
                    d = c.evaluate("keywords", "p", "bad" if (i + n) % 3 == 0 else "fine", timeout=5)
                except CrossAuditError as e:  # the server was killed under us
                    failures.append(type(e).__name__)
                    return
                with lock:
                    answered.append(d.decision_id)

    threads = [threading.Thread(target=load, args=(n,)) for n in range(LOAD_THREADS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + MAX_LOAD_SECONDS
    while len(answered) <= MIN_ANSWERED and time.monotonic() < deadline and any(t.is_alive() for t in threads):
        time.sleep(0.05)
    srv.kill()  # SIGKILL while requests are in flight
    stop.set()
    for t in threads:
        t.join(30)
    assert len(answered) > MIN_ANSWERED, f"too little load to be meaningful: {len(answered)}"
    with lock:
        missing = set(answered) - audited_ids(tmp_path)
    assert not missing, f"{len(missing)} answered decisions have no audit record"

    srv.start()
    try:
        with Client(srv.address, api_key=key("acme")) as c:
            assert c.get_policy("keywords").version.version == 1
            assert c.get_evaluator(ev.id).name == "survivor"
            assert c.evaluate("keywords", "p", "fine", timeout=10).passed
            assert c.submit_feedback(answered[-1], "correct")
            for decision_id in (answered[0], answered[len(answered) // 2], answered[-1]):
                assert c.get_decision(decision_id).policy == "keywords"
    finally:
        srv.stop()
