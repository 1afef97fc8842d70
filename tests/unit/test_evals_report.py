"""crossaudit.evals runner and report through the real engine (PolicyTester, process sandbox):
measures, gates, wrong rows as test_cases that reproduce the mistakes, compare, HTML."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter

from crossaudit import PolicyTester
from crossaudit.evals.dataset import load_dataset
from crossaudit.evals.report import DECISION, Gate, build_report, cases_of, cases_yaml, compare, html_report
from crossaudit.evals.runner import LLMUsage, run_local
from crossaudit.evals.sweep import Target
from crossaudit.kernel.dsl import TestCase
from crossaudit.kernel.errors import InvalidInputError

POLICY = """\
name: eval-unit
description: one scored rule, rude words lower the score
version: "1.0"
evaluators:
  - name: kw
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            bad = sum(w in ("awful", "hate", "stupid") for w in response.lower().split())
            return {"score": round(max(0.0, 1.0 - 0.3 * bad), 6)}
rules:
  - name: rude
    evaluator: kw
    threshold: 0.5
    action: block
"""
# scores: no rude word 1.0, one 0.7, two 0.4, three 0.1; the rule fails below 0.5
ROWS = [
    {"id": "hello", "response": "hello", "passed": True, "rules": {"rude": "pass"}},  # tn
    {"id": "one_awful", "response": "awful", "rules": {"rude": "fail"}},  # fn (0.7)
    {"id": "two", "response": "awful stupid", "passed": False, "action": "block", "rules": {"rude": "fail"}},  # tp
    {"id": "three", "response": "hate hate hate", "rules": {"rude": "fail"}},  # tp (0.1)
    {"id": "quoted", "response": "awful awful but fine", "passed": True, "rules": {"rude": "pass"}},  # fp (0.4)
    {"id": "nice", "response": "nice day", "rules": {"rude": "pass"}},  # tn
    {"id": "one_stupid", "response": "stupid", "rules": {"rude": "pass"}},  # tn (0.7)
    {"id": "prod-1", "rules": {"rude": "fail"}, "scores": {"rude": 0.2}},  # threshold-only: tp
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("eval") / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p


def run(policy: str, dataset: Path):  # -> EvalRun
    usage = LLMUsage()
    with PolicyTester(policy, sandbox="process", llm_usage=usage) as tester:
        rows = load_dataset(dataset, [r.name for r in tester.policy.rules])
        seen: list[int] = []
        result = run_local(tester, rows, usage=usage, concurrency=2, progress=lambda done, total: seen.append(done))
    assert sorted(seen) == list(range(1, len(ROWS) + 1))
    return result


@pytest.fixture(scope="module")
def run_a(dataset: Path):
    return run(POLICY, dataset)


def test_measures(run_a) -> None:
    r = build_report(run_a, seed=0, target=Target.parse("precision=0.99"))
    rude = r.subjects["rude"]
    c = rude.confusion
    assert (c.tp, c.fp, c.fn, c.tn) == (3, 1, 1, 3)
    assert rude.metrics["precision"].value == pytest.approx(3 / 4)
    assert rude.metrics["recall"].value == pytest.approx(3 / 4)
    assert rude.latency_p50_ms is not None and rude.latency_p95_ms >= rude.latency_p50_ms
    assert rude.cost_usd is None  # no LLM judge
    assert {w.row.id for w in rude.wrong} == {"one_awful", "quoted"}
    # the sweep: precision 0.99 needs the threshold at or below 0.4 (only 0.1, 0.2 and one 0.4 ... fail)
    g = rude.suggestion
    assert g is not None and g.threshold is not None and g.precision == 1.0
    assert g.threshold <= 0.4
    d = r.subjects[DECISION]
    assert d.labelled == 3 and (d.confusion.tp, d.confusion.fp, d.confusion.tn) == (1, 1, 1)
    assert d.action_labelled == 1 and d.action_right == 1
    assert any("threshold-only" in n for n in r.notes)
    doc = r.to_json()
    json.dumps(doc)  # serialisable
    assert doc["rules"]["rude"]["confusion"] == {"tp": 3, "fp": 1, "fn": 1, "tn": 3}


def test_latency_is_one_calls_own_cost_and_says_so(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At --concurrency 4 on 2 cores rows queue behind each other: p50 1.8-3.0 s against 273 ms
    alone, for the same wall time. The per-rule figures come from the rows evaluated one at a
    time (the first LATENCY_ROWS); the rows that ran together are reported apart, labelled."""
    from crossaudit.evals import runner

    usage = LLMUsage()
    with PolicyTester(POLICY, sandbox="process", llm_usage=usage) as tester:
        rows = load_dataset(dataset, [r.name for r in tester.policy.rules])
        live = [r for r in rows if r.response is not None]
        monkeypatch.setattr(runner, "LATENCY_ROWS", 3)  # the 7 rows with text: 3 alone, then 4 together
        together = run_local(tester, rows, usage=usage, concurrency=4)
        one_at_a_time = run_local(tester, rows, usage=usage, concurrency=1)
    assert [o.row.id for o in together.outcomes if o.alone] == [r.id for r in live[:3]]  # first, in order
    r = build_report(together)
    assert (r.latency_rows, r.loaded_rows, r.in_flight) == (3, len(live) - 3, 4)
    rude = r.subjects["rude"]
    assert rude.latency_p50_ms is not None and rude.loaded_p50_ms is not None
    assert "over 3 row(s) evaluated one at a time" in r.latency_text and "4 at a time" in r.latency_text
    doc = r.to_json()
    assert doc["latency"] == {"alone_rows": 3, "loaded_rows": len(live) - 3, "in_flight": 4}
    assert set(doc["rules"]["rude"]["latency_under_load_ms"]) == {"p50", "p95"}
    alone = build_report(one_at_a_time)
    assert (alone.latency_rows, alone.loaded_rows) == (len(live), 0)
    assert "latency_under_load_ms" not in alone.to_json()["rules"]["rude"] and "at a time for" not in alone.latency_text
    assert r.latency_text in html_report(r)


