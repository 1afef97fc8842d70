"""The server process's OpenTelemetry SDK: a tracer provider, a sampler, a batch span processor
and an OTLP (or console) exporter, built from the ``tracing`` settings (docs/observability.md).

Only the process that serves configures the SDK; the code below it (engine, evaluators, sandboxes)
makes its spans through the API (:mod:`crossaudit.kernel.tracing`), which stays a no-op until
:func:`configure_tracing` has set the provider and switched it on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace import sampling as samplers
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from crossaudit.kernel import tracing
from crossaudit.service.config import TracingConfig
from crossaudit.store.postgres import mask_url

log = logging.getLogger("crossaudit.service.tracing")
HTTP_TRACES_PATH = "/v1/traces"  # appended to an OTLP/HTTP base endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT's


@dataclass
class Tracing:
    """The provider this process set (None: tracing is off), flushed and shut down on stop."""

    provider: TracerProvider | None = None

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()  # exports what is queued (within export_timeout_s)


def sampler(cfg: TracingConfig) -> samplers.Sampler:
    ratio = samplers.TraceIdRatioBased(cfg.sampler_arg)
    return {
        "always_on": samplers.ALWAYS_ON,
        "always_off": samplers.ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": samplers.ParentBased(samplers.ALWAYS_ON),
        "parentbased_always_off": samplers.ParentBased(samplers.ALWAYS_OFF),
        "parentbased_traceidratio": samplers.ParentBased(ratio),
    }[cfg.sampler]


def exporter(cfg: TracingConfig) -> SpanExporter:
    """The exporter the settings name. Headers and TLS files come from the exporter's own standard
    variables (``OTEL_EXPORTER_OTLP_HEADERS``, ...): a token is never a setting."""
    if cfg.exporter_in_force == "console":
        return ConsoleSpanExporter()
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=cfg.traces_endpoint or cfg.endpoint, timeout=cfg.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    url = cfg.traces_endpoint or (cfg.endpoint.rstrip("/") + HTTP_TRACES_PATH if cfg.endpoint else None)
    return HttpExporter(endpoint=url, timeout=cfg.export_timeout_s)


def build_provider(cfg: TracingConfig, span_exporter: SpanExporter | None = None, version: str = "") -> TracerProvider:
    """The provider the settings describe; ``span_exporter`` in place of theirs (tests)."""
    attributes: dict[str, Any] = {SERVICE_NAME: cfg.service_name}
    if version:
        attributes[SERVICE_VERSION] = version
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=sampler(cfg),
        span_limits=SpanLimits(
            max_attributes=cfg.max_attributes_per_span, max_attribute_length=cfg.max_attribute_length
        ),
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            span_exporter if span_exporter is not None else exporter(cfg),
            max_queue_size=cfg.max_queue_size,
            max_export_batch_size=min(cfg.max_export_batch_size, cfg.max_queue_size),
            schedule_delay_millis=cfg.schedule_delay_s * 1000,
            export_timeout_millis=cfg.export_timeout_s * 1000,
        )
    )
    return provider


def configure_tracing(cfg: TracingConfig, version: str = "") -> Tracing:
    """Set the process's tracer provider when the settings turn tracing on (once per process: the
    API keeps the first provider set), and switch the library's spans on. Off: nothing is built."""
    if not cfg.on:
        return Tracing()
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # set already (a second server in one process: tests)
        tracing.enable(all_rule_spans=cfg.rule_spans == "all")
        return Tracing()
    provider = build_provider(cfg, version=version)
    trace.set_tracer_provider(provider)
    tracing.enable(all_rule_spans=cfg.rule_spans == "all")
    log.info("tracing on: %s", describe(cfg))
    return Tracing(provider)


def describe(cfg: TracingConfig) -> str:
    """One line: what is exported where, sampled how (the start log, ``config show``)."""
    how: str = cfg.exporter_in_force
    if how == "none":
        return "off"
    if how == "otlp":
        where = cfg.traces_endpoint or cfg.endpoint
        where = mask_url(where) if where else "the exporter's default endpoint"
        how = f"otlp ({cfg.protocol}) to {where}"
    arg = f" {cfg.sampler_arg}" if "traceidratio" in cfg.sampler else ""
    return f"{how}, service {cfg.service_name!r}, sampler {cfg.sampler}{arg}"
