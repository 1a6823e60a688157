"""W3C trace context carried in NATS headers, and one span per boundary, so one guest message is one trace."""

from __future__ import annotations

import re
import secrets
from asyncio import CancelledError
from collections.abc import Awaitable, Callable, Mapping
from contextvars import Token
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from crashsafe.contracts.headers import Header
from crashsafe.contracts.spans import SpanAttr, SpanName
from crashsafe.services.platform.logs import bind_run, unbind_run

_tracer: tuple[object, trace.Tracer | None] = (None, None)  # (the provider it came from, our tracer)
_CARRIER = "crashsafe.w3c"  # the verbatim W3C headers, on the no-SDK path
_MADE_UP = "crashsafe.made_up_root"  # context_from invented this root: a span opened under it is a true root

_KINDS = {
    SpanName.GATEWAY_REQUEST: SpanKind.SERVER,
    SpanName.RUNTIME_STEP: SpanKind.CONSUMER,
    SpanName.MODEL_CALL: SpanKind.CLIENT,
    SpanName.ACTION_REQUEST: SpanKind.PRODUCER,
    SpanName.EXECUTOR_CALL: SpanKind.CONSUMER,
    SpanName.PROVIDER_CALL: SpanKind.CLIENT,
    SpanName.PROJECTION_DELIVERY: SpanKind.CONSUMER,
    SpanName.RECONCILER_ASK: SpanKind.PRODUCER,
}
# Probes and scrapes every few seconds are not a guest's request: they would bury the traces that are.
_UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_UNTRACED_PREFIXES = ("/console/static/",)  # the console's vendored scripts and styles

AttrValue = str | int | float | bool | None


_UNREAD = object()


def _sdk_installed() -> bool:
    """An SDK replaces the API's proxy provider; until then spans are no-ops and propagation can be verbatim.
    Asked at every span: the API's global is read directly (get_tracer_provider() reads the environment each
    time: 4 of the 9 microseconds a span cost without an SDK), the public call only if the API has changed."""
    installed = getattr(trace, "_TRACER_PROVIDER", _UNREAD)
    if installed is _UNREAD:
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return installed is not None


def _tracer_of(provider: trace.TracerProvider) -> trace.Tracer:
    """Our tracer from the installed provider, asked again only if the provider changed (a test swaps it)."""
    global _tracer
    source, tracer = _tracer
    if source is not provider or tracer is None:
        tracer = provider.get_tracer("crashsafe")
        _tracer = (provider, tracer)
    return tracer


# W3C Trace Context: what a caller may send is checked before it is copied into every message of a run (on the
# no-SDK path it travels verbatim): a traceparent of the standard's shape, a tracestate of its size and alphabet.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE = re.compile(r"[\x20-\x7e]{1,512}")
_ATTR_CHARS = 256  # a span attribute's text is cut there: a caller's path or key must not make a span huge


def _well_formed(carrier: dict[str, str]) -> dict[str, str]:
    parent = carrier.get(Header.TRACEPARENT.value, "")
    if not _TRACEPARENT.fullmatch(parent) or parent.startswith("ff"):
        return {}
    state = carrier.get(Header.TRACESTATE.value)
    if state is not None and not _TRACESTATE.fullmatch(state):
        return {Header.TRACEPARENT.value: parent}
    return carrier


def _bounded(attrs: dict[str, AttrValue]) -> dict[str, str | int | float | bool]:
    return {k: v[:_ATTR_CHARS] if isinstance(v, str) else v for k, v in attrs.items() if v is not None}


def _sampled(carrier: dict[str, str]) -> dict[str, str]:
    """A caller's traceparent with the sampled flag set: the caller may name the trace its run joins, but a
    cleared flag would make every service's span of the run non-recording (the sampler follows the parent)."""
    parent = carrier.get(Header.TRACEPARENT.value, "")
    if not _TRACEPARENT.fullmatch(parent):
        return carrier
    flags = int(parent[-2:], 16) | 0x01
    return {**carrier, Header.TRACEPARENT.value: f"{parent[:-2]}{flags:02x}"}


