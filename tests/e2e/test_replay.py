"""``policy replay`` through a real server on both stores (docs/replay.md): a lowered threshold flips
exactly the retained decisions it should, an unchanged candidate flips none, decisions without
retained inputs (never retained, erased) are counted as not replayable, another tenant's policy is
NOT_FOUND and its records are never read, an invalid candidate gets located issues; and the CLI's
JSON, HTML (hostile rule names escaped) and exit codes."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import NotFoundError, PermissionDeniedError, PolicyValidationError
from crossaudit.sdk.client import ReplayOptions
from tests.e2e.conftest import TENANT_KEYS, ServerProcess, key, run_cli
from tests.e2e.policies import custom_policy, returns

pytestmark = pytest.mark.e2e

OPERATOR_KEY_ENV = "REPLAY_E2E_OPERATOR_KEY"
# The score is the request's context field "s": each decision's verdict is chosen by the test.
SCORE = returns('{"score": float(context["s"])}')
SECOND_RULE = "tone-check"
HOSTILE_NAME = '<script>alert("policy")</script>'  # policy names are free text; the HTML report escapes them
SECRET = "retained-secret-text"  # in every retained response: never in a log, an error or a report
SCORES = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.35, "e": 0.45, "f": 0.6, "g": 0.9}  # recorded under 0.5


def scored(threshold: float, *, name: str = "scored", retention: str | None = None) -> str:
    settings = {"retention": {"inputs": retention}} if retention else None
    return custom_policy(
        name, SCORE, evaluator="scorer", rules=["quality", SECOND_RULE], threshold=threshold, settings=settings
    )


SERVICE_KEY = "acme-service-key-0123456789abcdef"


def keys_text() -> str:
    return (
        "tenants:\n"
        f"  acme:\n    keys: [{TENANT_KEYS['acme']}, {{key: {SERVICE_KEY}, role: service, name: app}}]\n"
        "    retention: {inputs: 7d}\n"
        f"  globex: [{TENANT_KEYS['globex']}]\n"
    )


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {OPERATOR_KEY_ENV: base64.b64encode(os.urandom(32)).decode()}
    if request.param == "postgresql":
        env["CROSSAUDIT_STORE_URL"] = request.getfixturevalue("postgres_server").database()
    server = ServerProcess(
        tmp_path_factory.mktemp(f"replay-{request.param}"),
        keys_text=keys_text(),
        env=env,
        extra=("--set", f"retention.operator_key_env={OPERATOR_KEY_ENV}"),
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def recorded(srv: ServerProcess) -> dict[str, str]:
    """acme's retained decisions of ``scored`` (label -> decision id), one erased, plus decisions
    of a policy version that retains nothing; globex's own ``scored`` has one decision."""
    with Client(srv.address, api_key=key("acme")) as acme:
        acme.deploy_policy(scored(0.5, retention="off"))
        ids = {"unretained": acme.evaluate("scored", "p", "r", {"s": 0.2}).decision_id}
        acme.deploy_policy(scored(0.5))
        for label, s in SCORES.items():
            ids[label] = acme.evaluate("scored", "p", f"{SECRET} {label}", {"s": s}).decision_id
        ids["erased"] = acme.evaluate("scored", "p", "to be erased", {"s": 0.4}).decision_id
        acme.erase_inputs(decision_id=ids["erased"])
    with Client(srv.address, api_key=key("globex")) as globex:
        globex.deploy_policy(scored(0.5))
        ids["globex"] = globex.evaluate("scored", "p", "r", {"s": 0.2}).decision_id
    return ids


def replay(srv: ServerProcess, candidate: str, tenant: str = "acme", **options: object):
    with Client(srv.address, api_key=key(tenant)) as c:
        return c.replay_policy(candidate, "scored", ReplayOptions(**options))  # type: ignore[arg-type]


