"""Renders a run's journal as a timeline a person can read: what happened, in order, and where it resumed.

The words for each event (`describe`) are the console's too: services/console/run_timeline.py holds them."""

from __future__ import annotations

from datetime import datetime

from rich.table import Table
from rich.text import Text

from crashsafe.contracts.run_events import RunEvent
from crashsafe.services.console.run_timeline import describe

__all__ = ["describe", "timeline"]


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
