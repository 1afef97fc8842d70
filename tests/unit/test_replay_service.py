"""The replay component on both stores with the real engine over counted evaluators (the e2e tests
run the whole server): paging within the named limits, the LLM cost estimate and ``rerun_llm``,
the per-tenant cap; plus the comparison's arithmetic, the report's codec and the CLI's renderers."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from crossaudit.api import convert
from crossaudit.api.replayreport import RecordedDecision, ReplayReport
from crossaudit.cli.common import parse_when
from crossaudit.cli.replay import html_report, summary_lines
from crossaudit.governance.replay import ReplayRequest
from crossaudit.kernel.errors import InvalidInputError, NotFoundError, QuotaExceededError
from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES, cost_usd, estimated_prompt_tokens
from crossaudit.kernel.results import Action, Decision, RuleResult, Status, Verdict
from crossaudit.service.config import RetentionConfig, ServiceLimits
from crossaudit.service.core import CrossAuditService
from crossaudit.service.grants import TenantGrants
from crossaudit.service.tenants import TenantFeedback, UploadedEvaluators
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator

KEY_ENV = "REPLAY_UNIT_OPERATOR_KEY"


class Counted(Evaluator):
    """Scores the request context's ``s``; counts its calls per name."""

    def __init__(self, name: str, kind: str, calls: dict[str, int]) -> None:
        super().__init__(name)
        self.kind = kind
        self.calls = calls

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        self.calls[self.name] = self.calls.get(self.name, 0) + 1
        return Verdict(score=float(inp.context["s"]))


class Factory:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def build(self, spec: Any, policy: Any) -> Evaluator:
        return Counted(spec.name, spec.kind.value, self.calls)


def policy(threshold: float, model: str = "gpt-4o-mini") -> str:
    return f"""
name: judged
description: d
version: "1"
evaluators:
  - name: judge
    type: llm
    config: {{provider: openai, model: {model}, max_tokens: 100, system_prompt: "Rate it"}}
rules:
  - {{name: verdict, evaluator: judge, threshold: {threshold}, action: block}}
"""


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def svc(any_store: Any, factory: Factory, monkeypatch: pytest.MonkeyPatch) -> CrossAuditService:
    monkeypatch.setenv(KEY_ENV, base64.b64encode(os.urandom(32)).decode())

    def engines(tenant: str, uploads: UploadedEvaluators, feedback: TenantFeedback) -> Engine:
        return Engine(factory, scope=tenant, feedback=feedback)

    return CrossAuditService(
        any_store,
        engines,
        limits=ServiceLimits(replay_page_size=3, max_replay_decisions=7, max_concurrent_replays_per_tenant=1),
        grants=TenantGrants(retention={"acme": 86_400.0}),
        retention=RetentionConfig(operator_key_env=KEY_ENV),
    )


async def record(svc: CrossAuditService, scores: list[float]) -> list[str]:
    await svc.deploy_policy("acme", policy(0.5))
    ids = []
    for s in scores:
        out = await svc.evaluate("acme", policy="judged", prompt="p" * 40, response="r" * 40, context={"s": s})
        ids.append(out.decision.decision_id)
    return ids


async def run(svc: CrossAuditService, **kw: Any) -> tuple[list[Any], ReplayReport]:
    items = [item async for item in svc.replay("acme", ReplayRequest(against="judged", **kw))]
    assert isinstance(items[-1], ReplayReport)
    return items[:-1], items[-1]


async def test_pages_within_the_limits_and_reports_more(svc: CrossAuditService, factory: Factory) -> None:
    ids = await record(svc, [0.1 * i for i in range(1, 10)])  # 9 decisions; the cap is 7, pages of 3
    calls = dict(factory.calls)
    steps, r = await run(svc, content=policy(0.25))
    assert [p.read for p in steps] == [3, 6, 7] and r.read == r.replayed == 7 and r.more
    assert factory.calls == calls  # threshold-only: the LLM judge was not called again
    # most recent first: ids[2:] were read; of them 0.3 and 0.4 failed at 0.5 and pass at 0.25
    assert set(r.fail_to_pass.samples) == {ids[2], ids[3]} and r.flips == 2
    steps, r = await run(svc, content=policy(0.25), limit=2)
    assert r.read == 2 and r.more and [p.read for p in steps] == [2]
    _, r = await run(svc, content=policy(0.25), limit=9)  # capped by max_replay_decisions
    assert r.read == 7


