"""The runs of a namespace at a glance, read from the RUNS stream by index: what `crashsafe runs list` prints and the
console's runs page shows.

It reads the RUNS stream by index before it reads any journal whole: one batched direct get of the last event of
every run (`multi_last`, paged), one direct get of each candidate run's first event (its `run.started`: agent,
guest, session, tenant, start), and the full journal, folded with the runtime's own fold, only for the runs it
lists. Asked for most runs (`limit=0`), it reads the stream once in large batches instead. With 500
search-hold-pay runs (bench/runs_list.py): the newest 50 in ~100 ms, reading a quarter of the messages; all 500
in the time of reading and folding everything (~340 ms).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.journal_bus import read_event
from crashsafe.contracts.run_events import (
    JournalEvent,
    RunCompleted,
    RunHandedOff,
    RunStarted,
    RunStatus,
)
from crashsafe.contracts.subjects import Namespace, StreamKind, receipt_family
from crashsafe.domain.fold import replay, summarize
from crashsafe.services.platform.jetstream import Broker, StoredMessage
from crashsafe.services.platform.jetstream_reads import TooManySubjects
from crashsafe.services.records.run_journal import RunJournal

# How many runs one `multi_last` page answers, and how many first-event reads are in flight at once.
PAGE = 500
CONCURRENT_READS = 32
# Asked for more than a quarter of the candidate runs, reading the whole stream in large batches is cheaper than
# an index read and a journal read per run (bench/runs_list.py measures both).
WHOLE_STREAM_RATIO = 4
_RELATIVE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`2h`, `30m`, `7d`, `90s` before now, or an ISO 8601 time (UTC if it names no zone)."""
    now = now or datetime.now(UTC)
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(**{_UNITS[relative["unit"]]: float(relative["n"])})
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidSetting(
            variable="--since", value=text, expected="a duration before now (30m, 2h, 7d) or an ISO 8601 time"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: str
    agent: str
    guest_id: str
    tenant: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    steps: int
    events: int
    session_id: str = ""

    def to_json(self) -> dict[str, object]:
        row = asdict(self)
        row["started_at"] = self.started_at.isoformat()
        row["ended_at"] = self.ended_at.isoformat() if self.ended_at else None
        return row


@dataclass(frozen=True, slots=True)
class ListStats:
    """What a listing read, so its cost can be seen (`--stats`)."""

    runs: int  # runs in the stream (subjects with a last event)
    first_reads: int  # run.started events read by direct get
    folded: int  # journals read whole and folded
    messages: int  # messages read in all


def decoded_event(data: bytes, subject: str) -> JournalEvent | None:
    """A stored journal message as its run's event (a receipt only as its subject's family wrote it); None for
    bytes that are no run event."""
    try:
        return read_event(data, receipt_family(subject))
    except (msgspec.DecodeError, ValueError):
        return None  # not a run event (a hostile append): the run is listed as unreadable, never a crash


def _ended_by(event: JournalEvent | None) -> str | None:
    """The status a last event settles on its own: a run's terminal event is its last unless something came
    after it (a late receipt, a nudge), in which case only the fold can tell."""
    match event:
        case RunCompleted():
            return RunStatus.COMPLETED.value
        case RunHandedOff():
            return RunStatus.HANDED_OFF.value
    return None


async def last_per_run(broker: Broker, ns: Namespace) -> dict[str, StoredMessage]:
    """The last message of every run, in one consistent snapshot of the stream (paged `multi_last`: the last of
    each of a run's subjects, of which the latest is the run's)."""
    stream = ns.stream(StreamKind.RUNS)
    try:
        lasts = await broker.last_on_each_subject(stream, ns.run_events_all, page=PAGE)
    except TooManySubjects:
        # More journal subjects than one snapshot answers (about 170 runs on the bus): the stream read once.
        lasts = await broker.read_subject(stream, ns.run_events_all, batch=1000)
    runs: dict[str, StoredMessage] = {}
    for message in lasts:
        run_id = ns.journal_run(message.subject)
        if run_id is not None and (run_id not in runs or runs[run_id].seq < message.seq):
            runs[run_id] = message
    return runs


def row_of(run_id: str, stored: list[StoredMessage]) -> RunRow | None:
    """A run's row from its whole journal, folded by the runtime's own fold (None: not a run's journal)."""
    events = [e for e in (decoded_event(m.data, m.subject) for m in stored) if e is not None]
    try:
        state = replay(events)
    except ValueError:
        return None  # its first event is no run.started: nothing a runtime wrote
    if state is None:
        return None
    summary = summarize(state)
    return RunRow(
        run_id=run_id,
        agent=state.agent,
        guest_id=state.guest_id,
        tenant=state.started.tenant,
        status=summary.status.value,
        started_at=state.started.at,
        ended_at=next((e.at for e in reversed(events) if _ended_by(e)), None),
        steps=summary.steps,
        events=len(stored),
        session_id=state.started.session_id,
    )


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What a listing keeps: every field that is set must match (a run of `tenant` only, if it is set)."""

    status: str | None = None
    guest: str | None = None
    since: datetime | None = None
    session: str | None = None
    tenant: str | None = None

    def started(self, event: RunStarted) -> bool:
        """What its run.started alone decides."""
        return (
            (self.guest is None or event.guest_id == self.guest)
            and (self.since is None or event.at >= self.since)
            and (self.session is None or event.session_id == self.session)
            and (self.tenant is None or event.tenant == self.tenant)
        )

    def passes(self, row: RunRow | None) -> bool:
        return (
            row is not None
            and (self.status is None or row.status == self.status)
            and (self.guest is None or row.guest_id == self.guest)
            and (self.since is None or row.started_at >= self.since)
            and (self.session is None or row.session_id == self.session)
            and (self.tenant is None or row.tenant == self.tenant)
        )


async def list_runs(
    broker: Broker,
    ns: Namespace,
    *,
    status: str | None = None,
    guest: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    session: str | None = None,
    tenant: str | None = None,
) -> tuple[list[RunRow], ListStats]:
    """The runs that pass the filters, newest first (at most `limit`; 0: all), and what it took to find them.

    With a page much smaller than the stream's runs it reads by index; asked for (nearly) every run, it reads
    the stream once in large batches instead, which is cheaper than a read per journal."""
    where = RunFilter(status=status, guest=guest, since=since, session=session, tenant=tenant)
    stream = ns.stream(StreamKind.RUNS)
    lasts = await last_per_run(broker, ns)
    messages = len(lasts)
    last_events = {run_id: decoded_event(m.data, m.subject) for run_id, m in lasts.items()}
    candidates = []
    for run_id, last in last_events.items():
        if since is not None and last is not None and last.at < since:
            continue  # its last event is older than `since`: it cannot have started after it
        known = _ended_by(last)
        if status is not None and known is not None and known != status:
            continue
        candidates.append(run_id)

    if not limit or limit * WHOLE_STREAM_RATIO >= len(candidates):
        by_run: dict[str, list[StoredMessage]] = {}
        stored_all = await broker.read_subject(stream, ns.run_events_all, batch=1000)
        for message in stored_all:
            owner = ns.journal_run(message.subject)
            if owner is not None:
                by_run.setdefault(owner, []).append(message)
        wanted = set(candidates)
        rows = [
            r for run_id, journal in by_run.items() if run_id in wanted for r in [row_of(run_id, journal)]
        ]
        kept = sorted(
            (r for r in rows if r is not None and where.passes(r)),
            key=lambda r: r.started_at,
            reverse=True,
        )
        stats = ListStats(
            runs=len(lasts), first_reads=0, folded=len(rows), messages=messages + len(stored_all)
        )
        return (kept[:limit] if limit else kept), stats

    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def first(run_id: str) -> tuple[str, JournalEvent | None]:
        async with gate:
            stored = await broker.first_on_subject(stream, ns.run_events(run_id))
        return run_id, decoded_event(stored.data, stored.subject) if stored else None

    starts: dict[str, RunStarted] = {}
    for run_id, event in await asyncio.gather(*(first(r) for r in candidates)):
        if not isinstance(event, RunStarted):
            continue  # not a run's journal (nothing a runtime wrote): left out
        if not where.started(event):
            continue
        starts[run_id] = event
    messages += len(candidates)
    newest = sorted(starts, key=lambda r: starts[r].at, reverse=True)

    async def folded(run_id: str) -> tuple[RunRow | None, int]:
        async with gate:
            stored = await RunJournal(broker, ns).stored(run_id)
        return row_of(run_id, stored), len(stored)

    found: list[RunRow] = []
    folds = 0
    # Fold in pages of the newest first until `limit` rows pass the status filter (only the running, and runs
    # with events after their end, can fail it here: the others were filtered by their last event).
    page = max(limit, CONCURRENT_READS)
    for start in range(0, len(newest), page):
        for row, read in await asyncio.gather(*(folded(r) for r in newest[start : start + page])):
            folds += 1
            messages += read
            if row is not None and where.passes(row):
                found.append(row)
        if len(found) >= limit:
            break
    stats = ListStats(runs=len(lasts), first_reads=len(candidates), folded=folds, messages=messages)
    return found[:limit], stats
