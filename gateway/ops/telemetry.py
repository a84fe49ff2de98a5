"""Tracing set-up (OpenTelemetry SDK) and the gateway's own tracer.

``[telemetry] exporter``: ``none`` (default: spans are no-ops), ``console`` (one JSON span per
line on stdout) or ``otlp`` (OTLP/HTTP to ``otlp_endpoint``, with headers read from the variable
named by ``otlp_headers_env``, e.g. ``Authorization=Bearer ...``). The provider is process-wide
(OpenTelemetry's global), so only ``gateway run`` installs it, never a ``Gateway`` object.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from agent.tracing import set_capture_content, tracing_on

if TYPE_CHECKING:
    from gateway.core.config import GatewayConfig

log = logging.getLogger("gateway.ops.telemetry")
tracer = trace.get_tracer("agent-gateway.gateway")


@contextmanager
def span(name: str, attributes: dict[str, Any] | None = None) -> Iterator[Span]:
    """A gateway span. An exception marks it failed with its type only: exception messages
    (a database error's SQL parameters, say) may hold message text, which stays off traces.
    Without a tracer provider it is the invalid span, the context untouched (``tracing_on``)."""
    if not tracing_on():
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_attribute("error.type", type(exc).__name__)
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def setup_tracing(config: GatewayConfig, instance_id: str) -> object | None:
    """Installs the tracer provider the config asks for; returns it (``shutdown()`` flushes) or
    ``None`` when tracing is off."""
    telemetry = config.telemetry
    set_capture_content(telemetry.capture_content)
    if telemetry.exporter == "none":
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if telemetry.exporter == "console":
        exporter = ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        headers = _headers(config.secret(telemetry.otlp_headers_env) or "")
        exporter = OTLPSpanExporter(endpoint=telemetry.otlp_endpoint, headers=headers)
    resource = Resource.create({"service.name": telemetry.service_name, "service.instance.id": instance_id})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing on: %s exporter%s", telemetry.exporter,
             f" to {telemetry.otlp_endpoint}" if telemetry.exporter == "otlp" else "")
    return provider


def _headers(raw: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (the OTEL_EXPORTER_OTLP_HEADERS format) as a dict."""
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}
