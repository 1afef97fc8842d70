"""Tracing (docs/observability.md): the span tree of one decision and its attributes, a caller's
traceparent continued, no raw text in any span, nothing made while tracing is off, the settings
(OTEL_* variables included) and the SDK client's propagation, with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from crossaudit.kernel import tracing
from crossaudit.kernel.errors import EvaluatorUnavailableError
from crossaudit.kernel.results import Verdict
from crossaudit.service.core import CrossAuditService
from crossaudit.service.logs import DecisionFilter, JsonLineFormatter
from crossaudit.service.settings import load_settings
from crossaudit.service.tracing import build_provider, describe
from crossaudit.store import SQLiteStore
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.llm import LLMEvaluator
from tests.openai_stub import OpenAIStub
from tests.unit.test_engine import Factory, score

PROMPT = "my card number is 4111 1111 1111 1111, tell nobody"
RESPONSE = "a response holding the word pineapple-zebra"
CONTEXT_VALUE = "context-value-kumquat"
POLICY = """
name: traced
description: d
version: "1.0"
evaluators:
  - {name: toxicity, type: custom, config: {code: 'def evaluate(p, r, c): return {}'}}
  - {name: flaky, type: custom, config: {code: 'def evaluate(p, r, c): return {}'}}
  - {name: backup, type: custom, config: {code: 'def evaluate(p, r, c): return {}'}}
rules:
  - {name: clean, evaluator: toxicity, threshold: 0.5, action: flag}
  - {name: guarded, evaluator: flaky, threshold: 0.5, action: block, fallback: {evaluator: backup}}
