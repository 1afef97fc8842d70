"""Tracing for library code: the OpenTelemetry API alone (docs/observability.md).

The engine, the evaluators, the sandboxes and the SDK client use this module and never the
OpenTelemetry SDK: the process that serves (``crossaudit serve``, or an application that embeds
the engine) configures a tracer provider and then calls :func:`enable`. Until then every helper
here is one flag check: no span object is made, no context is attached, so tracing that is off
costs nothing measurable on the decision path.

What goes into a span is said here once: names, kinds and counts, digests and lengths. Never a
prompt, a response, a context value or a secret (:func:`text_attributes` gives a text's length
and SHA-256, nothing of its content).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from crossaudit.kernel.canonical import sha256_text

TRACER_NAME = "crossaudit"
_TRACER = trace.get_tracer(TRACER_NAME)  # a proxy: follows the provider the application sets later

# Span names (low cardinality: what varies is an attribute).
EVALUATE = "crossaudit.Evaluate"
ADMISSION_WAIT = "crossaudit.admission.wait"
ENGINE = "crossaudit.engine.evaluate"
RULE = "crossaudit.rule"
EVALUATOR = "crossaudit.evaluator"
SANDBOX = "crossaudit.sandbox.run"
AUDIT_COMMIT = "crossaudit.audit.commit"
# An LLM judge's call: the GenAI semantic conventions' "{operation} {model}" would put a
# tenant-chosen model name in the span name; the model is an attribute instead.
LLM_CHAT = "chat"


class _Switch:
    on = False
    tracer: trace.Tracer = _TRACER
    all_rule_spans = False


_STATE = _Switch()


def enable(provider: trace.TracerProvider | None = None, *, all_rule_spans: bool = False) -> None:
    """Spans from here on: the caller has set the global tracer provider (the server does, from its
    ``tracing`` settings), or passes the ``provider`` these spans go to (an application that embeds
    the engine without setting the global one; tests). ``all_rule_spans``: a span for every rule,
    also those decided at once from cached verdicts (else only rules that wait for a call)."""
    _STATE.tracer = provider.get_tracer(TRACER_NAME) if provider is not None else _TRACER
    _STATE.all_rule_spans = all_rule_spans
    _STATE.on = True


def disable() -> None:
    """No more spans (tests; a process that serves never turns tracing off)."""
    _STATE.on = False
    _STATE.tracer = _TRACER


def enabled() -> bool:
    return _STATE.on


def all_rule_spans() -> bool:
    return _STATE.all_rule_spans


def tracer() -> trace.Tracer:
    return _STATE.tracer


def start_span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: Span | None = None,
    start_time: int | None = None,
) -> Span:
    """A span, a child of ``parent`` or else of the current one, not made current (the caller ends it)."""
    context = trace.set_span_in_context(parent) if parent is not None else None
    return _STATE.tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_time)


@contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, kind: SpanKind = SpanKind.INTERNAL
) -> Iterator[Span]:
    """The current span for the block; an exception sets its status (:func:`failed`) and goes on.
    Call only when :func:`enabled` (the hot paths check that before building attributes)."""
    with _STATE.tracer.start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as sp:
        try:
            yield sp
        except BaseException as exc:
            failed(sp, exc)
            raise


def failed(sp: Span, exc: BaseException) -> None:
    """The span's status is an error named by the error's class (``error.type``, as the semantic
    conventions say); its message stays out of the span: it may quote an input or a provider's
    answer."""
    name = type(exc).__name__
    sp.set_attribute("error.type", name)
    sp.set_status(Status(StatusCode.ERROR, name))


def use(sp: Span) -> Any:
    """Make ``sp`` current until :func:`release` with the token returned (no end)."""
    return otel_context.attach(trace.set_span_in_context(sp))


def release(token: Any) -> None:
    otel_context.detach(token)


def text_attributes(prefix: str, text: str) -> dict[str, Any]:
    """A text as a span may name it: its length in characters and its SHA-256 (the audit record's
    hash of the same text), never the text."""
    return {f"{prefix}.length": len(text), f"{prefix}.sha256": sha256_text(text)}


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) in hex of the current span when it is recorded, else None."""
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")


def extract(carrier: Mapping[str, str]) -> Any:
    """The caller's context (W3C ``traceparent``/``tracestate`` with the default propagator) from
    ``carrier`` (gRPC metadata, lower-case keys)."""
    return propagate.extract(carrier)


def inject() -> list[tuple[str, str]]:
    """The current span's context as metadata pairs (``traceparent``, ``tracestate``): nothing when
    no span is active, so a client that does not trace sends nothing."""
    if not trace.get_current_span().get_span_context().is_valid:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())
