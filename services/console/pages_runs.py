"""The runs page and a run's page (with their live streams): what happened, in order, with its evidence.

Both read the RUNS stream as the API does (a tenant's key sees only its tenant's runs; another tenant's run is
not found, the very answer a run that does not exist gets) and follow it from the last sequence they rendered
(services/console/live.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import msgspec
from litestar import Request, Response, get
from litestar.response import ServerSentEvent, ServerSentEventMessage

from crashsafe.contracts.errors import CrashsafeError, InvalidSetting, RunNotFound
from crashsafe.contracts.headers import Header
from crashsafe.contracts.keys import is_run_id
from crashsafe.contracts.run_events import JournalEvent, RunStarted, RunStatus
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain.access import Client
from crashsafe.domain.fold import replay, summarize
from crashsafe.services.console.console_router import (
    PREFIX,
    SECURITY_HEADERS,
    render,
    session_of,
    still_signed_in,
    templates,
)
from crashsafe.services.console.live import (
    MAX_BEHIND,
    Follower,
    head_seq,
    resume_after,
    slots_of,
    stream_events,
)
from crashsafe.services.console.run_timeline import Entry, entry, trace_id_of
from crashsafe.services.operations.projection_receipts import Projection, projections_of_run
from crashsafe.services.operations.run_index import (
    RunFilter,
    RunRow,
    decoded_event,
    list_runs,
    parse_since,
    row_of,
)
from crashsafe.services.platform.jetstream import Broker, StoredMessage
from crashsafe.services.records.run_journal import RunJournal

LIMIT = 100  # runs on one page, newest first
MAX_FILTER = 200  # characters of one filter value (ids are far shorter)


def _fragment(name: str, **context: Any) -> str:
    """A piece of a page (a row, a journal entry) for a live stream: the same macros the page renders with."""
    return templates.get_template(name).render(prefix=PREFIX, **context)


def _param(request: Request[Any, Any, Any], name: str) -> str | None:
    value = request.query_params.get(name, "").strip()[:MAX_FILTER]
    return value or None


@dataclass(frozen=True, slots=True)
class Filters:
    """The runs page's filters as the form sent them (text, for the form and the stream URL) and as a filter."""

    form: dict[str, str]
    where: RunFilter
    problem: str = ""

    @classmethod
    def of(cls, request: Request[Any, Any, Any], client: Client) -> Filters:
        form = {k: v for k in ("status", "guest", "session", "since") if (v := _param(request, k))}
        problem = ""
        status = form.get("status")
        if status is not None and status not in set(RunStatus):
            problem, status = f"status {status!r} is not one of {', '.join(RunStatus)}", None
        since = None
        if "since" in form:
            try:
                since = parse_since(form["since"])
            except InvalidSetting:
                problem = f"since {form['since']!r}: a duration before now (30m, 2h, 7d) or an ISO 8601 time"
        where = RunFilter(
            status=status,
            guest=form.get("guest"),
            session=form.get("session"),
            since=since,
            # A tenant's key lists its own tenant's runs only; an admin's lists every tenant's.
            tenant=None if client.admin else client.tenant,
        )
        return cls(form=form, where=where, problem=problem)


def _ns(request: Request[Any, Any, Any]) -> Namespace:
    ns: Namespace = request.app.state.settings.namespace
    return ns


# The runs page ------------------------------------------------------------------------------------------------


@get("/runs")
async def runs_page(request: Request[Any, Any, Any]) -> Response[str]:
    session = await session_of(request)
    broker: Broker = request.app.state.broker
    ns = _ns(request)
    filters = Filters.of(request, session.client)
    # The stream's head before the listing: what is stored after it reaches the page by its live stream.
    after = await head_seq(broker, ns.stream(StreamKind.RUNS))
    rows: list[RunRow] = []
    if not filters.problem:
        w = filters.where
        rows, _ = await list_runs(
            broker,
            ns,
            status=w.status,
            guest=w.guest,
            since=w.since,
            session=w.session,
            tenant=w.tenant,
            limit=LIMIT,
        )
    query = urlencode({"after": after, **{k: v for k, v in filters.form.items() if k != "since"}})
    return render(
        "runs.html",
        session,
        page="runs",
        rows=rows,
        filters=filters.form,
        problem=filters.problem,
        statuses=list(RunStatus),
        limit=LIMIT,
        stream_url=f"{PREFIX}/runs/stream?{query}",
    )


@get("/runs/stream")
async def runs_stream(request: Request[Any, Any, Any]) -> ServerSentEvent:
    """Rows of the runs page as runs start and change: `run_new` (a run that now passes the filters and did not
    before: prepended) and `run_update` (an out-of-band replacement of its row)."""
    session = await session_of(request)
    broker: Broker = request.app.state.broker
    ns = _ns(request)
    where = Filters.of(request, session.client).where
    stream = ns.stream(StreamKind.RUNS)
    after = resume_after(request.headers, request.query_params, await head_seq(broker, stream) - MAX_BEHIND)

    async def render_batch(batch: list[StoredMessage], before: int) -> list[ServerSentEventMessage]:
        out: list[ServerSentEventMessage] = []
        touched = list(dict.fromkeys(ns.journal_run(m.subject) or "" for m in batch))
        for run_id in touched:
            if not is_run_id(run_id):
                continue  # not a run's subject (a hostile append): never rendered
            journal = await RunJournal(broker, ns).stored(run_id)
            now = row_of(run_id, journal)
            if now is None or not session.client.sees(now.tenant):
                continue
            earlier = [m for m in journal if m.seq <= before]
            was = row_of(run_id, earlier) if earlier else None
            passes, passed = where.passes(now), was is not None and where.passes(was)
            if passes and not passed:
                out.append(ServerSentEventMessage(event="run_new", data=_fragment("runs_row.html", r=now)))
            elif passed:
                html = _fragment("runs_row.html", r=now, oob=True)
                out.append(ServerSentEventMessage(event="run_update", data=html))
        return out

    return ServerSentEvent(
        stream_events(
            Follower(broker, stream, ns.run_events_all, after),
            render_batch,
            lambda: still_signed_in(request),
            slots_of(request.app.state),
            session.client.key_id,
        )
    )