def test_a_lowered_threshold_flips_exactly_the_expected_decisions(srv: ServerProcess, recorded: dict[str, str]) -> None:
    seen: list[int] = []
    with Client(srv.address, api_key=key("acme")) as acme:
        r = acme.replay_policy(scored(0.3), "scored", progress=lambda p: seen.append(p.read))
    expected = {recorded[x] for x in ("c", "d", "e")}  # 0.3, 0.35, 0.45: failed at 0.5, pass at 0.3
    assert r.read == len(SCORES) + 2 and r.replayed == len(SCORES)
    assert r.flips == 3 and set(r.changed.samples) == expected
    assert r.fail_to_pass.count == 3 and set(r.fail_to_pass.samples) == expected and r.pass_to_fail.count == 0
    assert set(r.action_changes) == {"block->allow"} and set(r.action_changes["block->allow"].samples) == expected
    assert r.unchanged == len(SCORES) - 3
    quality = r.rules["quality"]
    assert quality.fail_to_pass.count == 3 and quality.change == "same" and quality.score_shifts.count == 0
    second = r.rules[SECOND_RULE]  # stopped by quality's block when recorded, passes now: no flip of its own
    assert second.fail_to_pass.count == second.pass_to_fail.count == 0
    assert r.evaluator_runs == 0  # threshold-only: every verdict was the recorded one
    assert seen and seen[-1] == r.read


def test_an_unchanged_candidate_flips_nothing(srv: ServerProcess, recorded: dict[str, str]) -> None:
    r = replay(srv, scored(0.5))
    assert r.flips == 0 and r.unchanged == r.replayed == len(SCORES)
    assert not r.action_changes and r.evaluator_runs == 0
    assert all(d.pass_to_fail.count == d.fail_to_pass.count == 0 for d in r.rules.values())


def test_decisions_without_retained_inputs_are_counted_never_dropped(
    srv: ServerProcess, recorded: dict[str, str]
) -> None:
    r = replay(srv, scored(0.3))
    assert r.not_replayable["not_retained"].samples == [recorded["unretained"]]
    assert r.not_replayable["erased"].samples == [recorded["erased"]]
    assert r.replayed + r.not_replayable_count == r.read
    assert "retention" in r.hint and "1 decision(s)" in r.hint


def test_a_changed_evaluator_runs_again(srv: ServerProcess, recorded: dict[str, str]) -> None:
    changed = scored(0.5).replace('float(context["s"])', 'min(1.0, float(context["s"]) + 0.2)')
    r = replay(srv, changed)
    assert r.replayed == len(SCORES) and r.evaluator_runs == len(SCORES)  # one call each (two rules share it)
    flipped = {recorded[x] for x in ("c", "d", "e")}  # 0.5, 0.55, 0.65 now pass; 0.1, 0.2 -> 0.3, 0.4 still fail
    assert set(r.fail_to_pass.samples) == flipped and r.rules["quality"].score_shifts.count == len(SCORES)
    assert r.rules["quality"].mean_shift == pytest.approx((0.2 * 6 + 0.1) / 7)
    assert r.rules["quality"].max_shift == pytest.approx(0.2)
    with Client(srv.address, api_key=key("acme")) as acme:  # the live path is untouched by the replay's engine
        assert acme.evaluate("scored", "p", "r", {"s": 0.9}).passed


def test_another_tenants_policy_is_not_found_and_its_records_never_read(
    srv: ServerProcess, recorded: dict[str, str]
) -> None:
    with Client(srv.address, api_key=key("globex")) as globex:
        with pytest.raises(NotFoundError) as err:
            globex.replay_policy(scored(0.3, name="other"), "nowhere")
        r = globex.replay_policy(scored(0.3), "scored")
    assert "nowhere" in err.value.message
    assert r.read == 1 and r.not_replayable["not_retained"].samples == [recorded["globex"]]  # its own only
    assert recorded["a"] not in json.dumps(r.to_json())


def test_an_invalid_candidate_gets_located_issues(srv: ServerProcess, recorded: dict[str, str]) -> None:
    bad = scored(0.5).replace("threshold: 0.5", "threshold: 7", 1)
    with pytest.raises(PolicyValidationError) as err:
        replay(srv, bad)
    assert any("threshold" in str(i) and ":" in str(i) for i in err.value.issues), err.value.issues


