"""The reconciler's archiver: ended runs that no message can reach any more leave `<ns>_RUNS` for the archive, a hot
window after their journal last moved (issue 31, months of runs; the rule is `domain/journal_archive.py`).

Each pass walks the journals' milestones (every run end is one) from where the last pass stopped, up to the hot
window's edge, a page at a time; a run found is read whole, judged, and, if due, written to the archive, read back
and compared, and only then purged (`<ns>.run.<run_id>.>`, up to the last sequence read: an event appended since
survives, and is merged into the archive on the next pass). Nothing is kept in between but the walk's cursor and
the runs to look at again: a restarted reconciler walks from the stream's first milestone, which the purges keep
short (what is left is what is kept). A crash between the archive write and the purge leaves both; the next pass
finds the run again, writes the same archive again and purges."""

from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.archive import ArchivedEvent, ArchivedJournal, archive_encoder, purge_filter
from crashsafe.contracts.errors import ArchiveUnavailable, CrashsafeError
from crashsafe.contracts.headers import Header
from crashsafe.contracts.projections import record_decoder
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.run_events import JournalEvent, RunStarted, decode_event
from crashsafe.contracts.streams import projections_spec
from crashsafe.contracts.subjects import StreamKind
from crashsafe.domain import journal_archive as rule
from crashsafe.domain import missing_projections as missing
from crashsafe.domain.fold import replay
from crashsafe.domain.registry import Registry
from crashsafe.services.platform.hook_limit import HookLimit, HookOverran
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_reads import StoredMessage
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.run_archive import Archive
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.rollout_facts import read_rollout
from crashsafe.services.records.run_journal import RunJournal

# Milestones read per round trip of the walk.
PAGE = 256


@dataclass
class Pass:
    """What one pass did: runs archived, runs kept by reason, and why none could be (`blocked`)."""

    archived: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    blocked: str | None = None
    failed: list[str] = field(default_factory=list)  # why a run could not be settled (tried again next pass)


