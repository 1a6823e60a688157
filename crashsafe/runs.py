"""`crashsafe runs list|show` and `crashsafe tail`: the runs of a namespace at a glance, one run's journal as a
timeline, and its events as they happen.

`runs list` prints what services/operations/run_index.py lists (by index before any journal is read whole; see
there for its cost), the listing the console's runs page shows too.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import msgspec
import nats.errors
from nats.aio.msg import Msg
from rich.console import Console

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.run_events import JournalEvent, RunEvent, RunStarted, UnknownEvent
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.deployment import settings_for
from crashsafe.domain.fold import replay, summarize
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.run_index import (
    ListStats,
    RunRow,
    decoded_event,
    last_per_run,
    list_runs,
    parse_since,
)
from crashsafe.services.operations.run_journals import run_journal
from crashsafe.services.platform.jetstream import Broker
from crashsafe.timeline import timeline

# The listing lives in services/operations/run_index.py (the console's runs page reads it too); re-exported here.
__all__ = [
    "ListStats",
    "RunRow",
    "last_per_run",
    "list_runs",
    "parse_since",
    "runs_list",
    "runs_show",
    "tail",
]


def _table(rows: Iterable[RunRow]) -> str:
    header = ("run", "agent", "guest", "status", "started", "ended", "steps")
    body = [
        (
            r.run_id,
            r.agent,
            r.guest_id,
            r.status,
            f"{r.started_at:%Y-%m-%d %H:%M:%S}",
            f"{r.ended_at:%H:%M:%S}" if r.ended_at else "-",
            str(r.steps),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *body]
    )


async def runs_list(
    state_dir: Path,
    status: str | None,
    guest: str | None,
    since: str | None,
    as_json: bool,
    limit: int,
    stats: bool = False,
) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-cli") as broker:
        rows, read = await list_runs(
            broker,
            settings.namespace,
            status=status,
            guest=guest,
            since=parse_since(since) if since else None,
            limit=limit,
        )
    if as_json:
        for row in rows:
            print(json.dumps(row.to_json()))
    elif rows:
        print(_table(rows))
    else:
        print("no runs" + (" match" if status or guest or since else ""))
    if stats:
        print(
            f"{len(rows)} shown of {read.runs} runs: read {read.messages} messages "
            f"({read.first_reads} first events, {read.folded} journals folded)",
            file=sys.stderr,
        )
    return 0


# tail -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TailFilter:
    run_id: str | None = None
    session_id: str | None = None
    types: tuple[str, ...] = ()  # event types, or shell patterns (`run.action_*`)

    def type_matches(self, event_type: str) -> bool:
        return not self.types or any(fnmatch.fnmatchcase(event_type, t) for t in self.types)


def _event_type(event: JournalEvent | None) -> str:
    if event is None:
        return "?"
    if isinstance(event, UnknownEvent):
        return event.type
    return str(event.__struct_config__.tag)


def _body(event: JournalEvent | None, data: bytes) -> dict[str, object]:
    if event is None or isinstance(event, UnknownEvent):
        try:
            decoded = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return {"type": "?", "undecodable": data[:200].decode(errors="replace")}
        return dict(decoded) if isinstance(decoded, dict) else {"type": "?", "value": decoded}
    return dict(msgspec.to_builtins(event))


def _line(seq: int, event: JournalEvent | None) -> str:
    from crashsafe.timeline import describe

    if event is None:
        return f"{seq:>8}  ?  (not a run event)"
    step, what, detail = ("", _event_type(event), "") if isinstance(event, UnknownEvent) else describe(event)
    at = f"{event.at.astimezone(UTC):%H:%M:%S.%f}"[:-3]
    return f"{seq:>8}  {at}  {event.run_id}  {step:>3}  {what:<10} {detail}".rstrip()


class Tail:
    """Follows the journals with an ordered consumer (no durable left behind) and prints what passes the filter."""

    def __init__(self, broker: Broker, ns: Namespace, where: TailFilter, as_json: bool) -> None:
        self.broker = broker
        self.ns = ns
        self.where = where
        self.as_json = as_json
        self._sessions: dict[str, str | None] = {}  # run id -> its session (from its run.started)
        self.printed = 0

    async def session_of(self, run_id: str, event: JournalEvent | None) -> str | None:
        if isinstance(event, RunStarted):
            self._sessions[run_id] = event.session_id
        if run_id not in self._sessions:
            stored = await self.broker.first_on_subject(
                self.ns.stream(StreamKind.RUNS), self.ns.run_events(run_id)
            )
            first = decoded_event(stored.data, stored.subject) if stored else None
            self._sessions[run_id] = first.session_id if isinstance(first, RunStarted) else None
        return self._sessions[run_id]

    async def on_message(self, msg: Msg) -> None:
        event = decoded_event(msg.data, msg.subject)
        run_id = self.ns.journal_run(msg.subject) or ""
        if self.where.run_id and run_id != self.where.run_id:
            return
        if not self.where.type_matches(_event_type(event)):
            return
        if self.where.session_id and await self.session_of(run_id, event) != self.where.session_id:
            return
        seq = msg.metadata.sequence.stream
        if self.as_json:
            print(json.dumps({"seq": seq, **_body(event, msg.data)}, default=str), flush=True)
        else:
            print(_line(seq, event), flush=True)
        self.printed += 1


async def tail(
    state_dir: Path,
    run_id: str | None,
    session_id: str | None,
    types: list[str],
    as_json: bool,
    since: str | None,
) -> int:
    settings = settings_for(state_dir)
    where = TailFilter(run_id=run_id, session_id=session_id, types=tuple(types))
    async with operator_broker(settings, "crashsafe-tail") as broker:
        return await _follow(broker, settings.namespace, where, as_json, since)


async def _follow(broker: Broker, ns: Namespace, where: TailFilter, as_json: bool, since: str | None) -> int:
    """Print matching events until SIGINT or SIGTERM: a run's from its start (`--run`), else from now
    (`--since` reaches back)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    start = (
        parse_since(since)
        if since
        else (datetime(1970, 1, 1, tzinfo=UTC) if where.run_id else datetime.now(UTC))
    )
    subject = ns.run_events(where.run_id) if where.run_id else ns.run_events_all
    follower = Tail(broker, ns, where, as_json)
    try:
        await broker.follow(ns.stream(StreamKind.RUNS), subject, follower.on_message, since=start)
    except (nats.errors.Error, TimeoutError) as exc:
        raise BrokerUnavailable(f"cannot follow {subject}: {exc}; check that NATS runs") from exc
    await stop.wait()
    return 0


