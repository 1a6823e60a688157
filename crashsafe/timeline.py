"""Renders a run's journal as a timeline a person can read: what happened, in order, and where it resumed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    RunEvent,
    ModelAnswered,
    RunCompleted,
    RunHandedOff,
    RunResumed,
    RunStarted,
    ToolRejected,
)
from contracts.tool_messages import Via


def _short(value: Any, limit: int = 70) -> str:
    text = (
        value
        if isinstance(value, str)
        else ", ".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, dict)
        else str(value)
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(event: RunEvent) -> tuple[str, str, str]:
    """(step, what, detail) for one event."""
    match event:
        case RunStarted():
            return "", "started", f"guest {event.guest_id}: {_short(event.text)}"
        case ModelAnswered():
            if event.tool_calls:
                calls = "; ".join(f"{c.name}({_short(c.arguments, 50)})" for c in event.tool_calls)
                return str(event.step_no), "model", f"asks {calls}"
            return str(event.step_no), "model", f"replies: {_short(event.reply or '')}"
        case ActionRequested():
            return str(event.step_no), "intent", f"{event.tool} key={event.key} {_short(event.args, 60)}"
        case ToolRejected():
            return (
                str(event.step_no),
                "rejected",
                f"{event.tool}: {event.error.code}: {_short(event.error.message)}",
            )
        case ActionCompleted():
            how: str = {
                Via.CALL.value: "",
                Via.REPLAY.value: " (stored receipt)",
                Via.PROVIDER_LOOKUP.value: " (RECOVERED by provider lookup)",
            }.get(event.via, f" ({event.via})")
            ref = f" ref={event.provider_ref}" if event.provider_ref else ""
            extra = f" after {event.deliveries} deliveries" if event.deliveries > 1 else ""
            err = f" {event.error.code}" if event.error else ""
            return str(event.step_no), "receipt", f"{event.status}{err}{ref}{how}{extra}"
        case RunResumed():
            return str(event.next_step), "RESUMED", f"by {event.worker}: {event.reason}"
        case RunCompleted():
            return "", "completed", _short(event.reply, 90)
        case RunHandedOff():
            return "", "handed off", f"{event.reason}: {event.detail}"
    return "", type(event).__name__, ""


def timeline(events: list[tuple[int, RunEvent]], title: str = "") -> Table:
    table = Table(title=title or None, show_lines=False, expand=False)
    table.add_column("seq", justify="right", style="dim")
    table.add_column("time", style="dim")
    table.add_column("step", justify="right")
    table.add_column("event")
    table.add_column("detail", overflow="fold")
    first: datetime | None = events[0][1].at if events else None
    for seq, event in events:
        step, what, detail = describe(event)
        offset = f"+{(event.at - first).total_seconds():.3f}s" if first else ""
        style = (
            "bold yellow"
            if what in ("RESUMED",) or "RECOVERED" in detail
            else "bold green"
            if what == "completed"
            else "bold red"
            if what in ("handed off", "rejected")
            else ""
        )
        table.add_row(
            str(seq),
            offset,
            step,
            Text(what, style=style),
            Text(detail, style=style if "RECOVERED" in detail else ""),
        )
    return table