class JournalArchiver:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        logger: logging.Logger,
        registry: Registry | None,
        worker: str,
    ) -> None:
        self.broker = broker
        self.ns = settings.namespace
        self.logger = logger
        self.registry = registry
        # The agents' `projections` hooks run under the process's time limit (set by the composition root).
        self.hook_limit = HookLimit(0.0)
        self.worker = worker
        self.archive: Archive | None = broker.archive
        self.window_s = settings.retention.journals_s
        self.batch = settings.retention.archive_batch
        self.every_s = settings.retention.archive_every_s
        self.journal = RunJournal(broker, self.ns)
        self.stream = self.ns.stream(StreamKind.RUNS)
        self.stale_s = missing.STALE_S * settings.projection_time_scale
        self.cursor = 0  # the last milestone sequence walked
        # Runs kept for a reason time alone can end (a hot window, an approval's expiry, unsettled projections), by
        # when to look again; a reason only the journal can end is looked at again when its next milestone is.
        self.again: dict[str, datetime] = {}
        self.archived = 0
        self._blocked: str | None = None

    @property
    def enabled(self) -> bool:
        """An archive is configured and journals are not kept forever."""
        return self.archive is not None and self.window_s > 0

    async def run(self, stop: asyncio.Event) -> None:
        """A pass every `every_s` until `stop` is set (none where archiving is off)."""
        if not self.enabled:
            return
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.every_s)
            except TimeoutError:
                try:
                    await self.run_pass(datetime.now(UTC))
                except (
                    CrashsafeError
                ) as exc:  # NATS or the volume away: the next pass starts where this stopped
                    log(self.logger, logging.WARNING, "journal archive pass failed", error=exc.message)

    async def run_pass(self, now: datetime) -> Pass:
        done = Pass()
        done.blocked = await self.blocked()
        if done.blocked is not None:
            if done.blocked != self._blocked:
                log(self.logger, logging.WARNING, "journals not archived", reason=done.blocked)
            self._blocked = done.blocked
            return done
        self._blocked = None
        for run_id in await self._candidates(now):
            try:
                reason = await self.settle(run_id, now)
            except CrashsafeError as exc:
                # NATS or the volume away, an archive that did not read back: nothing purged, tried next pass.
                self.again[run_id] = now + timedelta(seconds=self.every_s)
                done.failed.append(exc.message)
                log(self.logger, logging.WARNING, "journal not archived", run_id=run_id, error=exc.message)
                continue
            if reason is None:
                done.archived += 1
            else:
                done.kept[reason] = done.kept.get(reason, 0) + 1
        self.archived += done.archived
        if done.archived or done.kept:
            log(self.logger, logging.INFO, "journals archived", archived=done.archived, kept=done.kept)
        return done

    async def blocked(self) -> str | None:
        """Why nothing may be purged now (`rule.archiving_blocked`), from the versions bucket: the heartbeats live by
        the wall clock (a pass's `now` is the hot window's)."""
        facts = await read_rollout(self.broker, self.ns)
        if facts.unreadable:
            return facts.unreadable
        return rule.archiving_blocked(facts.contracted, facts.beats)

    async def _candidates(self, now: datetime) -> list[str]:
        """At most `batch` runs to judge: those due again, then those whose milestones the walk reaches, up to the
        hot window's edge (a milestone stored after it belongs to a run that cannot be due yet)."""
        edge = now - timedelta(seconds=self.window_s)
        due = heapq.nsmallest(self.batch, ((at, r) for r, at in self.again.items() if at <= now))
        found = dict.fromkeys(r for _, r in due)
        while len(found) < self.batch:
            page = await self.broker.read_page(self.stream, self.ns.run_milestones_all, self.cursor, PAGE)
            for message in page:
                if _stored_at(message) > edge or len(found) >= self.batch:
                    return list(found)
                run_id = self.ns.journal_run(message.subject)
                if run_id:
                    found.setdefault(run_id)
                    self.again.pop(run_id, None)  # judged now, from the journal as it stands
                self.cursor = message.seq
            if len(page) < PAGE:
                break
        return list(found)

    async def settle(self, run_id: str, now: datetime) -> str | None:
        """Judge one run; archive and purge it if it is due. None: archived (or found purged already); else why
        it is kept."""
        assert self.archive is not None
        self.again.pop(run_id, None)
        live_journal = await self.journal.live(run_id)
        if not live_journal:
            return None  # purged by an earlier pass whose milestone the walk met again
        # What the stream holds of a run whose journal it has from the start is the whole journal (an archive
        # written before a crash is written again). Only a remnant (an event stored after a purge had read the
        # journal; none is expected) is merged behind what the archive already holds.
        stored = live_journal
        if not _starts_a_run(live_journal[0]):
            earlier = [m for m in await self.journal.archived(run_id) if m.seq < live_journal[0].seq]
            stored = earlier + live_journal
        events: list[JournalEvent] = []
        try:
            events = [decode_event(m.data) for m in stored]
            state = replay(events)
        except Exception:  # noqa: BLE001 -- a journal nobody can fold is kept, never archived blind
            state = None
        last_at = _stored_at(stored[-1])
        verdict = rule.archive_verdict(state, last_at, now, self.window_s)
        if isinstance(verdict, rule.Keep):
            if verdict.until is not None:
                self.again[run_id] = verdict.until
            return verdict.reason.value
        kept = await self._projections_open(run_id, events, now)
        if kept is rule.Kept.PROJECTIONS_OPEN:
            self.again[run_id] = now + timedelta(seconds=max(self.stale_s, self.every_s))
        if kept is not None:
            return kept.value
        await self._archive(run_id, stored, now)
        # Up to the last sequence read: an event appended since (none is expected) stays, and the next pass merges.
        purged = await self.broker.purge_filter(
            self.stream, purge_filter(self.ns, run_id), before_seq=stored[-1].seq + 1
        )
        log(self.logger, logging.DEBUG, "journal archived", run_id=run_id, events=len(stored), purged=purged)
        return None

    async def _archive(self, run_id: str, stored: list[StoredMessage], now: datetime) -> None:
        """Write the journal to the archive and read it back: equal, or ArchiveUnavailable (nothing is purged)."""
        assert self.archive is not None
        journal = ArchivedJournal(
            run_id=run_id,
            namespace=self.ns.name,
            archived_at=now,
            archived_by=f"{VERSION} {self.worker}",
            events=[
                ArchivedEvent(
                    seq=m.seq,
                    subject=m.subject,
                    stored_at=m.headers.get(Header.TIME_STAMP, ""),
                    headers={k: v for k, v in m.headers.items() if not k.startswith("Nats-")},
                    event=msgspec.Raw(m.data),
                )
                for m in stored
            ],
        )
        data = archive_encoder.encode(journal)
        await self.archive.put(run_id, data)
        if await self.archive.get(run_id) != data:
            raise ArchiveUnavailable(
                f"{self.archive.name(run_id)} read back differs from what was written; nothing purged",
                archive=self.archive.name(run_id),
            )

    async def _projections_open(
        self, run_id: str, events: list[JournalEvent], now: datetime
    ) -> rule.Kept | None:
        """Why the run's projections keep its journal: one the journal calls for has no settled receipt (the
        projector or the reconciler's check may still need the journal), or its agent cannot say what it calls
        for. None: nothing open (no projections in this deployment: none can be)."""
        if self.registry is None or not self.registry.projections:
            return None
        try:
            tasks = self.hook_limit.run(missing.planned, self.registry, events, now) or []
        except (Exception, HookOverran) as exc:  # noqa: BLE001 -- an agent's `projections` hook: its fault, never the archiver's
            # Kept, never archived blind, and the pass goes on: an archiver that stopped here would stop for every
            # tenant, and its next life would walk into the same run first (as the reconciler's own check does).
            log(self.logger, logging.ERROR, "projection plan failed", run_id=run_id, error=repr(exc))
            return rule.Kept.UNREADABLE
        if not tasks:
            return None
        spec = projections_spec(self.ns)
        names = {(t.tool, t.key): self.ns.projection_record_key(t.tool, t.key) for t in tasks}
        found = await self.broker.kv_get_many(spec, list(names.values()))
        records = {}
        for task, name in names.items():
            entry = found[name]
            try:
                records[task] = record_decoder.decode(entry.value) if entry is not None else None
            except msgspec.DecodeError:
                return (
                    rule.Kept.PROJECTIONS_OPEN
                )  # a newer writer's receipt: not judged here, the run is kept
        return rule.Kept.PROJECTIONS_OPEN if rule.unsettled(tasks, records, now, self.stale_s) else None


def _starts_a_run(message: StoredMessage) -> bool:
    try:
        return isinstance(decode_event(message.data), RunStarted)
    except msgspec.DecodeError:
        return False


def _stored_at(message: StoredMessage) -> datetime:
    """When the server stored the message (`Nats-Time-Stamp`, nanoseconds cut to microseconds)."""
    raw = message.headers.get(Header.TIME_STAMP, "")
    if not raw:
        return datetime.now(UTC)  # an archive read before this field: never taken as old
    day, _, rest = raw.partition("T")
    clock, _, fraction = rest.rstrip("Z").partition(".")
    stamp = datetime.fromisoformat(f"{day}T{clock}+00:00")
    return stamp + timedelta(microseconds=int((fraction + "000000")[:6])) if fraction else stamp
