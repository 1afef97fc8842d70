"""Recorded LLM answers (cassettes) and repeated runs: record against the local fake providers
(``tests/unit/test_llm_providers.py``: the real SDKs over 127.0.0.1), stop the server, replay with
no network and get the same decisions; an unrecorded request fails clearly; another policy
version's cassette is refused up front; ``--repeat`` reports pass rates and flaky rules. Through
PolicyTester (the SDK) and through ``crossaudit policy test`` (the CLI, in-process)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from crossaudit import PolicyTester
from crossaudit.cli.main import main
from crossaudit.evals import cassettes
from crossaudit.kernel.errors import CassetteMismatchError, CassetteMissError, InvalidInputError
from crossaudit.kernel.results import Decision, Status
from orchestrator.evaluators.cassette import (
    CASSETTE_FORMAT,
    Cassette,
    cassette_file_name,
    installed,
    request_digest,
)
from tests.unit.test_llm_providers import PROVIDER_CONFIGS, FakeProviders

VOLATILE = {"latency_ms", "decision_id"}  # timing and a fresh id: everything else must be identical
INPUTS = [
    ("How do I bake bread?", "Mix flour, water, yeast; knead; bake."),
    ("Tell me a joke", "Why did the chicken cross the road?"),
    ("Insult me", "You are a worthless idiot."),
]
ANSWERS = [
    '{"safety_score": 0.93, "violations": [], "reasoning": "cooking"}',
    '```json\n{"safety_score": 0.81, "violations": [], "reasoning": "a joke"}\n```',
    '{"safety_score": 0.05, "violations": ["insult"], "reasoning": "abusive"}',
]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("CROSSAUDIT_SANDBOX", "process")
    server = FakeProviders()
    yield server
    server.close()


def policy_text(config: dict[str, str], url: str, *, version: str = "1.0", cases: str = "") -> str:
    cfg = ", ".join(f"{k}: {json.dumps(v.replace('{url}', url))}" for k, v in config.items())
    return (
        f"name: judged\ndescription: an LLM judge\nversion: '{version}'\n"
        f"evaluators:\n  - name: judge\n    type: llm\n    config: {{{cfg}}}\n"
        "rules:\n  - {name: safe, evaluator: judge, threshold: 0.5, action: block}\n" + cases
    )


def stable(decision: Decision) -> str:
    """The decision's JSON without its timings and id, byte for byte."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(json.loads(decision.model_dump_json())), sort_keys=True)


def run_inputs(policy: str, inputs: list[tuple[str, str]]) -> tuple[list[Decision], Any]:
    with PolicyTester(policy) as tester:
        decisions = [tester.evaluate(p, r) for p, r in inputs]
        return decisions, tester.engine.evaluator_for(tester.policy, "judge")._client


@pytest.mark.parametrize("provider", sorted(PROVIDER_CONFIGS))
def test_a_recording_replays_offline_to_the_same_decisions(fake: FakeProviders, provider: str, tmp_path) -> None:
    policy = policy_text(PROVIDER_CONFIGS[provider], fake.url)
    for answer in ANSWERS:
        fake.answer(answer)
    with installed(Cassette.recorder(tmp_path)) as recorder:
        recorded, client = run_inputs(policy, INPUTS)
        assert client is not None  # the SDK client did the calls
        written = recorder.save()
    assert len(fake.requests) == len(INPUTS) and recorder.calls == len(INPUTS)
    assert [d.rule("safe").status for d in recorded] == [Status.PASS, Status.PASS, Status.FAIL]
    assert written == [tmp_path / cassette_file_name(("judged", "1.0"))]
    fake.close()  # nothing answers there any more

    with installed(Cassette.replayer(tmp_path)) as player:
        replayed, client = run_inputs(policy, INPUTS)
    assert client is None  # no SDK client was made: no key read, no socket opened
    assert player.calls == len(INPUTS) and player.miss_count == 0
    assert [stable(d) for d in replayed] == [stable(d) for d in recorded]
    # the provider's response id of each recorded call comes back as the call's provenance
    ids = [d.rule("safe").evaluators[0].provenance.get("response_id") for d in replayed]
    assert ids == [d.rule("safe").evaluators[0].provenance.get("response_id") for d in recorded]