def test_the_cli_json_html_and_exit_codes(srv: ServerProcess, recorded: dict[str, str], tmp_path: Path) -> None:
    cand = tmp_path / "candidate.yaml"
    cand.write_text(scored(0.3))
    args = ("policy", "replay", str(cand), "--against", "scored")
    res = run_cli(*args, "--json", server=srv, api_key=key("acme"))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["flips"] == 3 and doc["not_replayable"]["erased"]["count"] == 1
    res = run_cli(*args, "--fail-on-flips", "2", server=srv, api_key=key("acme"))
    assert res.returncode == 1 and "3 decision(s) flipped" in res.stderr and "fail -> pass   3" in res.stdout
    assert run_cli(*args, "--fail-on-flips", "3", server=srv, api_key=key("acme")).returncode == 0
    report = tmp_path / "report.html"
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(scored(0.3, name=HOSTILE_NAME))
    res = run_cli(*args[:2], str(hostile), *args[3:], "--html", str(report), server=srv, api_key=key("acme"))
    assert res.returncode == 0, res.stderr
    page = report.read_text()
    assert HOSTILE_NAME not in page and "&lt;script&gt;alert(&quot;policy&quot;)&lt;/script&gt;" in page
    assert "data:image/png;base64," in page and "<script" not in page
    assert recorded["c"] in page
    bad = tmp_path / "bad.yaml"
    bad.write_text(scored(0.5).replace("threshold: 0.5", "threshold: 7", 1))
    res = run_cli("policy", "replay", str(bad), "--against", "scored", server=srv, api_key=key("acme"))
    assert res.returncode == 2 and "bad.yaml:" in res.stderr and "threshold" in res.stderr
    res = run_cli(*args[:3], "--against", "nowhere", server=srv, api_key=key("acme"))
    assert res.returncode == 2 and "nowhere" in res.stderr
    res = run_cli(*args, "--since", "yesterday-ish", server=srv, api_key=key("acme"))
    assert res.returncode == 2 and "--since" in res.stderr
    assert SECRET not in res.stdout + res.stderr + page


def test_only_admin_keys_replay(srv: ServerProcess, recorded: dict[str, str]) -> None:
    """A service key (an application's) may evaluate but not replay: replay reads retained text."""
    with (
        Client(srv.address, api_key=SERVICE_KEY) as app,
        pytest.raises(PermissionDeniedError, match=r"may not call ReplayService\.Replay"),
    ):
        app.replay_policy(scored(0.3), "scored")


def test_retained_text_never_reaches_the_log(srv: ServerProcess, recorded: dict[str, str]) -> None:
    replay(srv, scored(0.3))
    # a changed evaluator that fails quoting the text it was given: every re-run fails with it
    leaky = scored(0.5).replace('return {"score": float(context["s"])}', "raise ValueError(response)")
    r = replay(srv, leaky)
    assert r.not_replayable["evaluator_failed"].count == r.read - 2 and r.replayed == 0  # all but two unretained
    assert SECRET not in json.dumps(r.to_json())
    assert SECRET not in srv.log.read_text()


def test_the_cli_rerun_llm_asks_first(srv: ServerProcess, recorded: dict[str, str], tmp_path: Path) -> None:
    """``--rerun-llm`` estimates first; with no LLM judge to call again it says so and replays."""
    cand = tmp_path / "candidate.yaml"
    cand.write_text(scored(0.3))
    args = ("policy", "replay", str(cand), "--against", "scored")
    res = run_cli(*args, "--rerun-llm", "--yes", "--json", server=srv, api_key=key("acme"))
    assert res.returncode == 0, res.stderr
    assert "no LLM judge needs calling again" in res.stderr and json.loads(res.stdout)["flips"] == 3
    res = run_cli(*args, "--yes", server=srv, api_key=key("acme"))
    assert res.returncode == 2 and "--rerun-llm" in res.stderr
    res = run_cli(*args, "--json", "--html", str(tmp_path / "r.html"), server=srv, api_key=key("acme"))
    assert res.returncode == 2 and "exclude each other" in res.stderr
