"""The exporter a service installs, against a real OTLP/HTTP receiver and against a port nothing listens on: a
backend that is down is counted in TELEMETRY_EXPORT_FAILURES (read here in-process, from this process's registry),
one that is up gets the spans with the service's name."""

from __future__ import annotations

import asyncio
import socket

import pytest

from crashsafe.services.platform import metrics
from crashsafe.services.platform.telemetry import exporting_provider
from tests.support.otlp import otlp_collector


def _failures() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "crashsafe_telemetry_export_failures_total", {"signal": "traces"}
    )
    return value or 0.0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_backend_that_is_down_is_counted_and_the_caller_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    before = _failures()
    provider = exporting_provider("runtime")
    tracer = provider.get_tracer("test")
    for n in range(3):
        with tracer.start_as_current_span("runtime.step") as opened:
            opened.set_attribute("step_no", n)  # the work inside a span is not held up by the backend
    # The flush is the SDK's thread doing the export; in a thread so this loop keeps running meanwhile.
    await asyncio.to_thread(provider.force_flush)
    assert _failures() > before
    await asyncio.to_thread(provider.shutdown)


async def test_a_backend_that_is_up_gets_the_spans_under_the_services_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    async with otlp_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        before = _failures()
        provider = exporting_provider("executor", {"crashsafe.family": "payment"})
        with provider.get_tracer("test").start_as_current_span("executor.call"):
            pass
        await asyncio.to_thread(provider.force_flush)
        await asyncio.to_thread(provider.shutdown)
        assert [(s.name, s.service) for s in collector.spans] == [("executor.call", "crashsafe-executor")]
        assert _failures() == before


async def test_otel_service_name_wins_over_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    async with otlp_collector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "stayhub-runtime-eu")
        provider = exporting_provider("runtime")
        with provider.get_tracer("test").start_as_current_span("runtime.step"):
            pass
        await asyncio.to_thread(provider.force_flush)
        await asyncio.to_thread(provider.shutdown)
        assert [s.service for s in collector.spans] == ["stayhub-runtime-eu"]


async def test_a_backend_that_accepts_and_never_answers_holds_up_neither_spans_nor_a_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not refusing (that is quick): a collector that takes the connection and never answers. Ending spans stays
    a queue put even once the queue is full, and a stopping service waits at most SHUTDOWN_BOUND_S for it."""
    import time

    from crashsafe.services.platform.telemetry import SHUTDOWN_BOUND_S, Telemetry

    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing, close nothing

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    provider = exporting_provider("runtime")
    telemetry = Telemetry(provider)
    try:
        tracer = provider.get_tracer("test")
        # A span end that waited on the backend would wait out the exporter's timeout (2 s) for every batch of 512
        # it could not deliver: 5,000 spans, about 10 batches, 20 s and more. Queue puts take a second or two on a
        # loaded machine, whose stalls (a second, once) are no measure of the exporter.
        started = time.monotonic()
        for n in range(5000):  # past the default queue of 2048
            with tracer.start_as_current_span("runtime.step") as opened:
                opened.set_attribute("step_no", n)
        took = time.monotonic() - started
        assert took < 10.0, f"5,000 span ends took {took:.1f} s: they waited on the backend"
        started = time.monotonic()
        await asyncio.to_thread(telemetry.close)
        assert time.monotonic() - started < SHUTDOWN_BOUND_S + 1.0
        assert held, "the exporter never reached the hanging backend"
    finally:
        await asyncio.to_thread(telemetry.close)  # a no-op once closed; else the exporter's threads live on
        for writer in held:
            writer.close()
        server.close()
        # The bounded close left the SDK's threads retrying in the background: wait them out here, or they go on
        # drawing from `random` (the exporter's back-off jitter, span ids) during the tests that follow.
        await asyncio.to_thread(_join_export_threads)


def _join_export_threads(timeout_s: float = 30.0) -> None:
    import threading
    import time

    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and (
            thread.name == "otel-shutdown" or thread.name.startswith("OtelBatchSpanRecordProcessor")
        ):
            thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in threading.enumerate() if t.name == "otel-shutdown" or "OtelBatch" in t.name]
    assert not left, f"the exporter's threads outlived the test: {left}"
