"""Structured JSON logs on stderr that carry run id, step and trace id, so one grep follows one guest."""

from __future__ import annotations

import logging
import sys
import threading
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()

# The run the current task is working for (set by a span that names one): stamped on lines that do not say.
_run_id: ContextVar[str] = ContextVar("crashsafe_run_id", default="")

# Libraries whose INFO is not an operator's business; their warnings and errors still come through, as JSON.
QUIET = (
    "nats",
    "httpx",
    "httpcore",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "litestar",
    "openai",
    "aiosqlite",
    "aiohttp",
    "asyncio",
    "urllib3",
    "opentelemetry",
)
# The OTLP exporter logs every failed batch; telemetry.py counts them and logs once per outage instead.
SILENT = ("opentelemetry.exporter",)


def bind_run(run_id: str) -> Token[str]:
    return _run_id.set(run_id)


def unbind_run(token: Token[str]) -> None:
    _run_id.reset(token)


def _trace_id() -> str:
    # Imported late: the tracing module imports this one (to bind the run).
    from crashsafe.services.platform import tracing

    return tracing.trace_id_of(tracing.current())


def iso(created: float) -> str:
    """`2026-12-01T18:00:00.123Z`: ISO 8601, UTC, milliseconds (what every log store parses without a hint)."""
    stamp = datetime.fromtimestamp(created, UTC)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{stamp.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": iso(record.created),
            "level": record.levelname.lower(),
            "service": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if "run_id" not in entry and (run_id := _run_id.get()):
            entry["run_id"] = run_id
        if not entry.get("trace_id") and (trace_id := _trace_id()):
            entry["trace_id"] = trace_id
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _encode(entry)


def _encode(entry: dict[str, Any]) -> str:
    try:
        return _encoder.encode(entry).decode()
    except (TypeError, msgspec.EncodeError):
        # A field a caller passed that JSON has no form for: its text, never a lost line.
        return _encoder.encode({k: v if _plain(v) else repr(v) for k, v in entry.items()}).decode()


def _plain(value: Any) -> bool:
    try:
        _encoder.encode(value)
    except (TypeError, msgspec.EncodeError):
        return False
    return True


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None, where: str = "process"
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("crashsafe").critical(f"uncaught exception in {where}", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None:
        return
    thread = args.thread.name if args.thread is not None else "a thread"
    _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback, f"thread {thread}")


def configure(service: str, level: str = "INFO") -> logging.Logger:
    """One JSON handler on the root logger: every library's line (uvicorn's, nats', asyncio's "Task exception
    was never retrieved", the warnings module's, an uncaught exception's) comes out as JSON, none as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in QUIET:
        library = logging.getLogger(noisy)
        library.handlers[:] = []  # a library's own handler would print plain text beside ours
        library.propagate = True
        library.setLevel(max(logging.WARNING, root.level))
    for name in SILENT:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    return logging.getLogger(service)


def log(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, msg, extra={"fields": fields})
