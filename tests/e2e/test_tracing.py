"""Tracing end to end (docs/observability.md): a real server, told by the OpenTelemetry SDK's
standard variables to export OTLP/HTTP, sends its spans to a receiver started here on loopback,
which decodes each ``ExportTraceServiceRequest`` with opentelemetry-proto. The caller's trace
context travels from the SDK client (a span current in this process) to the server's spans."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from crossaudit.kernel import tracing
from crossaudit.sdk import Client
from tests.e2e.conftest import ServerProcess, key, run_cli
from tests.e2e.policies import custom_policy, flags_word

pytestmark = pytest.mark.e2e
PROMPT = "the prompt names a secret: tangerine-walrus"
RESPONSE = "an answer holding mango-kestrel"
MAX_BODY_BYTES = 16 * 1024 * 1024  # the receiver reads one export request up to this


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: every span it is sent, decoded."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = min(int(self.headers.get("content-length") or 0), MAX_BODY_BYTES)
                body = self.rfile.read(length)
                request = ExportTraceServiceRequest.FromString(body)
                with owner.lock:
                    owner.paths.append(self.path)
                    owner.requests.append(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        out = []
        with self.lock:
            for request in self.requests:
                for rs in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    out.extend((resource, span) for ss in rs.scope_spans for span in ss.spans)
        return out

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attributes(span: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def test_a_decision_is_traced_from_the_callers_span_to_the_sandbox(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "crossaudit-e2e",
        "CROSSAUDIT_TRACING__SCHEDULE_DELAY_S": "0.2",
    }
    caller_trace, caller_span = 0x5BF4A3C2D1E0F9A8B7C6D5E4F3A2B1C0, 0x1A2B3C4D5E6F7081
    data_dir: Path = tmp_path_factory.mktemp("traced")
    with ServerProcess(data_dir, env=env) as server:
        policy = custom_policy("traced", flags_word("kestrel"), evaluator="words", rules=["no_bird"])
        with Client(server.address, api_key=key("acme")) as client:
            client.deploy_policy(policy)
            parent = SpanContext(caller_trace, caller_span, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
            try:
                decision = client.evaluate("traced", PROMPT, RESPONSE, context={"note": "papaya-heron"}, timeout=30)
            finally:
                otel_context.detach(token)
            untraced = client.evaluate("traced", "p", "r", timeout=30)  # no span current: a trace of its own
            record = client.get_decision(decision.decision_id)
            shown = run_cli("audit", "get", decision.decision_id, server=server, api_key=key("acme"))
    # stopped: the server exported what it still held
    spans = receiver.spans()
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    evaluates = [s for _, s in spans if s.name == tracing.EVALUATE]
    ours = [s for s in evaluates if _attributes(s)["crossaudit.decision_id"] == decision.decision_id]
    (evaluate,) = ours
    assert int.from_bytes(evaluate.trace_id, "big") == caller_trace
    assert int.from_bytes(evaluate.parent_span_id, "big") == caller_span
    a = _attributes(evaluate)
    assert a["crossaudit.tenant"] == "acme" and a["crossaudit.policy"] == "traced"
    assert a["crossaudit.verdict"] == "failed" and a["crossaudit.action"] == decision.action.value
    assert record.trace_id == f"{caller_trace:032x}" and record.span_id == evaluate.span_id.hex()
    assert json.loads(shown.stdout)["trace_id"] == record.trace_id  # crossaudit audit get shows it
    (other,) = [s for s in evaluates if _attributes(s)["crossaudit.decision_id"] == untraced.decision_id]
    assert int.from_bytes(other.trace_id, "big") != caller_trace and not other.parent_span_id

    in_trace = [s for _, s in spans if s.trace_id == evaluate.trace_id]
    names = [s.name for s in in_trace]
    for name in (tracing.ENGINE, tracing.RULE, tracing.AUDIT_COMMIT):
        assert names.count(name) == 1, names
    assert tracing.ADMISSION_WAIT not in names  # a slot was free
    (call,) = [s for s in in_trace if s.name == tracing.EVALUATOR]
    (sandbox,) = [s for s in in_trace if s.name == tracing.SANDBOX]
    assert sandbox.parent_span_id == call.span_id
    assert _attributes(sandbox)["crossaudit.sandbox.backend"] == "process"
    assert _attributes(call)["crossaudit.evaluator.kind"] == "custom"
    assert {r.get("service.name") for r, _ in spans} == {"crossaudit-e2e"}

    every = "\n".join(f"{s.name} {_attributes(s)} {s.status.message}" for _, s in spans)
    for raw in ("tangerine", "kestrel", "papaya", key("acme")):
        assert raw not in every
