"""``crossaudit eval`` through the real CLI: the demo policy over its hand-labelled dataset with the
process sandbox (JSON, HTML, plots), gates and their exit codes, bad input, ``--compare``, and a
deployed policy evaluated by a real server (``--server``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, key, run_cli

pytestmark = pytest.mark.e2e
CLI_TIMEOUT_S = 300
POLICY = "policies/demo_offline.yaml"
DATASET = "policies/demo_offline.eval.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*args: str, server: ServerProcess | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, server=server, timeout=CLI_TIMEOUT_S)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("eval")
    res = run(
        "eval", POLICY, DATASET, "--json", "--html", str(out / "report.html"), "--plots", str(out / "plots"),
        "--target", "precision=0.9",
    )  # fmt: skip
    return res, out


def test_the_demo_dataset_as_json_html_and_plots(demo: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    res, out = demo
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["policy"] == "Offline Demo" and doc["rows"] == 24 and doc["errors"] == []
    assert set(doc["rules"]) == {"no_profanity", "tone", "hostile_tone_review", "redact_emails"}
    prof = doc["rules"]["no_profanity"]
    # labelled by hand: four plain profanities caught, the spelled-out one missed, none wrongly blocked
    assert prof["confusion"] == {"tp": 4, "fp": 0, "fn": 1, "tn": 10}
    assert prof["metrics"]["precision"]["value"] == 1.0
    assert prof["metrics"]["recall"]["value"] == pytest.approx(0.8)
    low, high = prof["metrics"]["recall"]["ci95"]
    assert low <= 0.8 <= high
    emails = doc["rules"]["redact_emails"]
    assert emails["confusion"]["fn"] == 1 and [w["id"] for w in emails["wrong"]] == ["email_obfuscated"]
    assert emails["latency_ms"]["p50"] > 0 and emails["latency_ms"]["p95"] >= emails["latency_ms"]["p50"]
    assert emails["suggested_threshold"]["target"] == "precision=0.9"
    assert emails["suggested_threshold"]["precision"] >= 0.9
    assert {c["name"] for c in doc["test_cases"]} >= {"eval_profanity_obfuscated", "eval_email_obfuscated"}
    page = (out / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page and "<script" not in page
    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert "redact_emails.pr.png" in plots and "redact_emails.roc.png" in plots
    assert all((out / "plots" / p).read_bytes().startswith(PNG_MAGIC) for p in plots)


def test_a_gate_that_fails_exits_1_with_its_reason(tmp_path: Path) -> None:
    res = run(
        "eval",
        POLICY,
        DATASET,
        "--fail-under",
        "no_profanity=recall:0.95",
        "--fail-under",
        "redact_emails=precision:0.9",
    )
    assert res.returncode == 1, res.stderr
    assert "gate failed: no_profanity recall 0.800 < 0.95" in res.stderr
    assert "redact_emails" not in res.stderr.split("gate failed:", 1)[1]  # that gate held
    assert "no_profanity" in res.stdout and "test_cases:" in res.stdout  # the human report, and cases to paste


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"response": "x", "rules": {"no_profanty": "fail"}}\n{"response": 1, "passed": true}\n')
    html = tmp_path / "r.html"
    res = run("eval", POLICY, str(bad), "--html", str(html))
    assert res.returncode == 2
    assert "bad.jsonl:1: rules.no_profanty: rule 'no_profanty' is not in the policy (did you mean 'no_profanity'?)" in (
        res.stderr
    )
    assert "bad.jsonl:2: response: expected a string" in res.stderr
    assert not html.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = run("eval", POLICY, str(empty))
    assert res.returncode == 2 and "no rows" in res.stderr
    res = run("eval", POLICY, DATASET, "--fail-under", "nope=precision:0.9")
    assert res.returncode == 2 and "'nope' is not a rule of the policy" in res.stderr
    res = run("eval", POLICY)
    assert res.returncode == 2 and "give POLICY DATASET" in res.stderr


def test_compare_two_versions(tmp_path: Path) -> None:
    v2 = tmp_path / "v2.yaml"
    # v2 also redacts "name at domain dot tld": it catches the obfuscated address
    text = Path(POLICY).read_text()
    text = text.replace(
        'for m in re.finditer(r"[\\w.+-]+@[\\w-]+\\.[\\w.]+", response)',
        'for m in re.finditer(r"[\\w.+-]+(?:@| at )[\\w-]+(?:\\.| dot )[\\w.]+", response)',
    ).replace('version: "1.0.0"', 'version: "2.0.0"')
    assert "dot" in text
    v2.write_text(text)
    res = run("eval", "--compare", POLICY, str(v2), DATASET, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    emails = doc["subjects"]["redact_emails"]
    assert emails["delta"]["recall"] == pytest.approx(0.25)
    assert emails["mcnemar"]["b_only_right"] == 1 and emails["mcnemar"]["a_only_right"] == 0
    assert emails["mcnemar"]["method"] == "exact" and emails["mcnemar"]["p_value"] == 1.0
    assert emails["verdict"] == "no significant difference"  # one row is no evidence
    assert (doc["a"]["file"], doc["b"]["file"]) == (POLICY, str(v2))  # the files tell the sides apart


def test_a_deployed_policy_through_a_server(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "srv") as server:
        with Client(server.address, api_key=key("globex")) as c:
            c.deploy_policy(Path(POLICY))
        res = run(
            "eval", "--server", POLICY, DATASET, "--json", "--fail-under", "no_profanity=precision:0.9", server=server
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["where"] == f"server {server.address}"
        prof = doc["rules"]["no_profanity"]
        c = prof["confusion"]
        # a row whose evaluator timed out on a busy machine is unjudged (counted), never a verdict
        assert prof["labelled"] == 15 and sum(c.values()) + prof["unjudged"] == 15
        assert c["fp"] == 0 and c["fn"] == 1
        if prof["unjudged"] == 0:
            assert c == {"tp": 4, "fp": 0, "fn": 1, "tn": 10}
        res = run("eval", "--server", "no-such-policy", DATASET, server=server)
        assert res.returncode == 2 and "policy 'no-such-policy' is not deployed" in res.stderr


AGENTS_POLICY = "policies/agents/agents.yaml"
AGENTS_DATASET = "policies/agents/agents.eval.jsonl"
AGENTS_CONFUSION = {  # docs/agents.md: each rule's misses and false alarms in the labelled rows
    "no_destructive_tools": {"tp": 2, "fp": 0, "fn": 1, "tn": 3},
    "redact_emails_in_arguments": {"tp": 2, "fp": 0, "fn": 1, "tn": 2},
    "no_injected_tool_results": {"tp": 2, "fp": 1, "fn": 1, "tn": 2},
}


def test_tool_call_and_tool_result_rows_in_process_and_through_a_server(tmp_path: Path) -> None:
    """The agents dataset labels tool calls and tool results: each row evaluated at its stage,
    in this process (PolicyTester) and by a server (Client), with the same measures; a hostile
    tool row is exit 2 with its line, nothing evaluated."""
    res = run("eval", AGENTS_POLICY, AGENTS_DATASET, "--json")
    assert res.returncode == 0, res.stderr
    local = json.loads(res.stdout)
    assert local["rows"] == 15 and local["errors"] == []
    assert {name: r["confusion"] for name, r in local["rules"].items()} == AGENTS_CONFUSION
    assert {c["input"]["stage"] for c in local["test_cases"]} == {"tool_call", "tool_result"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"stage": "tool_call", "tool": {"name": "send_email", "arguments": "{\\"to\\": "}, "passed": false}\n'
        '{"stage": "tool_call", "tool": {"arguments": {}}, "passed": true}\n'
        '{"stage": "tool_cal", "response": "x", "passed": true}\n'
    )
    res = run("eval", AGENTS_POLICY, str(bad))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "bad.jsonl:1: tool.arguments: not JSON" in res.stderr and "bad.jsonl:2: tool.name:" in res.stderr
    assert "bad.jsonl:3: stage: 'tool_cal' is not one of" in res.stderr
    with ServerProcess(tmp_path / "srv") as server:
        with Client(server.address, api_key=key("globex")) as c:
            c.deploy_policy(Path(AGENTS_POLICY))
        res = run("eval", "--server", AGENTS_POLICY, AGENTS_DATASET, "--json", server=server)
        assert res.returncode == 0, res.stderr
        remote = json.loads(res.stdout)
    assert remote["where"] == f"server {server.address}" and remote["errors"] == []
    assert {name: r["confusion"] for name, r in remote["rules"].items()} == AGENTS_CONFUSION
    assert remote["decision"]["confusion"] == local["decision"]["confusion"]