def _root_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def context_from(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The trace context a message carries; a fresh root where it carries none (the gateway's first hop)."""
    carrier = {
        k.lower(): v
        for k, v in (headers or {}).items()
        if k.lower() in (Header.TRACEPARENT, Header.TRACESTATE)
    }
    if carrier:
        carrier = _well_formed(carrier)
    made_up = Header.TRACEPARENT not in carrier
    if made_up:
        carrier = {Header.TRACEPARENT.value: _root_traceparent()}
    if not _sdk_installed():
        # With only opentelemetry-api, spans are non-recording and carry no ids of their own: pass the W3C
        # context through verbatim (cheap), so logs and downstream services still share one trace id.
        return otel_context.set_value(_CARRIER, carrier)
    ctx = extract(carrier)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        made_up = True
        root = SpanContext(
            trace_id=int.from_bytes(secrets.token_bytes(16), "big") or 1,
            span_id=int.from_bytes(secrets.token_bytes(8), "big") or 1,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        ctx = trace.set_span_in_context(NonRecordingSpan(root), ctx)
    return otel_context.set_value(_MADE_UP, True, ctx) if made_up else ctx


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


def current() -> otel_context.Context:
    """The context of the innermost open span of this task (what a log line is stamped with)."""
    return otel_context.get_current()


def has_trace(ctx: otel_context.Context) -> bool:
    return (
        otel_context.get_value(_CARRIER, ctx) is not None
        or trace.get_current_span(ctx).get_span_context().is_valid
    )


class span:  # noqa: N801 -- used as a function: `with span(SpanName.X, parent, run_id=...) as ctx:`
    """One span at a boundary, child of `parent` (a message's context): `as ctx` is the child's context, what
    `headers_for` puts on the next publish, and it is the task's current context while open (logs read it).

    Without an SDK it opens nothing and yields `parent` itself. An error inside is recorded on the span
    (status ERROR and an exception event) and goes on up; tracing itself never raises into the caller."""

    __slots__ = ("_name", "_parent", "_attrs", "_span", "_token", "_run")

    def __init__(self, name: SpanName, parent: otel_context.Context, **attrs: AttrValue) -> None:
        self._name = name
        self._parent = parent
        self._attrs = attrs
        self._span: trace.Span | None = None
        self._token: object = None
        self._run: Token[str] | None = None

    def __enter__(self) -> otel_context.Context:
        ctx = self._parent
        if _sdk_installed():
            try:
                parent = ctx
                if otel_context.get_value(_MADE_UP, parent):
                    parent = otel_context.Context()  # no real parent: this span is the trace's root
                self._span = _tracer_of(trace.get_tracer_provider()).start_span(
                    self._name.value,
                    context=parent,
                    kind=_KINDS.get(self._name, SpanKind.INTERNAL),
                    attributes=_bounded(self._attrs),
                )
                ctx = trace.set_span_in_context(self._span, parent)
            except Exception:  # noqa: BLE001 -- a tracing fault must never fail the work it watches
                self._span, ctx = None, self._parent
        self._token = otel_context.attach(ctx)
        run_id = self._attrs.get(SpanAttr.RUN_ID)
        if isinstance(run_id, str) and run_id:
            self._run = bind_run(run_id)
        return ctx

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._run is not None:
                unbind_run(self._run)
            otel_context.detach(self._token)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001,S110 -- exited in another context (a cancelled task): nothing to undo
            pass
        opened = self._span
        if opened is None:
            return
        try:
            if exc is not None and not isinstance(exc, CancelledError):  # a stop is no failure
                opened.record_exception(exc)
                opened.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:300]))
            opened.end()
        except Exception:  # noqa: BLE001,S110 -- see __enter__
            pass


def annotate(ctx: otel_context.Context, **attrs: AttrValue) -> None:
    """Attributes learnt after a span opened (the step a run is at, the answer a provider gave)."""
    opened = trace.get_current_span(ctx)
    if opened.is_recording():
        opened.set_attributes(_bounded(attrs))


def failed(ctx: otel_context.Context, why: str) -> None:
    """Mark the span in `ctx` failed without an exception (a provider's answer that is not a success)."""
    opened = trace.get_current_span(ctx)
    if opened.is_recording():
        opened.set_status(Status(StatusCode.ERROR, why[:300]))


ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]  # (scope, receive, send), without a framework's types


def trace_requests(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: each HTTP request a `gateway.request` span (a root unless a traceparent came in), the
    request's handler running in its context (`current()`)."""

    async def traced(scope: Any, receive: Any, send: Callable[[Any], Awaitable[None]]) -> None:
        path = scope.get("path", "")
        if scope.get("type") != "http" or path in _UNTRACED_PATHS or path.startswith(_UNTRACED_PREFIXES):
            await app(scope, receive, send)
            return
        carrier: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            if name in (b"traceparent", b"tracestate"):
                carrier[name.decode("latin-1")] = value.decode("latin-1")
        parent = context_from(_sampled(carrier))
        with span(
            SpanName.GATEWAY_REQUEST,
            parent,
            **{SpanAttr.HTTP_METHOD: scope.get("method"), SpanAttr.HTTP_ROUTE: scope.get("path")},
        ) as ctx:

            async def send_noting_status(message: Any) -> None:
                if message.get("type") == "http.response.start":
                    status = int(message.get("status", 0))
                    annotate(ctx, **{SpanAttr.HTTP_STATUS: status})
                    if status >= 500:
                        failed(ctx, f"answered {status}")
                await send(message)

            await app(scope, receive, send_noting_status)

    return traced
