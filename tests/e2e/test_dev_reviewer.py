"""A ``--dev`` resolution records the OS user running the server, marked ``(dev)``, through the
console, ``crossaudit review resolve`` and ``Client.resolve_review`` alike (issue 19: it was
"approved by unknown")."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, run_cli
from tests.e2e.console_http import console_url, csrf_of, sign_in
from tests.e2e.policies import KEYWORDS

pytestmark = pytest.mark.e2e

DEV_USER = f"{getpass.getuser()} (dev)"  # the server runs as this test's user


def test_dev_resolutions_record_the_local_user(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path, dev=True)
    srv.start()
    try:
        with Client(srv.address) as c:
            c.deploy_policy(KEYWORDS)
            reviews = [c.evaluate("keywords", "p", "worse", timeout=30).review_ids[0] for _ in range(3)]
            by_cli, by_client, by_console = reviews
            res = run_cli("review", "resolve", by_cli, "--state", "approved", "--json", server=srv)
            assert res.returncode == 0 and json.loads(res.stdout)["reviewer"] == DEV_USER, res.stdout + res.stderr
            assert c.resolve_review(by_client, "rejected", note="no").reviewer == DEV_USER
            decision = next(r.decision_id for r in c.list_reviews(state="open") if r.id == by_console)
            h = sign_in(console_url(srv.start_line), "any-key")
            assert f'id="principal">{DEV_USER}<' in h.get("/queue").text
            token = csrf_of(h, f"/decisions/{decision}")
            r = h.post(f"/reviews/{by_console}/resolve", data={"csrf_token": token, "state": "dismissed"})
            assert r.status_code == 303, r.text
            page = h.get(r.headers["location"]).text
            assert f"dismissed by {DEV_USER}" in page and "by unknown" not in page
            done = {r.id: r.reviewer for r in c.list_reviews(state="any") if r.id in reviews}
        assert done == dict.fromkeys(reviews, DEV_USER)
    finally:
        assert srv.stop() == 0
