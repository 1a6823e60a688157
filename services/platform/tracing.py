"""W3C trace context carried in NATS headers, so one guest message is one trace across every service."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from contracts.subjects import Header


def _sdk_installed() -> bool:
    """An SDK replaces the API's proxy provider; until then spans are no-ops and propagation can be verbatim."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _root_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def context_from(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The trace context a message carries; a fresh root where it carries none (the gateway's first hop)."""
    carrier = {
        k.lower(): v
        for k, v in (headers or {}).items()
        if k.lower() in (Header.TRACEPARENT, Header.TRACESTATE)
    }
    if Header.TRACEPARENT not in carrier:
        carrier = {Header.TRACEPARENT.value: _root_traceparent()}
    if not _sdk_installed():
        # With only opentelemetry-api, spans are non-recording and carry no ids of their own: pass the W3C
        # context through verbatim (cheap), so logs and downstream services still share one trace id.
        return otel_context.set_value(_CARRIER, carrier)
    ctx = extract(carrier)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        root = SpanContext(
            trace_id=int.from_bytes(secrets.token_bytes(16), "big") or 1,
            span_id=int.from_bytes(secrets.token_bytes(8), "big") or 1,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        ctx = trace.set_span_in_context(NonRecordingSpan(root), ctx)
    return ctx


_CARRIER = "crashsafe.w3c"


def headers_for(ctx: otel_context.Context) -> dict[str, str]:
    carrier = otel_context.get_value(_CARRIER, ctx)
    if isinstance(carrier, dict):
        return dict(carrier)
    out: dict[str, str] = {}
    inject(out, context=ctx)
    return out


def trace_id_of(ctx: otel_context.Context) -> str:
    carrier = otel_context.get_value(_CARRIER, ctx)
    if isinstance(carrier, dict):
        parts = str(carrier.get(Header.TRACEPARENT.value, "")).split("-")
        return parts[1] if len(parts) == 4 else ""
    span_context = trace.get_current_span(ctx).get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""
