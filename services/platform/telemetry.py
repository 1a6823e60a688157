"""Span export, installed only when asked for by the standard OTEL_* variables, and never a reason to stop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crashsafe.services.platform import metrics
from crashsafe.services.platform.logs import log

logger = logging.getLogger("crashsafe.telemetry")

# The variables that ask for OTLP export (the OpenTelemetry specification's names).
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SHUTDOWN_BOUND_S = 5.0  # a backend that is down must not hold a stopping service for the exporter's retries


def export_requested(env: Mapping[str, str]) -> bool:
    """True if the environment asks for traces over OTLP: an endpoint, or OTEL_TRACES_EXPORTER=otlp; never when
    OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER names something else (`none`)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return "otlp" in {e.strip() for e in exporter.split(",")}
    return any(env.get(name, "").strip() for name in _ENDPOINTS)


class Telemetry:
    """What `configure_telemetry` installed: `close()` flushes what is queued, within a bound."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider

    @property
    def exporting(self) -> bool:
        return self._provider is not None

    def close(self) -> None:
        provider, self._provider = self._provider, None
        if provider is None:
            return
        # The SDK's shutdown waits out the exporter's retries (seconds per batch when the backend is down): in a
        # daemon thread, joined for a bounded time, so a stop is never held up by tracing.
        stopping = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_BOUND_S)


def _counting(exporter: Any) -> Any:
    """The exporter, counting each batch it could not deliver (TELEMETRY_EXPORT_FAILURES) and logging once per
    outage, so a tracing backend that is down is an alert and one log line, not a log line per batch."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        def __init__(self) -> None:
            self._down = False

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            try:
                result = exporter.export(spans)
            except Exception as exc:  # noqa: BLE001 -- an exporter's fault is counted, never raised into the SDK
                result, why = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
            else:
                why = "the backend did not take the batch"
            if result is SpanExportResult.SUCCESS:
                if self._down:
                    self._down = False
                    log(logger, logging.INFO, "tracing backend takes spans again")
                return result
            metrics.TELEMETRY_EXPORT_FAILURES.labels(signal="traces").inc()
            if not self._down:
                self._down = True
                log(
                    logger,
                    logging.WARNING,
                    "tracing backend down; spans are dropped, the service goes on",
                    spans=len(spans),
                    detail=why[:300],
                )
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return CountingExporter()


def configure_telemetry(
    service: str, otel: Iterable[tuple[str, str]], *, resource: Mapping[str, str] | None = None
) -> Telemetry:
    """Install the OpenTelemetry SDK with a batching OTLP/HTTP exporter if the OTEL_* variables ask for it and
    `crashsafe[otel]` is installed; otherwise leave the API's no-op tracer in place (spans cost ~nothing).
    service.name is `crashsafe-<service>` unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names one."""
    if not export_requested(dict(otel)):
        return Telemetry()
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME
    except ImportError as exc:
        log(
            logger,
            logging.WARNING,
            "OTEL_* variables ask for span export but the SDK is not installed (pip install 'crashsafe[otel]');"
            " running without export",
            missing=str(exc.name or exc),
        )
        return Telemetry()
    provider = exporting_provider(service, resource)
    trace.set_tracer_provider(provider)
    log(
        logger,
        logging.INFO,
        "exporting spans over OTLP/HTTP",
        service_name=str(provider.resource.attributes.get(SERVICE_NAME)),
    )
    return Telemetry(provider)


def exporting_provider(service: str, resource: Mapping[str, str] | None = None) -> Any:
    """A TracerProvider (the SDK's; not installed here) exporting over OTLP/HTTP to where the OTEL_* variables
    say, each batch it could not deliver counted."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME are read by the SDK (from the process's environment).
    detected = Resource.create(dict(resource or {}))
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: f"crashsafe-{service}"}))
    provider = TracerProvider(resource=detected)
    # Bounded queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default) drained by the SDK's own thread: a slow or dead
    # backend drops spans, it never blocks a handler.
    provider.add_span_processor(BatchSpanProcessor(_counting(OTLPSpanExporter())))
    return provider
