"""Shadow deployments and canaries through a real server on both stores (docs/rollout.md): a
shadow never changes an answer or fires an action and its report shows exactly the expected
flips; a canary is sticky, answers with the candidate's revision, and one that errors is rolled
back (history entry + signed webhook) while the active version answers; state survives a
restart; another tenant's candidate is NOT_FOUND."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import CandidateStateError, NotFoundError
from crossaudit.outbox import signing
from tests.e2e.conftest import ServerProcess, key, run_cli
from tests.e2e.console_http import console_url, sign_in
from tests.e2e.policies import custom_policy, returns, webhook_policy
from tests.webhook_receiver import Receiver, loopback_grant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SIGNING_SECRET = "whsec_" + "c2lnbmluZy1zZWNyZXQtZm9yLXRlc3Rz"
WAIT_S = 60.0  # bound on waiting for the shadow workers, a canary's recount or a delivery
FLAGS_BAD_OR_MEH = returns('{"score": 0.0 if ("bad" in response or "meh" in response) else 1.0}')
RESPONSES = ["fine", "a bad answer", "meh, so so", "all good", "meh again", "bad bad"] * 3


def keys_file(receiver_port: int) -> str:
    grant = loopback_grant(f"http://127.0.0.1:{receiver_port}", signing_env="ACME_SIGNING_SECRET")
    return f"""
tenants:
  acme:
    keys: [{key("acme")}]
    webhooks: {grant}
  globex: [{key("globex")}]