async def test_a_changed_llm_judge_is_estimated_then_rerun_only_when_asked(
    svc: CrossAuditService, factory: Factory
) -> None:
    await record(svc, [0.2, 0.8, 0.9])
    calls = dict(factory.calls)
    _, r = await run(svc, content=policy(0.5, model="gpt-4o"))
    assert r.replayed == 0 and r.not_replayable["llm_changed"].count == 3 and factory.calls == calls
    _, est = await run(svc, content=policy(0.5, model="gpt-4o"), estimate_only=True)
    assert est.estimate is not None and est.replayed == 0 and factory.calls == calls
    prompt = estimated_prompt_tokens("Rate it", "p" * 40, "r" * 40)
    assert (est.estimate.calls, est.estimate.decisions) == (3, 3)
    assert est.estimate.prompt_tokens == 3 * prompt and est.estimate.completion_tokens == 300
    assert est.estimate.cost_usd == pytest.approx(3 * cost_usd(DEFAULT_LLM_PRICES["gpt-4o"], prompt, 100))
    _, unpriced = await run(svc, content=policy(0.5, model="house-model"), estimate_only=True)
    assert unpriced.estimate is not None and unpriced.estimate.unpriced_models == ["house-model"]
    _, r = await run(svc, content=policy(0.5, model="gpt-4o"), rerun_llm=True)
    assert r.replayed == 3 and r.evaluator_runs == 3 and factory.calls["judge"] == calls["judge"] + 3
    assert r.flips == 0


async def test_bad_requests_and_the_per_tenant_cap(svc: CrossAuditService) -> None:
    await record(svc, [0.2])
    for bad in ({"limit": -1}, {"since": 10.0, "until": 5.0}, {"content": " "}):
        with pytest.raises(InvalidInputError):
            await run(svc, **{"content": policy(0.5), **bad})
    running = svc.replay("acme", ReplayRequest(content=policy(0.5), against="judged"))
    await anext(running)  # holds the tenant's one slot (max_concurrent_replays_per_tenant=1)
    with pytest.raises(QuotaExceededError, match="max_concurrent_replays_per_tenant"):
        await run(svc, content=policy(0.5))
    await running.aclose()
    await run(svc, content=policy(0.5))  # the slot is free again
    with pytest.raises(NotFoundError):  # acme's policy, asked by globex: as if it existed nowhere
        await anext(svc.replay("globex", ReplayRequest(content=policy(0.5), against="judged")))


def decision(passed: bool, action: Action, rules: dict[str, tuple[bool, float | None]]) -> Decision:
    return Decision(
        policy="p",
        policy_version="1",
        passed=passed,
        action=action,
        rules=[
            RuleResult(rule=n, status=Status.PASS if ok else Status.FAIL, passed=ok, score=sc)
            for n, (ok, sc) in rules.items()
        ],
    )


def recorded(did: str, passed: bool, action: str, rules: dict[str, tuple[bool, float | None]]) -> RecordedDecision:
    listed = [
        {"rule": n, "status": "pass" if ok else "fail", "passed": ok, "score": sc} for n, (ok, sc) in rules.items()
    ]
    return RecordedDecision.of(did, passed, action, listed)


def test_the_comparison_counts_flips_actions_rules_and_shifts() -> None:
    r = ReplayReport(policy="p", candidate="p2", environment="production", max_samples=1)
    r.compare(
        recorded("d1", True, "warn", {"a": (True, 0.6), "gone": (False, 0.1)}),
        decision(False, Action.BLOCK, {"a": (False, 0.4), "new": (False, 0.2)}),
    )
    r.compare(recorded("d2", False, "block", {"a": (False, 0.4)}), decision(True, Action.ALLOW, {"a": (True, 0.4)}))
    r.compare(recorded("d3", True, "allow", {"a": (True, 0.9)}), decision(True, Action.ALLOW, {"a": (True, 0.9)}))
    r.compare(recorded("d4", False, "warn", {"a": (False, 0.3)}), decision(False, Action.BLOCK, {"a": (False, 0.3)}))
    r.unreplayable("d5", "erased")
    assert (r.replayed, r.unchanged, r.flips) == (4, 1, 3)
    assert (r.pass_to_fail.count, r.fail_to_pass.count) == (1, 1)
    assert {k: b.count for k, b in r.action_changes.items()} == {"warn->block": 2, "block->allow": 1}
    assert r.action_changes["warn->block"].samples == ["d1"]  # max_samples=1
    a = r.rules["a"]
    assert (a.pass_to_fail.count, a.fail_to_pass.count, a.score_shifts.count) == (1, 1, 1)
    assert a.mean_shift == pytest.approx(-0.2) and a.max_shift == pytest.approx(0.2)
    assert r.rules["new"].change == "added" and r.rules["new"].pass_to_fail.count == 1
    assert r.rules["gone"].change == "removed" and r.rules["gone"].fail_to_pass.count == 1
    assert r.not_replayable_count == 1 and r.to_json()["not_replayable"] == {"erased": {"count": 1, "samples": ["d5"]}}
    back = convert.replay_report_from_pb(convert.replay_report_to_pb(r).report)
    assert back.to_json() == r.to_json()


def test_the_renderers_escape_what_the_server_sends() -> None:
    hostile = '<img src=x onerror="alert(1)">\x1b[31m'
    r = ReplayReport(policy=hostile, candidate=hostile, environment="production")
    r.compare(
        recorded(hostile, True, "allow", {hostile: (True, 0.9)}), decision(False, Action.BLOCK, {hostile: (False, 0.1)})
    )
    page = html_report(r)
    assert "<img src=x" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "<script" not in page and "data:image/png;base64," in page
    text = "\n".join(summary_lines(r))
    assert "\x1b" not in text and "\\x1b" in text


