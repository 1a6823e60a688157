"""Log lines: one JSON object each, ISO-8601 UTC timestamps, the trace and run of the span they were written in."""

from __future__ import annotations

import io
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.spans import SpanName
from crashsafe.services.platform import logs
from crashsafe.services.platform.telemetry import export_requested
from crashsafe.services.platform.tracing import context_from, span

INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The process's logging configured as a service does, onto a buffer; put back afterwards."""
    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, sys.excepthook)
    configure_into(out, "runtime")
    try:
        yield out
    finally:
        logging.captureWarnings(False)
        root.handlers[:], level, sys.excepthook = saved
        root.setLevel(level)


def configure_into(out: io.StringIO, service: str) -> None:
    real, sys.stderr = sys.stderr, out  # type: ignore[assignment]
    try:
        logs.configure(service, "INFO")
    finally:
        sys.stderr = real


def parsed(out: io.StringIO) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in out.getvalue().splitlines()]


def test_iso_timestamps_are_utc_with_milliseconds() -> None:
    assert logs.iso(0.0) == "1970-01-01T00:00:00.000Z"
    assert logs.iso(1796148000.1239) == "2026-12-01T18:00:00.123Z"


def test_a_line_in_a_span_carries_its_trace_and_run(lines: io.StringIO) -> None:
    logger = logging.getLogger("runtime")
    with span(SpanName.RUNTIME_STEP, context_from({"traceparent": INCOMING}), run_id="run_7"):
        logs.log(logger, logging.INFO, "run resumed", next_step=3)
    logs.log(logger, logging.INFO, "runtime ready")
    inside, outside = parsed(lines)
    assert ISO.match(inside["ts"]) and inside["level"] == "info" and inside["msg"] == "run resumed"
    assert inside["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert inside["run_id"] == "run_7" and inside["next_step"] == 3
    assert "trace_id" not in outside and "run_id" not in outside


def test_a_run_named_by_the_line_wins(lines: io.StringIO) -> None:
    with span(SpanName.RUNTIME_STEP, context_from(None), run_id="run_a"):
        logs.log(logging.getLogger("runtime"), logging.INFO, "woke run", run_id="run_b")
    (line,) = parsed(lines)
    assert line["run_id"] == "run_b"


def test_libraries_and_warnings_come_out_as_json(lines: io.StringIO) -> None:
    # A library's own plain-text handler (uvicorn's default logging config installs one): configure removes it.
    logging.getLogger("uvicorn.error").addHandler(logging.StreamHandler(lines))
    configure_into(lines, "gateway")
    logging.getLogger("uvicorn.error").warning("<script>alert(1)</script> went away")
    logging.getLogger("nats").info("reconnecting")  # quiet: below WARNING
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated thing", DeprecationWarning, stacklevel=1)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=True)
    uvicorn, warned, task = parsed(lines)
    assert uvicorn["service"] == "uvicorn.error" and "went away" in uvicorn["msg"]
    assert warned["service"] == "py.warnings" and "a deprecated thing" in warned["msg"]
    assert task["level"] == "error" and "RuntimeError: boom" in task["exc"]


def test_a_field_json_cannot_hold_is_written_as_text(lines: io.StringIO) -> None:
    logs.log(logging.getLogger("runtime"), logging.WARNING, "odd", thing=object())
    (line,) = parsed(lines)
    assert line["thing"].startswith("<object object")


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_export_is_asked_for_by_the_standard_variables(env: dict[str, str], wanted: bool) -> None:
    assert export_requested(env) is wanted