def test_gates(run_a) -> None:
    r = build_report(run_a)
    subjects = [DECISION, "rude"]
    assert "rude precision 0.750 < 0.9" in (Gate.parse("rude=precision:0.9", subjects).failure(r) or "")
    assert Gate.parse("rude=recall:0.75", subjects).failure(r) is None
    with pytest.raises(InvalidInputError, match="'rudeness' is not a rule of the policy"):
        Gate.parse("rudeness=precision:0.9", subjects)
    with pytest.raises(InvalidInputError, match="metric 'auc' is not one of"):
        Gate.parse("rude=auc:0.9", subjects)
    with pytest.raises(InvalidInputError, match="RULE=METRIC:VALUE"):
        Gate.parse("rude>0.9", subjects)


def test_wrong_rows_become_test_cases_that_reproduce_the_mistakes(run_a) -> None:
    r = build_report(run_a)
    doc = yaml.safe_load(cases_yaml(r))
    cases = TypeAdapter(list[TestCase]).validate_python(doc["test_cases"])
    assert {c.name for c in cases} == {"eval_one_awful", "eval_quoted"}
    assert len(cases_of(r)) == 2
    with PolicyTester(POLICY, sandbox="process") as tester:
        results = tester.run_cases(cases)
    # pasted into the policy as it is, each case fails: it is what the policy gets wrong
    assert [(res.ok, res.status.value if res.status else None) for res in results] == [(False, "fail"), (False, "fail")]


def test_compare_with_mcnemar(run_a, dataset: Path) -> None:
    run_b = run(POLICY.replace("threshold: 0.5", "threshold: 0.8"), dataset)
    c = compare(run_a, run_b)
    rude = next(d for d in c.deltas if d.subject == "rude")
    # B (0.8) now catches "one_awful" but also blocks "one_stupid": one row each way
    assert (rude.test.b, rude.test.c, rude.test.method) == (1, 1, "exact")
    assert rude.test.p_value == 1.0
    assert rude.verdict() == "no significant difference"
    assert rude.delta("recall") == pytest.approx(1.0 - 0.75)
    json.dumps(c.to_json())


def test_compare_names_each_side_by_its_file(run_a, dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two versions of one policy often share its name and version (a threshold edited in a copy):
    the comparison used to say "A = eval-unit 1.0, B = eval-unit 1.0". It names the files."""
    from crossaudit.cli.eval import print_comparison
    from crossaudit.evals.report import compare_html

    a = dataclasses.replace(run_a, source="policies/tone.yaml")
    b = dataclasses.replace(run(POLICY.replace("threshold: 0.5", "threshold: 0.8"), dataset), source="tone_v2.yaml")
    c = compare(a, b)
    print_comparison(c)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("A = policies/tone.yaml (eval-unit 1.0), B = tone_v2.yaml (eval-unit 1.0):"), first
    doc = c.to_json()
    assert (doc["a"]["file"], doc["b"]["file"]) == ("policies/tone.yaml", "tone_v2.yaml")
    assert "A = policies/tone.yaml (eval-unit 1.0) with B = tone_v2.yaml (eval-unit 1.0)" in compare_html(c)


def test_html_is_self_contained_and_escaped(run_a) -> None:
    page = html_report(build_report(run_a, target=Target.parse("recall=0.9")))
    assert page.count("data:image/png;base64,") == 2  # the PR and ROC curves of the one scored rule
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "eval_one_awful" in page


def test_llm_cost_per_rule_from_the_calls_tokens(tmp_path: Path) -> None:
    """An LLM judge (a stub provider on loopback speaking OpenAI's API) is priced per rule from the
    tokens each call reported, at the built-in list price of its model."""
    from tests.openai_stub import OpenAIStub

    stub = OpenAIStub(prompt_tokens=1000, completion_tokens=100, score=0.9)
    try:
        policy = f"""
name: judged
description: an LLM judge and a custom rule
version: "1.0"
evaluators:
  - name: judge
    type: llm
    config: {{provider: openai_compatible, model: gpt-4o-mini, base_url: "{stub.url}"}}
  - name: kw
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 0.0 if "awful" in response else 1.0}}
rules:
  - {{name: judged_safe, evaluator: judge, threshold: 0.5, action: warn}}
  - {{name: rude, evaluator: kw, threshold: 0.5, action: flag}}
"""
        p = tmp_path / "d.jsonl"
        p.write_text("".join(json.dumps({"response": t, "rules": {"judged_safe": "pass"}}) + "\n" for t in "abc"))
        usage = LLMUsage()
        with PolicyTester(policy, sandbox="process", llm_usage=usage, env={"OPENAI_API_KEY": "sk-test"}) as tester:
            result = run_local(tester, load_dataset(p, ["judged_safe", "rude"]), usage=usage)
        r = build_report(result)
    finally:
        stub.close()
    assert stub.calls == 3
    per_call = (1000 * 0.15 + 100 * 0.60) / 1_000_000  # gpt-4o-mini: USD 0.15 / 0.60 per million tokens
    assert r.subjects["judged_safe"].cost_usd == pytest.approx(3 * per_call)
    assert r.subjects["rude"].cost_usd is None  # no LLM behind it
    assert r.subjects["judged_safe"].metrics["precision"].value is None  # never fired: undefined
    assert r.to_json()["rules"]["judged_safe"]["llm_cost_usd"] == pytest.approx(3 * per_call)
