"""W3C trace context carried in NATS headers, so one guest message is one trace across every service."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

_tracer = trace.get_tracer("crashsafe")


def context_from(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The trace context a message carries; a fresh root where it carries none (the gateway's first hop)."""
    ctx = extract(dict(headers or {}))
    if trace.get_current_span(ctx).get_span_context().is_valid:
        return ctx
    # With only opentelemetry-api installed, spans are non-recording and would carry no ids at all;
    # a generated root keeps the trace id flowing so logs correlate even without an SDK.
    root = SpanContext(
        trace_id=int.from_bytes(secrets.token_bytes(16), "big") or 1,
        span_id=int.from_bytes(secrets.token_bytes(8), "big") or 1,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(root), ctx)


def headers_for(ctx: otel_context.Context) -> dict[str, str]:
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    return carrier


def trace_id_of(ctx: otel_context.Context) -> str:
    span_context = trace.get_current_span(ctx).get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


def start_span(name: str, ctx: otel_context.Context, **attributes: str | int) -> trace.Span:
    """A span at a message boundary, named by contract terms; a no-op unless an SDK is installed."""
    return _tracer.start_span(name, context=ctx, attributes=attributes)