"""


def server(tmp: Path, receiver: Receiver, env: dict[str, str], *extra: str) -> ServerProcess:
    return ServerProcess(
        tmp, keys_text=keys_file(receiver.port), env={"ACME_SIGNING_SECRET": SIGNING_SECRET, **env}, extra=extra
    )


def answer(d: Any) -> tuple[Any, ...]:
    """What a caller receives, but for the ids and timings that differ per decision."""
    rules = tuple((r.rule, r.status.value, r.passed, r.score, r.action) for r in d.rules)
    return d.passed, d.action.value, d.policy_revision, rules, tuple(o.rule for o in d.outcomes)


def wait_report(c: Client, name: str, done: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        report = c.shadow_report(name)
        if done(report):
            return report
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {WAIT_S}s: {report}")


def test_shadow_never_changes_an_answer_or_fires_an_action_and_reports_the_flips(
    tmp_path: Path, receiver: Receiver, server_store_env: dict[str, str]
) -> None:
    url = f"{receiver.url}/hook"
    live = webhook_policy("hooks", url)  # 'bad' fails and sends a webhook
    candidate = webhook_policy("hooks", url, code=FLAGS_BAD_OR_MEH)  # 'meh' fails (and would send one) too
    cand_file = tmp_path / "candidate.yaml"
    cand_file.write_text(candidate)
    bad = sum("bad" in r for r in RESPONSES)
    meh = sum("meh" in r for r in RESPONSES)
    console = ("--console-port", "0")
    with (
        server(tmp_path / "srv", receiver, server_store_env, *console) as srv,
        Client(srv.address, api_key=key("acme")) as c,
    ):
        c.deploy_policy(live)
        before = [answer(c.evaluate("hooks", "p", r, timeout=30)) for r in RESPONSES]
        res = run_cli(
            "policy", "deploy", str(cand_file), "--shadow", "--sample", "1.0", server=srv, api_key=key("acme")
        )
        assert res.returncode == 0 and "shadow candidate 'hooks' v2" in res.stdout, res.stderr
        assert c.get_policy("hooks").version.version == 1  # stored, not active
        during = [c.evaluate("hooks", "p", r, timeout=30) for r in RESPONSES]
        assert [answer(d) for d in during] == before  # the same answers, the active revision's
        report = wait_report(c, "hooks", lambda r: r.candidate.evaluated >= len(RESPONSES), "every sample evaluated")
        cand = report.candidate
        assert (cand.state.value, cand.mode.value, cand.version, cand.active_version) == ("running", "shadow", 2, 1)
        assert (cand.evaluated, cand.errors, cand.dropped) == (len(RESPONSES), 0, 0)
        assert (cand.pass_to_fail, cand.fail_to_pass, cand.action_changes) == (meh, 0, meh)
        assert cand.agreed == len(RESPONSES) - meh
        assert report.rule_flips == {"notify": meh}
        meh_ids = {d.decision_id for d, r in zip(during, RESPONSES, strict=True) if "meh" in r}
        assert {s.decision_id for s in report.samples} == meh_ids
        assert all(s.rules[0]["flipped"] and s.live_passed and not s.candidate_passed for s in report.samples)
        # Only the live version's webhooks: one per 'bad' response in each round, none for 'meh'.
        got = receiver.wait_for(2 * bad)
        time.sleep(1.0)  # anything the shadow had sent would be delivered by now
        assert len(receiver.requests) == 2 * bad and len(got) == 2 * bad
        assert all(json.loads(x.body) == {"rule": "notify"} for x in receiver.requests)
        assert len(c.list_deliveries(limit=100)) == 2 * bad
        cli = run_cli("policy", "shadow-report", "hooks", server=srv, api_key=key("acme"))
        assert cli.returncode == 0 and f"pass -> fail: {meh}" in cli.stdout and "rule notify" in cli.stdout, cli.stderr
        check_console(srv, meh, meh_ids)
        # Another tenant's candidate does not exist for globex.
        with Client(srv.address, api_key=key("globex")) as g:
            for call in (g.shadow_report, g.promote, g.discard):
                with pytest.raises(NotFoundError):
                    call("hooks")
        # An invalid candidate is refused with located errors, as a deploy is; nothing starts.
        bad_file = tmp_path / "bad.yaml"
        bad_file.write_text(candidate.replace("threshold: 0.5", "threshold: 7"))
        res = run_cli("policy", "deploy", str(bad_file), "--shadow", server=srv, api_key=key("acme"))
        assert res.returncode == 1 and "bad.yaml:" in res.stderr and "threshold" in res.stderr, res.stderr
    # A restart in the middle of the shadow keeps it running, with its totals.
    with server(tmp_path / "srv", receiver, server_store_env) as srv, Client(srv.address, api_key=key("acme")) as c:
        report = c.shadow_report("hooks")
        assert report.candidate.state.value == "running" and report.candidate.evaluated == len(RESPONSES)
        c.evaluate("hooks", "p", "meh once more", timeout=30)
        report = wait_report(
            c, "hooks", lambda r: r.candidate.evaluated == len(RESPONSES) + 1, "the sample after restart"
        )
        assert report.candidate.pass_to_fail == meh + 1
        promoted = c.promote("hooks")
        assert (promoted.deployment.version, promoted.candidate.state.value) == (2, "promoted")
        assert c.get_policy("hooks").version.version == 2
        assert not c.evaluate("hooks", "p", "meh", timeout=30).passed  # the promoted version answers
        assert [h.kind for h in c.shadow_report("hooks").history][:3] == ["promote", "shadow", "deploy"]
        with pytest.raises(CandidateStateError):
            c.discard("hooks")  # nothing running any more
        assert c.rollback("hooks").deployment.version == 1  # rollback skips the candidate's entries


def check_console(srv: ServerProcess, meh: int, meh_ids: set[str]) -> None:
    """The console's rollout page: the same report, the signed-in tenant's policies only, escaped."""
    h = sign_in(console_url(srv.start_line), key("acme"))
    g = sign_in(console_url(srv.start_line), key("globex"))
    try:
        page = h.get("/rollout", params={"policy": "hooks"})
        assert page.status_code == 200, page.text
        assert f'id="pass-to-fail">{meh}<' in page.text and 'class="rule-flip"><td>notify</td>' in page.text
        assert all(i in page.text for i in meh_ids)
        hostile = h.get("/rollout", params={"policy": "<script>alert(1)</script>"})
        assert hostile.status_code in (400, 404) and "<script>alert(1)" not in hostile.text
        assert g.get("/rollout", params={"policy": "hooks"}).status_code == 404
    finally:
        h.close()
        g.close()


HEALTHY = custom_policy("gate", returns('{"score": 1.0}'), evaluator="ok", rules=["fine"])
HEALTHY_V2 = HEALTHY.replace("one custom evaluator", "one custom evaluator, reworded")
FAILING = custom_policy("gate", returns("1 / 0"), evaluator="ok", rules=["fine"])  # every call errors
USERS = [f"user-{i}" for i in range(40)]


def test_canary_is_sticky_names_its_revision_and_survives_a_restart(
    tmp_path: Path, receiver: Receiver, server_store_env: dict[str, str]
) -> None:
    with server(tmp_path, receiver, server_store_env) as srv, Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(HEALTHY)
        r = c.deploy_policy(HEALTHY_V2, canary=0.5, canary_key="user_id")
        assert r.deployment is None and r.candidate is not None and r.candidate.version == 2
        first = {u: c.evaluate("gate", "p", "r", context={"user_id": u}, timeout=30).policy_revision for u in USERS}
        assert set(first.values()) == {1, 2}  # both versions answer a share
        again = {u: c.evaluate("gate", "p", "x", context={"user_id": u}, timeout=30).policy_revision for u in USERS}
        assert again == first  # sticky per key value
        assert {c.evaluate("gate", "p", "r", timeout=30).policy_revision for _ in range(5)} == {1}  # no key: active
        canary_user = next(u for u, v in first.items() if v == 2)
        d = c.evaluate("gate", "p", "r", context={"user_id": canary_user}, timeout=30)
        assert c.get_decision(d.decision_id).policy_revision == 2  # its audit record names the candidate
    with server(tmp_path, receiver, server_store_env) as srv, Client(srv.address, api_key=key("acme")) as c:
        report = c.shadow_report("gate")
        assert (report.candidate.state.value, report.candidate.mode.value) == ("running", "canary")
        assert report.canary.decisions == sum(v == 2 for v in first.values()) * 2 + 1
        after = {u: c.evaluate("gate", "p", "r", context={"user_id": u}, timeout=30).policy_revision for u in USERS}
        assert after == first
        assert c.discard("gate").state.value == "discarded"
        assert {c.evaluate("gate", "p", "r", context={"user_id": u}, timeout=30).policy_revision for u in USERS} == {1}


def test_a_canary_that_errors_is_rolled_back_with_an_audit_event_and_a_webhook(
    tmp_path: Path, receiver: Receiver, server_store_env: dict[str, str]
) -> None:
    limits = ("--set", "rollout_limits.canary_min_decisions=5")
    with server(tmp_path, receiver, server_store_env, *limits) as srv, Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(HEALTHY)
        with pytest.raises(Exception, match="allowlist"):  # --notify is checked against the tenant's grant
            c.deploy_policy(FAILING, canary=0.5, canary_key="user_id", notify="http://127.0.0.1:9/elsewhere")
        c.deploy_policy(FAILING, canary=0.5, canary_key="user_id", notify=f"{receiver.url}/canary")
        deadline = time.monotonic() + WAIT_S
        revisions: list[int] = []
        while time.monotonic() < deadline and c.shadow_report("gate").candidate.state.value == "running":
            for u in USERS[:10]:
                revisions.append(c.evaluate("gate", "p", "r", context={"user_id": u}, timeout=30).policy_revision)
        report = c.shadow_report("gate")
        assert report.candidate.state.value == "rolled_back", report
        assert "evaluator-error rate" in report.candidate.reason
        assert "rollout_limits.canary_max_error_rate_increase" in report.candidate.reason
        assert report.canary.decisions >= 5 and report.canary.errored == report.canary.decisions
        assert 2 in revisions
        assert report.history[0].kind == "canary_rollback" and report.history[0].version == 2
        # The active version answers everyone now.
        assert {c.evaluate("gate", "p", "r", context={"user_id": u}, timeout=30).policy_revision for u in USERS} == {1}
        assert c.get_policy("gate").version.version == 1
        [hook] = receiver.wait_for(1, answered=200)
        signing.verify(SIGNING_SECRET, hook.headers, hook.body)
        body = json.loads(hook.body)
        assert body["event"] == "canary_rolled_back" and body["policy"] == "gate"
        assert (body["candidate_version"], body["active_version"]) == (2, 1)
        assert body["reason"] == report.candidate.reason
        assert [m.rule for m in c.list_deliveries()] == ["canary_rollback"]


# Each call's score is a fingerprint of that call (a random draw in a 1e-6 wide band): a candidate
# whose score equals the live one reused the live verdict; a call again would have drawn another.
FINGERPRINT = (
    "import random\n\n\ndef evaluate(prompt, response, context):\n"
    "    return {{'score': {base} + random.random() * 1e-6}}\n"
)


def two_evaluators(version: str, *, threshold: float = 0.5, second_base: float = 0.6) -> str:
    """Rules ``first`` and ``second`` over evaluators ``a`` and ``b`` whose scores are fingerprints."""
    a = textwrap.indent(FINGERPRINT.format(base=0.6), " " * 8)
    b = textwrap.indent(FINGERPRINT.format(base=second_base), " " * 8)
    return f"""name: fp