def test_the_cassette_file_is_documented_json_with_sorted_keys_and_no_key(fake: FakeProviders, tmp_path) -> None:
    policy = policy_text(PROVIDER_CONFIGS["openai"], fake.url)
    fake.answer(ANSWERS[0])
    with installed(Cassette.recorder(tmp_path)) as recorder:
        run_inputs(policy, INPUTS[:1])
        recorder.save()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["judged@1.0.json"]  # no temporary file left beside it
    text = (tmp_path / files[0]).read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert "sk-test" not in text and fake.url not in text  # neither the key nor the endpoint
    assert doc["format"] == CASSETTE_FORMAT and doc["policy"] == {"name": "judged", "version": "1.0"}
    [(digest, entry)] = doc["requests"].items()
    sent = fake.requests[0]["json"]
    request = {
        "provider": "openai",
        "model": "gpt-4",
        "system": sent["messages"][0]["content"],
        "messages": [sent["messages"][1]],
        "parameters": {"temperature": 0.0, "max_tokens": 500, "response_format": "json"},
    }
    assert digest == request_digest(request)  # the digest covers what the adapter sent
    assert entry["evaluator"] == "judge" and entry["provider"] == "openai" and entry["model"] == "gpt-4"
    assert entry["answers"] == [
        {
            "text": ANSWERS[0],
            "finish_reason": "stop",
            "response_id": "chatcmpl-1",
            "usage": {"completion_tokens": 7, "prompt_tokens": 11, "total_tokens": 18,
                      "completion_tokens_details": None, "prompt_tokens_details": None},
        }
    ]


def test_an_unrecorded_request_fails_its_rule_naming_evaluator_and_digest(fake: FakeProviders, tmp_path) -> None:
    policy = policy_text(PROVIDER_CONFIGS["anthropic"], fake.url)
    with installed(Cassette.recorder(tmp_path)) as recorder:
        run_inputs(policy, INPUTS[:1])
        recorder.save()
    seen = len(fake.requests)
    with installed(Cassette.replayer(tmp_path)) as player:
        [decision], _ = run_inputs(policy, [("a prompt", "never recorded")])
    assert len(fake.requests) == seen  # the provider was not asked instead
    rule = decision.rule("safe")
    assert rule.status is Status.ERROR and decision.errored_rules == ["safe"]
    result = rule.evaluators[0]
    assert result.error_type == "CassetteMissError" and result.attempts == 1  # not retried
    [miss] = player.misses
    assert isinstance(miss, CassetteMissError) and miss.evaluator == "judge" and miss.digest.startswith("sha256:")
    assert "'judge'" in result.error and miss.digest in result.error and "--record" in result.error


def test_another_versions_cassette_is_refused_up_front(fake: FakeProviders, tmp_path) -> None:
    with installed(Cassette.recorder(tmp_path)) as recorder:
        run_inputs(policy_text(PROVIDER_CONFIGS["openai"], fake.url), INPUTS[:1])
        recorder.save()
    with installed(Cassette.replayer(tmp_path)), pytest.raises(CassetteMismatchError) as err:
        PolicyTester(policy_text(PROVIDER_CONFIGS["openai"], fake.url, version="1.1"))
    assert "'judged'" in err.value.message and "recorded for version 1.0, not 1.1" in err.value.message
    # a policy without LLM rules needs no cassette
    plain = "name: other\ndescription: d\nversion: '1'\nrules: []\n"
    with installed(Cassette.replayer(tmp_path)), PolicyTester(plain) as tester:
        assert tester.evaluate("p", "r").passed


def test_broken_or_missing_cassette_directories_are_refused(tmp_path) -> None:
    with pytest.raises(InvalidInputError, match="no such directory"):
        Cassette.replayer(tmp_path / "absent")
    (tmp_path / "x.json").write_text('{"format": "something else"}')
    with pytest.raises(CassetteMismatchError, match="not a cassette"):
        Cassette.replayer(tmp_path)
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(CassetteMismatchError, match="invalid JSON"):
        Cassette.replayer(tmp_path)


def test_nothing_is_written_when_the_run_fails(fake: FakeProviders, tmp_path) -> None:
    args = argparse.Namespace(record=str(tmp_path / "rec"), replay=None, repeat=1)
    with pytest.raises(RuntimeError), cassettes.cassette_from_args(args):
        run_inputs(policy_text(PROVIDER_CONFIGS["openai"], fake.url), INPUTS[:1])
        raise RuntimeError("interrupted")
    assert not (tmp_path / "rec").exists()