def test_when_is_a_duration_back_or_an_iso_time() -> None:
    assert parse_when("7d", 1_000_000.0, "since") == 1_000_000.0 - 7 * 86_400
    assert parse_when("2026-01-02T03:04:05", 0, "since") == 1767323045.0  # no zone: UTC
    assert parse_when(None, 0, "until") is None
    with pytest.raises(InvalidInputError, match="--since"):
        parse_when("last tuesday", 0, "since")


class _ReplayingClient:
    """What ``policy replay`` talks to, answering one fixed report."""

    def __init__(self, report: ReplayReport) -> None:
        self.report = report

    def __enter__(self) -> _ReplayingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def replay_policy(self, *args: Any, **kwargs: Any) -> ReplayReport:
        return self.report


def _replay_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, report: ReplayReport, *flags: str
) -> tuple[int, str, str]:
    import contextlib
    import io

    from crossaudit.cli import connect
    from crossaudit.cli.main import main

    monkeypatch.setattr(connect, "client", lambda args: _ReplayingClient(report))
    candidate = tmp_path / "v2.yaml"
    candidate.write_text("name: v2\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["policy", "replay", str(candidate), "--against", "Offline Demo", *flags])
    return code, out.getvalue(), err.getvalue()


def _nothing_replayed() -> ReplayReport:
    """What `make serve` answered before retention was on: every record read, none replayable."""
    r = ReplayReport(policy="Offline Demo", candidate="Offline Demo", environment="production")
    r.read = 4
    for n in range(4):
        r.unreplayable(f"d{n}", "not_retained")
    return r


def test_a_gate_that_replayed_nothing_fails_unless_an_empty_replay_is_allowed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """`--fail-on-flips 0` over 4 records read and 0 replayed checked nothing: exit 1 saying so
    (it exited 0), in words and in --json; `--allow-empty` lets it pass, and only with a gate."""
    import json

    code, out, err = _replay_cli(monkeypatch, tmp_path, _nothing_replayed(), "--fail-on-flips", "0")
    assert code == 1, (out, err)
    assert "4 record(s) read, 0 replayed, 4 not replayable" in out
    assert "gate failed: nothing was replayed" in err and "not_retained 4" in err and "--allow-empty" in err
    code, out, err = _replay_cli(monkeypatch, tmp_path, _nothing_replayed(), "--json", "--fail-on-flips", "0")
    gate = json.loads(out)["gate"]
    assert code == 1 and gate["passed"] is False and "nothing was replayed" in gate["failure"]
    assert gate["fail_on_flips"] == 0 and gate["allow_empty"] is False
    code, out, err = _replay_cli(
        monkeypatch, tmp_path, _nothing_replayed(), "--json", "--fail-on-flips", "0", "--allow-empty"
    )
    assert code == 0 and json.loads(out)["gate"] == {
        "fail_on_flips": 0, "allow_empty": True, "passed": True, "failure": None
    }, err  # fmt: skip
    code, out, _ = _replay_cli(monkeypatch, tmp_path, _nothing_replayed(), "--json")
    assert code == 0 and json.loads(out)["gate"] is None  # no gate asked: a report, not a verdict
    code, _, err = _replay_cli(monkeypatch, tmp_path, _nothing_replayed(), "--allow-empty")
    assert code == 2 and "--fail-on-flips" in err


def test_a_gate_over_replayed_decisions_counts_flips_as_before(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    r = ReplayReport(policy="p", candidate="p", environment="production")
    r.read = 2
    r.compare(recorded("d1", False, "modify", {"a": (False, 0.1)}), decision(True, Action.ALLOW, {"a": (True, 0.1)}))
    r.compare(recorded("d2", True, "allow", {"a": (True, 0.9)}), decision(True, Action.ALLOW, {"a": (True, 0.9)}))
    code, _, err = _replay_cli(monkeypatch, tmp_path, r, "--fail-on-flips", "0")
    assert code == 1 and "gate failed: 1 decision(s) flipped, more than --fail-on-flips 0" in err
    assert _replay_cli(monkeypatch, tmp_path, r, "--fail-on-flips", "1")[0] == 0
    assert _replay_cli(monkeypatch, tmp_path, r, "--fail-on-flips", "1", "--allow-empty")[0] == 0


def test_the_html_report_is_private_like_the_eval_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """replay.html was 0644 beside eval.html's 0600: both carry policy details, both are 0600."""
    import stat

    page = tmp_path / "replay.html"
    page.write_text("an older report")
    page.chmod(0o644)
    old = os.umask(0o022)
    try:
        code, _, err = _replay_cli(monkeypatch, tmp_path, _nothing_replayed(), "--html", str(page))
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and "Replay of" in page.read_text()