description: fingerprinted scores
version: "{version}"
evaluators:
  - name: a
    type: custom
    config:
      code: |
{a}  - name: b
    type: custom
    config:
      code: |
{b}rules:
  - name: first
    evaluator: a
    threshold: {threshold}
    action: block
  - name: second
    evaluator: b
    threshold: 0.5
    action: block
"""


def test_a_shadow_calls_only_the_evaluators_the_candidate_changed(
    tmp_path: Path, receiver: Receiver, server_store_env: dict[str, str]
) -> None:
    n = 6
    with server(tmp_path / "srv", receiver, server_store_env) as srv, Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(two_evaluators("1"))
        # A threshold-only candidate: every live score (0.6..) fails 0.7 now, and no evaluator is
        # called: each candidate score is the live call's own fingerprint.
        c.deploy_policy(two_evaluators("2", threshold=0.7), shadow=1.0)
        before = [c.evaluate("fp", "p", f"r{i}", timeout=30) for i in range(n)]
        assert all(d.passed for d in before)
        report = wait_report(c, "fp", lambda r: r.candidate.evaluated >= n, "every sample evaluated")
        assert (report.candidate.evaluated, report.candidate.errors, report.candidate.pass_to_fail) == (n, 0, n)
        assert report.rule_flips == {"first": n}
        assert {s.decision_id for s in report.samples} == {d.decision_id for d in before}
        live = {d.decision_id: {r.rule: r.score for r in d.rules} for d in before}
        for s in report.samples:
            first = s.rules[0]
            assert first["rule"] == "first" and first["flipped"] and first["candidate_status"] == "fail"
            assert first["candidate_score"] == first["live_score"] == live[s.decision_id]["first"]
            # 'second' is skipped after 'first' blocks: nothing was called for it either.
            assert s.rules[1]["candidate_status"] == "skipped"
        c.discard("fp")
        # A candidate that changes b's code: b runs (a new draw, failing now), a's verdict is reused.
        c.deploy_policy(two_evaluators("3", second_base=0.1), shadow=1.0)
        during = [c.evaluate("fp", "p", f"s{i}", timeout=30) for i in range(n)]
        assert [d.passed for d in during] == [True] * n  # the active v1 answers
        report = wait_report(c, "fp", lambda r: r.candidate.evaluated >= n, "every sample evaluated")
        assert (report.candidate.evaluated, report.candidate.errors, report.rule_flips) == (n, 0, {"second": n})
        live = {d.decision_id: {r.rule: r.score for r in d.rules} for d in during}
        assert {s.decision_id for s in report.samples} == set(live)
        for s in report.samples:
            first, second = s.rules
            assert first["candidate_score"] == first["live_score"] == live[s.decision_id]["first"]  # reused
            assert second["live_score"] == live[s.decision_id]["second"]
            assert second["candidate_score"] < 0.2 and second["flipped"]  # called again: the new code