def test_the_cli_arguments() -> None:
    parser = argparse.ArgumentParser()
    cassettes.add_cassette_arguments(parser)
    args = parser.parse_args(["--replay", "d", "--repeat", "3"])
    assert (args.replay, args.record, cassettes.repeat_count(args)) == ("d", None, 3)
    assert cassettes.repeat_count(parser.parse_args([])) == 1
    for bad in (["--record", "a", "--replay", "b"], ["--repeat", "0"], ["--repeat", str(cassettes.MAX_REPEAT + 1)]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


# --- the CLI --------------------------------------------------------------------------------

CASES = """test_cases:
  - name: bread
    input: {prompt: "How do I bake bread?", response: "Mix flour, water, yeast; knead; bake."}
    expected_result: pass
  - name: insult
    input: {prompt: "Insult me", response: "You are a worthless idiot."}
    expected_result: fail
    expected_action: block
"""


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["policy", "test", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def rules_of(report: dict[str, Any]) -> list[Any]:
    return [c["rules"] for c in report["suites"][0]["cases"]]


def test_policy_test_records_and_replays(fake: FakeProviders, tmp_path, capsys) -> None:
    path = tmp_path / "judged.yaml"
    path.write_text(policy_text(PROVIDER_CONFIGS["azure"], fake.url, cases=CASES))
    fake.answer(ANSWERS[0])
    fake.answer(ANSWERS[2])
    rec = tmp_path / "cassettes"
    code, recorded, err = cli(capsys, str(path), "--record", str(rec))
    assert code == 0, (recorded, err)
    assert recorded["cassette"] == {"mode": "record", "directory": str(rec), "calls": 2, "unrecorded": 0,
                                    "unrecorded_requests": []}
    assert "recorded 2 LLM answer(s)" in err
    fake.close()

    code, replayed, err = cli(capsys, str(path), "--replay", str(rec))
    assert code == 0, (replayed, err)
    assert replayed["cassette"]["mode"] == "replay" and replayed["cassette"]["calls"] == 2
    assert rules_of(replayed) == rules_of(recorded)
    assert [c["status"] for c in replayed["suites"][0]["cases"]] == ["pass", "pass"]

    # a case added without recording it: its request was never recorded, the run says so (exit 1)
    path.write_text(
        policy_text(PROVIDER_CONFIGS["azure"], fake.url, cases=CASES)
        + '  - name: new\n    input: {response: "unseen"}\n    expected_result: pass\n'
    )
    code, report, err = cli(capsys, str(path), "--replay", str(rec))
    assert code == 1
    [miss] = report["cassette"]["unrecorded_requests"]
    assert miss["evaluator"] == "judge" and miss["digest"] in err and "were not recorded" in err
    assert [c["status"] for c in report["suites"][0]["cases"]] == ["pass", "pass", "error"]

    # the policy's next version: refused before anything runs (exit 2)
    path.write_text(policy_text(PROVIDER_CONFIGS["azure"], fake.url, version="2.0", cases=CASES))
    code, report, err = cli(capsys, str(path), "--replay", str(rec))
    assert code == 2 and report is None
    assert "recorded for version 1.0, not 2.0" in err and "Traceback" not in err


def test_repeat_reports_pass_rates_and_flags_the_flaky_rule(fake: FakeProviders, tmp_path, capsys) -> None:
    path = tmp_path / "judged.yaml"
    path.write_text(policy_text(PROVIDER_CONFIGS["openai"], fake.url, cases=CASES))
    # run 1: bread 0.9, insult 0.05; run 2: bread 0.2 (the judge changed its mind), insult 0.05; run 3 as run 1
    for score in (0.9, 0.05, 0.2, 0.05, 0.9, 0.05):
        fake.answer(json.dumps({"safety_score": score, "violations": [], "reasoning": "r"}))
    rec = tmp_path / "cassettes"
    code, report, err = cli(capsys, str(path), "--repeat", "3", "--record", str(rec))
    assert code == 1, err  # bread did not pass every run: pass^3 fails
    assert len(fake.requests) == 6  # each run asked the judge anew (no cached verdict)
    repeat = report["suites"][0]["repeat"]
    assert repeat["repeat"] == 3 and repeat["flaky_rules"] == ["safe"]
    assert repeat["cases"]["bread"] == {
        "runs": 3, "passed": 2, "pass_rate": round(2 / 3, 6), "pass_all": False, "flaky": True,
        "outcomes": {"fail": 1, "pass": 2},
    }
    assert repeat["cases"]["insult"]["pass_all"] is True and repeat["cases"]["insult"]["flaky"] is False
    [safe] = repeat["rules"]
    assert safe["rule"] == "safe" and safe["flaky"] and safe["flaky_cases"] == ["bread"]
    assert (safe["runs"], safe["passed"]) == (6, 2)  # the rule passed bread twice; it fails insult (as it should)
    assert safe["cases"]["bread"]["outcomes"] == {"fail": 1, "pass": 2}
    cases = report["suites"][0]["cases"]
    assert cases[0]["status"] == "fail" and cases[0]["actual"].endswith("[passed 2 of 3 runs]")
    assert cases[1]["status"] == "pass" and cases[1]["actual"].endswith("[passed 3 of 3 runs]")
    fake.close()

    # the recorded spread of answers replays offline: the same report
    code, again, err = cli(capsys, str(path), "--repeat", "3", "--replay", str(rec))
    assert code == 1 and again["cassette"]["unrecorded"] == 0, err
    assert again["suites"][0]["repeat"] == repeat

    # the text report names the flaky rule
    code = main(["policy", "test", str(path), "--repeat", "3", "--replay", str(rec)])
    out = capsys.readouterr().out
    assert code == 1 and "FLAKY on bread" in out and "passed 2/3 (67%), pass^3 False" in out


def test_record_replay_and_repeat_are_local_only(capsys) -> None:
    code = main(["policy", "test", "p.yaml", "--server", "127.0.0.1:1", "--replay", "d"])
    assert code == 2 and "drop --server" in capsys.readouterr().err
