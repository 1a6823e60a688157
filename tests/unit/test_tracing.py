"""The span helper: verbatim propagation without an SDK, parenting and error recording with one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

from crashsafe.contracts.spans import SpanName
from crashsafe.services.platform.tracing import (
    annotate,
    context_from,
    current,
    headers_for,
    span,
    trace_id_of,
    trace_requests,
)

INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK installed for one test (the API lets a provider be set once per process: the test puts back what
    was there, so every other test keeps the no-SDK path)."""
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_without_an_sdk_the_context_passes_verbatim() -> None:
    parent = context_from({"traceparent": INCOMING, "other": "x"})
    with span(SpanName.RUNTIME_STEP, parent, run_id="run_1") as ctx:
        assert ctx is parent  # nothing opened: the message's own context goes on
        assert trace_id_of(current()) == "0af7651916cd43dd8448eb211c80319c"
        assert headers_for(ctx) == {"traceparent": INCOMING}
    assert trace_id_of(current()) == ""  # closed: the task's context is what it was


def test_without_an_sdk_a_message_with_no_context_gets_a_root() -> None:
    first, second = context_from(None), context_from({})
    assert len(trace_id_of(first)) == 32 and trace_id_of(first) != trace_id_of(second)


def test_a_span_is_the_child_of_the_message_it_handles(spans: InMemorySpanExporter) -> None:
    parent = context_from({"traceparent": INCOMING})
    with span(
        SpanName.EXECUTOR_CALL, parent, run_id="run_1", step_no=2, idempotency_key="k", tool="charge"
    ) as ctx:
        with span(SpanName.PROVIDER_CALL, current(), tool="charge") as inner:
            annotate(inner, outcome="ok")
        published = headers_for(ctx)
    done = by_name(spans)
    call, provider = done["executor.call"], done["provider.call"]
    assert format(call.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert call.parent is not None and format(call.parent.span_id, "016x") == "b7ad6b7169203331"
    assert provider.parent is not None and provider.parent.span_id == call.context.span_id
    assert dict(call.attributes or {}) == {
        "run_id": "run_1",
        "step_no": 2,
        "idempotency_key": "k",
        "tool": "charge",
    }
    assert (provider.attributes or {})["outcome"] == "ok"
    # What the next publish carries is the child's own context, so the next service's span hangs under it.
    assert published["traceparent"] == f"00-{call.context.trace_id:032x}-{call.context.span_id:016x}-01"


def test_a_message_with_no_context_opens_a_true_root(spans: InMemorySpanExporter) -> None:
    with span(SpanName.GATEWAY_REQUEST, context_from(None)) as ctx:
        published = headers_for(ctx)
    with span(SpanName.RUNTIME_STEP, context_from(published)):
        pass
    done = by_name(spans)
    assert done["gateway.request"].parent is None
    step = done["runtime.step"]
    assert step.parent is not None and step.parent.span_id == done["gateway.request"].context.span_id
    assert step.context.trace_id == done["gateway.request"].context.trace_id


def test_an_error_is_recorded_on_the_span_and_raised_on(spans: InMemorySpanExporter) -> None:
    with (
        pytest.raises(ValueError, match="no such room"),
        span(SpanName.RUNTIME_STEP, context_from(None), run_id="run_2"),
    ):
        raise ValueError("no such room")
    (step,) = spans.get_finished_spans()
    assert step.status.status_code is StatusCode.ERROR
    assert [e.name for e in step.events] == ["exception"]
    assert (step.events[0].attributes or {})["exception.type"] == "ValueError"


def test_attributes_that_are_none_are_left_out(spans: InMemorySpanExporter) -> None:
    with span(SpanName.MODEL_CALL, context_from(None), run_id="r", route=None) as ctx:
        annotate(ctx, outcome=None, step_no=3)
    (call,) = spans.get_finished_spans()
    assert dict(call.attributes or {}) == {"run_id": "r", "step_no": 3}


@pytest.mark.parametrize(
    "hostile",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nNats-Msg-Id: x",
        "00-" + "a" * 5000,
        "<script>alert(1)</script>",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
    ],
)
def test_a_traceparent_not_of_the_standards_shape_is_not_carried_on(hostile: str) -> None:
    ctx = context_from({"traceparent": hostile, "tracestate": "vendor=1"})
    carried = headers_for(ctx)
    assert set(carried) == {"traceparent"} and carried["traceparent"] != hostile
    assert len(trace_id_of(ctx)) == 32


def test_a_tracestate_too_long_or_not_printable_is_dropped_and_the_parent_kept() -> None:
    for state in ("v=" + "x" * 600, "v=1\nx=2"):
        assert headers_for(context_from({"traceparent": INCOMING, "tracestate": state})) == {
            "traceparent": INCOMING
        }
    assert headers_for(context_from({"traceparent": INCOMING, "tracestate": "v=1"})) == {
        "traceparent": INCOMING,
        "tracestate": "v=1",
    }


def test_a_long_attribute_is_cut(spans: InMemorySpanExporter) -> None:
    with span(SpanName.GATEWAY_REQUEST, context_from(None), **{"http.route": "/v1/" + "x" * 10_000}):
        pass
    (request,) = spans.get_finished_spans()
    assert len(str((request.attributes or {})["http.route"])) == 256


async def test_each_http_request_is_a_span_its_handler_runs_in(spans: InMemorySpanExporter) -> None:
    seen: list[str] = []

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        seen.append(trace_id_of(current()))
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: Any) -> None:
        pass

    app = trace_requests(handler)
    for path, headers in (
        ("/v1/events", [(b"traceparent", INCOMING.encode())]),
        ("/v1/events", []),
        ("/healthz", []),
        ("/console/static/htmx.min.js", []),
    ):
        await app({"type": "http", "method": "POST", "path": path, "headers": headers}, None, send)
    continued, fresh = spans.get_finished_spans()  # the probe and the static file: no span
    assert continued.parent is not None and format(continued.parent.span_id, "016x") == "b7ad6b7169203331"
    assert fresh.parent is None
    assert (fresh.attributes or {})["http.response.status_code"] == 202
    assert seen[:2] == [f"{continued.context.trace_id:032x}", f"{fresh.context.trace_id:032x}"]


async def test_a_caller_cannot_switch_tracing_off_for_its_runs(spans: InMemorySpanExporter) -> None:
    """A caller's traceparent with the sampled flag cleared would make every service's span of its run a
    non-recording one (the sampler follows the parent): the caller keeps its trace id, never the decision."""
    published: list[dict[str, str]] = []

    async def handler(scope: Any, receive: Any, send: Any) -> None:
        published.append(headers_for(current()))  # what the run's messages would carry on
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: Any) -> None:
        pass

    unsampled = INCOMING[:-2] + "00"
    await trace_requests(handler)(
        {
            "type": "http",
            "method": "POST",
            "path": "/v1/events",
            "headers": [(b"traceparent", unsampled.encode())],
        },
        None,
        send,
    )
    (request,) = spans.get_finished_spans()
    assert format(request.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert published[0]["traceparent"].endswith("-01")