# runs show -------------------------------------------------------------------------------------------------------


async def runs_show(state_dir: Path, run_id: str, as_json: bool) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-cli") as broker:
        events = await run_journal(broker, settings.namespace, run_id)
    console = Console()
    if not events:
        # One plain line on stderr: a console would wrap it at the terminal's width.
        print(
            f"crashsafe: no run {run_id} in namespace {settings.namespace.name} at {settings.nats_url}",
            file=sys.stderr,
        )
        return 1
    if as_json:
        for seq, event in events:
            body = (
                msgspec.json.decode(event.data)
                if isinstance(event, UnknownEvent)
                else msgspec.to_builtins(event)
            )
            print(json.dumps({"seq": seq, **body}))
        return 0
    # The timeline names an event type it does not know by its class; the note below says which tag it was.
    console.print(timeline(cast(list[tuple[int, RunEvent]], events), title=f"run {run_id}"))
    unknown = sorted({e.type for _, e in events if isinstance(e, UnknownEvent)})
    if unknown:
        console.print(f"[yellow]kept but not understood by this version:[/yellow] {', '.join(unknown)}")
    state = replay(e for _, e in events)
    assert state is not None
    s = summarize(state)
    console.print(f"status [bold]{s.status}[/bold], {s.steps} steps, {s.tokens_used} tokens")
    return 0