# A run's page -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Journal:
    """A run's journal as stored: its events with their sequences and the trace each was written under."""

    run_id: str
    started: RunStarted
    stored: list[tuple[StoredMessage, JournalEvent]]

    @property
    def last_seq(self) -> int:
        return self.stored[-1][0].seq if self.stored else 0

    def entries(self) -> list[Entry]:
        return [
            entry(m.seq, e, self.started.at, trace_id_of(m.headers.get(Header.TRACEPARENT)))
            for m, e in self.stored
        ]


def _decoded(messages: list[StoredMessage]) -> list[tuple[StoredMessage, JournalEvent]]:
    return [(m, e) for m in messages if (e := decoded_event(m.data, m.subject)) is not None]


async def _journal(request: Request[Any, Any, Any], client: Client, run_id: str) -> Journal:
    """The run's journal if this client may see the run; RunNotFound (as the API answers) otherwise."""
    if not is_run_id(run_id):
        raise RunNotFound(f"{run_id[:64]!r} is not a run id (run_ + 24 hex digits)", run_id=run_id[:64])
    broker: Broker = request.app.state.broker
    ns = _ns(request)
    stored = _decoded(await RunJournal(broker, ns).stored(run_id))
    first = stored[0][1] if stored else None
    if not isinstance(first, RunStarted) or not client.sees(first.tenant):
        raise RunNotFound(run_id=run_id)
    return Journal(run_id=run_id, started=first, stored=stored)


def _summary(journal: Journal) -> dict[str, Any]:
    try:
        state = replay(e for _, e in journal.stored)
    except ValueError:
        state = None
    if state is None:
        return {"status": "unreadable"}
    summary: dict[str, Any] = msgspec.to_builtins(summarize(state))
    return summary


@get("/runs/{run_id:str}")
async def run_page(request: Request[Any, Any, Any], run_id: str) -> Response[str]:
    session = await session_of(request)
    journal = await _journal(request, session.client, run_id)
    entries = journal.entries()
    trace_ids = list(dict.fromkeys(e.trace_id for e in entries if e.trace_id))
    return render(
        "run.html",
        session,
        page="runs",
        run_id=run_id,
        started=journal.started,
        summary=_summary(journal),
        entries=entries,
        trace_id=trace_ids[0] if trace_ids else "",
        trace_ids=trace_ids,
        stream_url=f"{PREFIX}/runs/{run_id}/stream?after={journal.last_seq}",
    )


@get("/runs/{run_id:str}/stream")
async def run_stream(request: Request[Any, Any, Any], run_id: str) -> ServerSentEvent:
    """The run's new journal events as they are stored (`journal`: entries to append, with the run's status
    replaced out of band)."""
    session = await session_of(request)
    journal = await _journal(
        request, session.client, run_id
    )  # 404 before any stream for another tenant's run
    broker: Broker = request.app.state.broker
    ns = _ns(request)
    stream = ns.stream(StreamKind.RUNS)

    async def render_batch(batch: list[StoredMessage], before: int) -> list[ServerSentEventMessage]:
        trace_run = trace_id_of(journal.stored[0][0].headers.get(Header.TRACEPARENT))
        fresh = [
            entry(m.seq, e, journal.started.at, trace_id_of(m.headers.get(Header.TRACEPARENT)))
            for m, e in _decoded(batch)
        ]
        whole = _decoded(await RunJournal(broker, ns).stored(run_id))
        summary = _summary(Journal(run_id=run_id, started=journal.started, stored=whole))
        html = _fragment("run_entries.html", entries=fresh, summary=summary, trace_id=trace_run, oob=True)
        return [ServerSentEventMessage(event="journal", data=html)]

    return ServerSentEvent(
        stream_events(
            Follower(
                broker, stream, ns.run_events(run_id), resume_after(request.headers, request.query_params)
            ),
            render_batch,
            lambda: still_signed_in(request),
            slots_of(request.app.state),
            session.client.key_id,
        )
    )


# The run's projections (email, CRM, audit trail): their receipts, beside the journal ----------------------------


async def _projections(request: Request[Any, Any, Any], journal: Journal) -> tuple[list[Projection], bool]:
    """The projections the run's journal calls for and their receipts, and whether it is settled (the page stops
    asking): what `crashsafe projections list` reads, for one run."""
    events = [e for _, e in journal.stored]
    state = request.app.state
    return await projections_of_run(state.broker, _ns(request), state.registry, events, datetime.now(UTC))


@get("/runs/{run_id:str}/projections")
async def run_projections(request: Request[Any, Any, Any], run_id: str) -> Response[str]:
    """An HTML fragment the run page loads, and asks again while a projection is still on its way."""
    session = await session_of(request)
    journal = await _journal(request, session.client, run_id)
    try:
        projections, settled = await _projections(request, journal)
        problem = ""
    except CrashsafeError as exc:
        projections, settled, problem = [], False, exc.message
    html = _fragment(
        "run_projections.html", run_id=run_id, projections=projections, settled=settled, problem=problem
    )
    # A fragment is HTML too: opened on its own it gets the pages' policy (no framing, no foreign script).
    return Response(content=html, media_type="text/html", headers=SECURITY_HEADERS)


HANDLERS: list[Any] = [runs_page, runs_stream, run_page, run_stream, run_projections]