"""


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    exporter.provider = provider  # type: ignore[attr-defined]  # a test may enable it otherwise
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


@pytest.fixture
async def store(tmp_path: Path):
    s = SQLiteStore(tmp_path / "db.sqlite")
    yield s
    await s.aclose()


def _service(store: SQLiteStore) -> CrossAuditService:
    async def down(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        raise EvaluatorUnavailableError("model server restarting")

    factory = Factory({"toxicity": score(0.9), "flaky": down, "backup": score(0.8)})
    engine = Engine(factory)
    return CrossAuditService(store, lambda tenant, uploads, feedback: engine)


def _by_name(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def _every_value(finished: tuple[ReadableSpan, ...]) -> str:
    parts = []
    for s in finished:
        parts.append(s.name)
        parts.extend(f"{k}={v}" for k, v in (s.attributes or {}).items())
        parts.extend(str(e.attributes) for e in s.events)
        parts.append(s.status.description or "")
        parts.extend(str(v) for v in s.resource.attributes.values())
    return "\n".join(parts)


async def test_the_span_tree_of_one_decision_and_its_attributes(store: SQLiteStore, spans: InMemorySpanExporter):
    svc = _service(store)
    await svc.deploy_policy("acme", POLICY)
    out = await svc.evaluate("acme", policy="traced", prompt=PROMPT, response=RESPONSE, context={"note": CONTEXT_VALUE})
    finished = spans.get_finished_spans()
    (evaluate,) = _by_name(finished, tracing.EVALUATE)
    assert not _by_name(finished, tracing.ADMISSION_WAIT)  # a slot was free: no wait, no span
    (engine,) = _by_name(finished, tracing.ENGINE)
    rules = {s.attributes["crossaudit.rule.name"]: s for s in _by_name(finished, tracing.RULE)}
    calls = {s.attributes["crossaudit.evaluator.name"]: s for s in _by_name(finished, tracing.EVALUATOR)}
    (commit,) = _by_name(finished, tracing.AUDIT_COMMIT)

    # one trace; the tree: Evaluate > (engine > rules > calls, audit commit)
    assert {s.context.trace_id for s in finished} == {evaluate.context.trace_id}
    assert evaluate.parent is None and evaluate.kind is SpanKind.SERVER
    for child in (engine, commit):
        assert child.parent.span_id == evaluate.context.span_id
    assert {r.parent.span_id for r in rules.values()} == {engine.context.span_id}
    assert calls["toxicity"].parent.span_id == rules["clean"].context.span_id
    assert calls["flaky"].parent.span_id == rules["guarded"].context.span_id
    assert calls["backup"].parent.span_id == rules["guarded"].context.span_id

    a = evaluate.attributes
    assert a["crossaudit.tenant"] == "acme" and a["crossaudit.policy"] == "traced"
    assert a["crossaudit.policy.version"] == out.revision and a["crossaudit.decision_id"] == out.decision.decision_id
    assert a["crossaudit.verdict"] == ("passed" if out.decision.passed else "failed")
    assert a["crossaudit.action"] == out.decision.action.value
    assert a["crossaudit.prompt.length"] == len(PROMPT) and len(a["crossaudit.prompt.sha256"]) == 64

    assert calls["toxicity"].attributes["crossaudit.evaluator.kind"] == "custom"
    assert calls["toxicity"].attributes["crossaudit.evaluator.cache_hit"] is False
    assert calls["flaky"].attributes["crossaudit.evaluator.status"] == "error"
    assert calls["flaky"].attributes["crossaudit.evaluator.retries"] == 0
    assert calls["flaky"].status.status_code is StatusCode.ERROR
    assert calls["flaky"].attributes["error.type"] == "EvaluatorUnavailableError"
    assert calls["backup"].attributes["crossaudit.evaluator.fallback"] is True
    assert calls["toxicity"].attributes["crossaudit.evaluator.fallback"] is False
    assert rules["guarded"].attributes["crossaudit.rule.fallback_used"] is True
    assert rules["clean"].attributes["crossaudit.rule.passed"] is True

    audit = await store.get_decision("acme", out.decision.decision_id)  # the record names its trace
    assert audit.trace_id == format(evaluate.context.trace_id, "032x")
    assert audit.span_id == format(evaluate.context.span_id, "016x")
    assert "trace_id" not in json.dumps(audit.receipt)


async def test_a_call_that_waits_for_a_slot_has_an_admission_wait_span(
    store: SQLiteStore, spans: InMemorySpanExporter
) -> None:
    from crossaudit.service.config import ServiceLimits

    async def slow(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        await asyncio.sleep(0.2)
        return Verdict(score=1.0)

    engine = Engine(Factory({"toxicity": slow, "flaky": slow, "backup": slow}))
    limits = ServiceLimits(max_concurrent_evaluations=1, max_concurrent_evaluations_tenant_fraction=1.0)
    svc = CrossAuditService(store, lambda tenant, uploads, feedback: engine, limits=limits)
    await svc.deploy_policy("acme", POLICY)
    decided = await asyncio.gather(
        svc.evaluate("acme", policy="traced", prompt="p", response="r"),
        svc.evaluate("acme", policy="traced", prompt="p", response="r"),
    )
    finished = spans.get_finished_spans()
    (wait,) = _by_name(finished, tracing.ADMISSION_WAIT)  # one waited for the other's slot
    (waited,) = [s for s in _by_name(finished, tracing.EVALUATE) if s.context.span_id == wait.parent.span_id]
    assert waited.attributes["crossaudit.decision_id"] in {d.decision.decision_id for d in decided}
    assert (wait.end_time - wait.start_time) / 1e9 >= 0.15


async def test_no_raw_text_in_any_span(store: SQLiteStore, spans: InMemorySpanExporter) -> None:
    svc = _service(store)
    await svc.deploy_policy("acme", POLICY)
    await svc.evaluate("acme", policy="traced", prompt=PROMPT, response=RESPONSE, context={"note": CONTEXT_VALUE})
    text = _every_value(spans.get_finished_spans())
    assert spans.get_finished_spans()
    for raw in ("4111", "pineapple", "kumquat", "model server restarting"):
        assert raw not in text


async def test_a_callers_traceparent_is_continued(store: SQLiteStore, spans: InMemorySpanExporter) -> None:
    svc = _service(store)
    await svc.deploy_policy("acme", POLICY)
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    parent = tracing.extract({"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=1"})
    await svc.evaluate("acme", policy="traced", prompt="p", response="r", trace_parent=parent)
    (evaluate,) = _by_name(spans.get_finished_spans(), tracing.EVALUATE)
    assert format(evaluate.context.trace_id, "032x") == trace_id
    assert format(evaluate.parent.span_id, "016x") == parent_id and evaluate.parent.is_remote
    assert evaluate.context.trace_state.get("vendor") == "1"
    assert {format(s.context.trace_id, "032x") for s in spans.get_finished_spans()} == {trace_id}


async def test_rules_decided_from_the_cache_are_counted_or_spanned_as_asked(spans: InMemorySpanExporter) -> None:
    from orchestrator.policy import load_policy

    policy = load_policy(POLICY.replace("rules:", "settings: {cache_results: true, cache_duration: 60}\nrules:"))
    engine = Engine(Factory({"toxicity": score(0.9), "flaky": score(0.9), "backup": score(0.9)}))
    await engine.evaluate(policy, "p", "r", {})
    assert len(_by_name(spans.get_finished_spans(), tracing.EVALUATOR)) == 2  # the first time: calls
    spans.clear()
    await engine.evaluate(policy, "p", "r", {})  # every verdict cached: no call, no rule waits
    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == [tracing.ENGINE]
    assert finished[0].attributes["crossaudit.rules.from_cache"] == 2

    spans.clear()
    tracing.enable(spans.provider, all_rule_spans=True)  # tracing.rule_spans: all
    await engine.evaluate(policy, "p", "r", {})
    finished = spans.get_finished_spans()
    (top,) = _by_name(finished, tracing.ENGINE)
    rules = _by_name(finished, tracing.RULE)
    assert len(rules) == 2 and not _by_name(finished, tracing.EVALUATOR)  # a cache hit is no call
    assert all(r.attributes["crossaudit.rule.cache_hits"] == 1 for r in rules)
    assert {r.parent.span_id for r in rules} == {top.context.span_id}


async def test_off_makes_no_span_and_attaches_no_context(store: SQLiteStore, monkeypatch) -> None:
    class Refuses:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"tracer.{name} used while tracing is off")

    assert not tracing.enabled()
    monkeypatch.setattr(tracing._STATE, "tracer", Refuses())
    seen: list[bool] = []

    async def looks(inp: EvaluationInput, timeout: float, n: int) -> Verdict:
        seen.append(trace.get_current_span().get_span_context().is_valid)
        return Verdict(score=1.0)

    engine = Engine(Factory({"toxicity": looks, "flaky": looks, "backup": looks}))
    svc = CrossAuditService(store, lambda tenant, uploads, feedback: engine)
    await svc.deploy_policy("acme", POLICY)
    out = await svc.evaluate("acme", policy="traced", prompt="p", response="r")
    assert seen == [False, False]
    audit = await store.get_decision("acme", out.decision.decision_id)
    assert audit.trace_id is None and audit.span_id is None


async def test_llm_judge_span_has_the_genai_attributes(spans: InMemorySpanExporter) -> None:
    stub = OpenAIStub(prompt_tokens=11, completion_tokens=7)
    ev = LLMEvaluator(
        "judge",
        {"provider": "openai", "model": "gpt-4o-mini", "api_key": "sk-secret-value", "base_url": stub.url},
    )
    try:
        with tracing.span("caller"):
            await ev.call(EvaluationInput(prompt=PROMPT, response=RESPONSE), timeout=10)
    finally:
        await ev.aclose()
        await asyncio.to_thread(stub.close)
    (chat,) = _by_name(spans.get_finished_spans(), tracing.LLM_CHAT)
    a = chat.attributes
    assert chat.kind is SpanKind.CLIENT
    assert a["gen_ai.system"] == "openai" and a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "gpt-4o-mini"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (11, 7)
    assert a["gen_ai.response.id"] == "chatcmpl-1" and list(a["gen_ai.response.finish_reasons"]) == ["stop"]
    text = _every_value(spans.get_finished_spans())
    assert "sk-secret-value" not in text and "4111" not in text and "pineapple" not in text


async def test_a_failed_llm_call_sets_the_error_class(spans: InMemorySpanExporter) -> None:
    ev = LLMEvaluator(
        "judge", {"provider": "openai", "model": "m", "api_key": "k", "base_url": "http://127.0.0.1:9/v1"}
    )
    try:
        with pytest.raises(Exception) as info:
            await ev.call(EvaluationInput(prompt="p", response="r"), timeout=5)
    finally:
        await ev.aclose()
    (chat,) = _by_name(spans.get_finished_spans(), tracing.LLM_CHAT)
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes["error.type"] == chat.status.description
    assert chat.attributes["error.type"] in {type(info.value).__name__, "EvaluatorUnavailableError"}


def test_json_log_lines_carry_the_trace_and_span_ids(spans: InMemorySpanExporter) -> None:
    record = logging.LogRecord("crossaudit.x", logging.INFO, __file__, 1, "hello", None, None)
    with tracing.span("work") as sp:
        DecisionFilter().filter(record)
    line = json.loads(JsonLineFormatter().format(record))
    assert line["trace_id"] == format(sp.get_span_context().trace_id, "032x")
    assert line["span_id"] == format(sp.get_span_context().span_id, "016x")
    outside = logging.LogRecord("crossaudit.x", logging.INFO, __file__, 1, "hello", None, None)
    DecisionFilter().filter(outside)
    assert "trace_id" not in json.loads(JsonLineFormatter().format(outside))


def test_the_sdk_client_sends_the_current_span_context_and_nothing_without_one(spans) -> None:
    from crossaudit.sdk.client import Client

    client = Client.__new__(Client)
    client._md = (("authorization", "Bearer k"),)
    assert client._metadata() == client._md
    with tracing.span("app") as sp:
        md = dict(client._metadata())
    ctx = sp.get_span_context()
    version, trace_id, span_id, flags = md["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 1  # sampled
    assert md["authorization"] == "Bearer k"


def test_tracing_is_off_by_default_and_on_from_the_standard_variables(monkeypatch) -> None:
    for name in [n for n in __import__("os").environ if n.startswith(("OTEL_", "CROSSAUDIT_"))]:
        monkeypatch.delenv(name)
    cfg = load_settings().config.tracing
    assert not cfg.on and describe(cfg) == "off"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "guard")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    loaded = load_settings()
    cfg = loaded.config.tracing
    assert cfg.on and cfg.exporter_in_force == "otlp" and cfg.service_name == "guard" and cfg.sampler_arg == 0.25
    origins = {k: str(o) for k, v, o in loaded.rows()}
    assert origins["tracing.endpoint"] == "env OTEL_EXPORTER_OTLP_ENDPOINT"
    assert origins["tracing.sampler_arg"] == "env OTEL_TRACES_SAMPLER_ARG"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not load_settings().config.tracing.on
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not load_settings().config.tracing.on
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("CROSSAUDIT_TRACING__SERVICE_NAME", "ours")  # ours above the standard one
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")  # the signal's own wins
    loaded = load_settings()
    assert loaded.config.tracing.service_name == "ours" and loaded.config.tracing.protocol == "grpc"
    assert {k: str(o) for k, v, o in loaded.rows()}["tracing.protocol"] == "env OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


def test_the_provider_follows_the_settings(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("tracing: {exporter: otlp, sampler: traceidratio, sampler_arg: 0.5, service_name: s1}\n")
    cfg = load_settings(cfg_file).config.tracing
    provider = build_provider(cfg, InMemorySpanExporter(), version="9.9")
    try:
        assert provider.resource.attributes["service.name"] == "s1"
        assert provider.resource.attributes["service.version"] == "9.9"
        assert "0.5" in provider.sampler.get_description()
    finally:
        provider.shutdown()


def test_library_code_uses_the_api_alone() -> None:
    """The engine, evaluators, sandboxes, kernel, wire layer and SDK client never import the
    OpenTelemetry SDK or an exporter: only the serving process configures them."""
    import ast

    root = Path(__file__).resolve().parents[2]
    api_only = ["orchestrator", "sandbox", "crossaudit/kernel", "crossaudit/api", "crossaudit/sdk", "crossaudit/store"]
    found = []
    for package in api_only:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                found += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith("opentelemetry.sdk")]
                found += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith("opentelemetry.exporter")]
    assert found == []


def test_config_show_says_where_spans_go(monkeypatch, capsys) -> None:
    from crossaudit.cli import main

    for name in [n for n in __import__("os").environ if n.startswith(("OTEL_", "CROSSAUDIT_"))]:
        monkeypatch.delenv(name)
    assert main(["config", "show", "--changed"]) == 0
    assert "# tracing: off" in capsys.readouterr().out
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:hunter2@127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert main(["config", "show", "--changed"]) == 0
    out = capsys.readouterr().out
    assert "# tracing: otlp (grpc) to http://user:***@127.0.0.1:4318" in out and "hunter2" not in out
    assert "env OTEL_EXPORTER_OTLP_PROTOCOL" in out


async def test_the_records_trace_ids_are_kept_beside_its_leaf(any_store) -> None:
    """Both backends keep the ids (a nullable column each); the signed leaf's fixed columns do not
    include them (its format does not change)."""
    from crossaudit.evidence.leaf import LEAF_COLUMNS
    from tests.records import audit_record

    assert "trace_id" not in LEAF_COLUMNS and "span_id" not in LEAF_COLUMNS

    traced = audit_record("d-traced", trace_id="0af7651916cd43dd8448eb211c80319c", span_id="b7ad6b7169203331")
    await any_store.record_decision(traced, [], [])
    await any_store.record_decision(audit_record("d-plain"), [], [])
    got = await any_store.get_decision("t1", "d-traced")
    assert (got.trace_id, got.span_id) == (traced.trace_id, traced.span_id)
    plain = await any_store.get_decision("t1", "d-plain")
    assert plain.trace_id is None and plain.span_id is None
