"""One booking is one trace across real processes, exported over OTLP/HTTP to a receiver the test runs; with the
tracing backend down, the booking still completes, each service says so once in its log and counts the batches it
could not deliver on its /metrics (crashsafe_telemetry_export_failures_total, read at stack.json's ops_url).

The tree of one booking, as the first test prints it, is quoted in docs/observability.md."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crashsafe.natsd import NatsServer
from tests.support.otlp import Collector, ReceivedSpan, otlp_collector, tree
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import eventually

# Spans leave each process in batches every 200 ms (the SDK's OTEL_BSP_SCHEDULE_DELAY, in milliseconds).
EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
EDGES = {
    ("gateway.request", "runtime.step"),
    ("runtime.step", "model.call"),
    ("runtime.step", "action.request"),
    ("action.request", "executor.call"),
    ("executor.call", "provider.call"),
    ("projection.delivery", "provider.call"),
}


@pytest.fixture(scope="module")
async def collector() -> AsyncIterator[Collector]:
    async with otlp_collector() as received:
        yield received


@pytest.fixture(scope="module")
async def traced(
    collector: Collector, nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    env = {**EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
    async with open_stack(tmp_path_factory.mktemp("traced"), nats_url=nats_server.url, env=env) as client:
        yield client


def _edges(spans: list[ReceivedSpan]) -> set[tuple[str, str]]:
    by_id = {s.span_id: s for s in spans}
    return {(by_id[s.parent_id].name, s.name) for s in spans if s.parent_id in by_id}


async def test_one_booking_is_one_trace_across_the_services(
    traced: StackClient, collector: Collector
) -> None:
    run_id, _ = await traced.start_run()
    assert (await traced.wait_terminal(run_id))["status"] == "completed"

    def booking_trace() -> list[ReceivedSpan] | None:
        traces = {s.trace_id for s in collector.spans if s.attributes.get("run_id") == run_id}
        if len(traces) != 1:
            return None
        spans = collector.of_trace(traces.pop())
        # Whole: every boundary seen, and every span's parent arrived (a parent ends, so is sent, after its
        # children: its batch may come later than theirs).
        ids = {s.span_id for s in spans}
        whole = all(s.parent_id in ids for s in spans if s.name != "gateway.request")
        return spans if whole and _edges(spans) >= EDGES else None

    spans = await eventually(booking_trace, what=f"run {run_id}'s spans, every boundary of them")
    print(f"\nthe trace of run {run_id}:\n{tree(spans)}")

    # Every span of the run is in that one trace, under one root: the gateway's request.
    assert {s.trace_id for s in collector.spans if s.attributes.get("run_id") == run_id} == {
        spans[0].trace_id
    }
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_id not in ids]
    assert [(r.name, r.parent_id) for r in roots] == [("gateway.request", "")]
    assert (
        roots[0].attributes["http.request.method"] == "POST"
        and roots[0].attributes["http.response.status_code"] == 202
    )
    assert len({s.service for s in spans}) >= 4, {s.service for s in spans}
    assert {"crashsafe-gateway", "crashsafe-runtime", "crashsafe-executor", "crashsafe-projector"} <= {
        s.service for s in spans
    }

    # The attributes are the contracts' names, so a span joins the journal by equality.
    events = await traced.events(run_id)
    requested = {(e["step_no"], e["key"], e["tool"]) for e in events if e["type"] == "run.action_requested"}
    for name in ("action.request", "executor.call"):
        seen = {
            (s.attributes["step_no"], s.attributes["idempotency_key"], s.attributes["tool"])
            for s in spans
            if s.name == name
        }
        assert seen == requested, name
    steps = [s for s in spans if s.name == "runtime.step"]
    assert all(s.attributes["run_id"] == run_id and "step_no" in s.attributes for s in steps)
    by_id = {s.span_id: s for s in spans}
    for call in (s for s in spans if s.name == "provider.call"):
        assert call.attributes["idempotency_key"] and call.attributes["tool"], call
        parent = by_id[call.parent_id]
        if parent.name == "executor.call":
            assert call.attributes["idempotency_key"] == parent.attributes["idempotency_key"]
    assert not [s for s in spans if s.status == 2], "a span of a clean booking failed"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed once returned: nothing listens there


async def test_with_the_tracing_backend_down_the_booking_completes(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    env = {
        **EXPORT,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",  # seconds the exporter retries a batch before it gives it up
    }
    async with open_stack(tmp_path / "stack", nats_url=nats_server.url, env=env) as client:
        run_id, _ = await client.start_run()
        assert (await client.wait_terminal(run_id))["status"] == "completed"
        logs = client.stack.logs_dir

        def said_down() -> set[str]:
            down = set()
            for path in logs.glob("*.log"):
                if "tracing backend down; spans are dropped" in path.read_text(errors="replace"):
                    down.add(path.stem)
            return down if {"gateway", "runtime"} <= down else set()

        # Each service said so once, and counts the batches it could not deliver on its /metrics.
        down = await eventually(said_down, what="the gateway and the runtime to report the backend down")
        for name in down:
            text = (logs / f"{name}.log").read_text(errors="replace")
            assert text.count("tracing backend down") == 1, name
        state = json.loads((client.stack.state_dir / "stack.json").read_text())
        ops = {s["name"]: s["ops_url"] for s in state["services"] if s.get("ops_url")}
        for name in ("gateway", "runtime"):
            assert await _export_failures(ops[name]) > 0, name
        # And the stack still takes the next guest.
        second, _ = await client.start_run()
        assert (await client.wait_terminal(second))["status"] == "completed"


async def _export_failures(ops_url: str) -> float:
    async with httpx.AsyncClient(timeout=10.0) as http:
        response = await http.get(f"{ops_url}/metrics")
    response.raise_for_status()
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "crashsafe_telemetry_export_failures_total"
        and sample.labels == {"signal": "traces"}
    )
