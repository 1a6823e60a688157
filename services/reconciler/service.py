"""The reconciler shell: follows accepted runs and journal milestones, reads a run's journal when something in it may
be due, asks executors to resolve overdue keys, wakes stalled runs."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import msgspec
from nats.aio.msg import Msg

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.headers import Header
from crashsafe.contracts.inbound import inbound_decoder
from crashsafe.contracts.run_events import (
    RUN_ENDS,
    RUN_WAITS,
    ApprovalRequested,
    RunCompleted,
    RunHandedOff,
    UnknownEvent,
    decode_event,
    event_type,
)
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.stream_routes import reconciler_routes
from crashsafe.contracts.streams import approvals_spec, projections_spec
from crashsafe.contracts.subjects import StreamKind
from crashsafe.domain import journal_looks as looks
from crashsafe.domain.open_work import (
    OpenWork,
    approval_wake_due,
    awaiting_runs,
    due_tickets,
    observe,
    overdue_actions,
    stalled_runs,
    unsettled_unknowns,
)
from crashsafe.domain.registry import Registry
from crashsafe.services.platform import metrics, probes, seam_checks
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import all_streams, require
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from, span
from crashsafe.services.reconciler.journal_archiver import JournalArchiver
from crashsafe.services.reconciler.projection_checks import ProjectionChecks
from crashsafe.services.records.approval_records import ApprovalRecords
from crashsafe.services.records.run_asks import wake_run
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.support_tickets import publish_ticket


class Reconciler:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        logger: logging.Logger,
        grace_s: float = 2.0,
        reask_s: float = 5.0,
        quiet_s: float = 30.0,
        lookback_s: float = 86_400.0,
        registry: Registry | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.ns = settings.namespace
        self.logger = logger
        self.work = OpenWork()
        self.grace_s, self.reask_s, self.quiet_s, self.lookback_s = grace_s, reask_s, quiet_s, lookback_s
        self.cadence = looks.Cadence(grace_s=grace_s, reask_s=reask_s, quiet_s=quiet_s)
        # Journals read per tick at most (the rest on later ticks, each judged only once read), and read in all.
        self.looks_per_tick = 500
        self.looks_read = 0
        self.resolutions = 0
        self.wakes = 0
        self.worker = f"reconciler:{settings.worker_id}"
        # How often waiting runs' approval records are read (one direct get per waiting run).
        self.approval_check_s = 5.0
        self._approvals_checked = datetime.min.replace(tzinfo=UTC)
        # Projections (seed 002): ended runs whose planned projections have no receipt are published again.
        self.journal = RunJournal(broker, self.ns)
        self.projection_checks = ProjectionChecks(broker, settings, logger, registry, self.journal)
        # Ended runs no message can reach, past the hot window: archived, then purged from the stream (issue 31).
        self.archiver = JournalArchiver(broker, settings, logger, registry, self.worker)
        self._unknown_tools: set[str] = set()
        self._since = datetime.min.replace(tzinfo=UTC)

    async def start(self) -> None:
        """Check its streams (StreamMissing) and prove its seams (SeamBroken) before it follows anything."""
        await require(self.broker, [*all_streams(self.ns), approvals_spec(self.ns).stream])
        await seam_checks.prove("reconciler", self.seams())
        since = datetime.now(UTC) - timedelta(seconds=self.lookback_s)
        self._since = since
        # Not every journal event: each accepted run's inbound message, and the milestones (ends, waits, late
        # receipts). A run's journal is read only when something in it may be due (`journal_looks`).
        await self.broker.follow(
            self.ns.stream(StreamKind.RUNS), self.ns.run_milestones_all, self._on_milestone, since
        )
        await self.broker.follow(
            self.ns.stream(StreamKind.INBOUND), self.ns.inbound_all, self._on_inbound, since
        )
        log(self.logger, logging.INFO, "reconciler ready")

    def ops_checks(self) -> dict[str, probes.Check]:
        """Readiness: NATS, every stream, the buckets it reads (approval records, projection receipts), and its
        seams. It follows milestones and accepted runs with ordered consumers of its own, which need no durable."""
        return {
            **probes.basic_checks(
                self.broker, all_streams(self.ns), [approvals_spec(self.ns), projections_spec(self.ns)]
            ),
            **self.seams(),
        }

    def seams(self) -> dict[str, probes.Check]:
        """Its wakes, tickets, re-published projection tasks and synthetic results land where it expects."""
        return seam_checks.route_checks(self.broker, reconciler_routes(self.ns))

    async def _on_inbound(self, msg: Msg) -> None:
        try:
            event = inbound_decoder.decode(msg.data)
        except msgspec.DecodeError:
            return  # not a message this version reads: the runtime dead-letters it, no run comes of it
        if event.received_at < self._since:
            return
        # A turn of a run already accepted: its own id starts a run only if the session's lane moved.
        if event.turn_of:
            looks.accepted(self.work, event.turn_of, event.received_at, self.cadence)
        turn = (event.turn_of, event.message.event_id) if event.turn_of else ("", "")
        looks.accepted(self.work, event.run_id, event.received_at, self.cadence, *turn)

    async def _on_milestone(self, msg: Msg) -> None:
        # Tolerant: an event type a newer writer added is an UnknownEvent, never a dead end for the projection.
        event = decode_event(msg.data)
        if event.at < self._since:
            return  # stored recently, written long ago: a journal copied by an upgrade (services/operations)
        run_id, now = event.run_id, datetime.now(UTC)
        # A milestone that neither ends its run nor makes it wait was appended after its end (`event_class`); the
        # runtime marks a late receipt so, and every such event is one the projector may plan again from.
        kind = event.type if isinstance(event, UnknownEvent) else event_type(event)
        after_end = (
            bool(msg.headers and msg.headers.get(Header.RUN_ENDED)) or kind not in RUN_ENDS | RUN_WAITS
        )
        self.projection_checks.observe(event, now, after_end, msg.metadata.sequence.stream)
        if isinstance(event, RunCompleted):
            observe(self.work, event)
            looks.ended(self.work, run_id, now)
        elif run_id in self.work.looks or isinstance(event, RunHandedOff | ApprovalRequested):
            # A hand-off (its pending actions become unknowns, its ticket names its parties) or a wait: the run's
            # journal read up to here, whether or not it was read before.
            unaccepted = run_id not in self.work.looks
            looks.accepted(self.work, run_id, event.at, self.cadence)
            try:
                await self._look(run_id, now)
            except CrashsafeError as exc:  # NATS away: read on the next tick, and judged only then
                looks.moved(self.work, run_id, now)
                log(self.logger, logging.WARNING, "journal read failed", run_id=run_id, error=exc.message)
            if unaccepted and run_id not in self.work.looks:
                looks.ended(self.work, run_id, now)  # read to its end before its inbound message was followed
        else:
            observe(self.work, event)  # a late receipt after the run ended: it may settle an unknown outcome

    async def _look(self, run_id: str, now: datetime) -> None:
        """Read the run's journal from where it was last read, observe what is new, and set its next look."""
        look = self.work.looks.get(run_id)
        if look is None:
            return
        try:
            stored = await self.journal.read_after(run_id, look.seen_seq)
            # Not its own run (yet): did the run it was sent to as a turn take it? Read on from where it was.
            turn = look.turn_of and not look.seen_seq
            owner = await self.journal.read_after(look.turn_of, look.owner_seq) if turn else []
        except msgspec.DecodeError as exc:
            # Corrupt, or a newer writer's value: named in the log and left alone (the runtime cannot fold it
            # either), never a reconciler that dies on every tick and again on every restart.
            log(self.logger, logging.ERROR, "journal unreadable", run_id=run_id, error=repr(exc))
            return looks.unreadable(self.work, run_id)
        # A tick's read and a milestone's race: what the other observed is not observed again (it would reopen).
        if self.work.looks.get(run_id) is not look:
            return
        for seq, event in (x for x in stored if x[0] > look.seen_seq):
            if event.at >= self._since:
                observe(self.work, event)
            look.seen_seq = seq
        self.looks_read += 1
        taken = not look.seen_seq and looks.turn_taken(look, owner)
        looks.looked(self.work, run_id, look.seen_seq, now, self.cadence, taken)

    async def run(self, stop: asyncio.Event, tick_s: float) -> None:
        """Tick every `tick_s` until `stop` is set; the archiver's passes beside, on their own cadence (a pass
        writes files and purges: it must not hold a tick back)."""
        archiving = asyncio.create_task(self.archiver.run(stop))
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=tick_s)
                except TimeoutError:
                    await self.tick()
        finally:
            await archiving

    async def tick(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        looks.forget_ended(self.work, now)
        for run_id in looks.due_looks(self.work, now, self.looks_per_tick):
            try:
                await self._look(run_id, now)
            except CrashsafeError as exc:
                # NATS away: the run is read on a later tick, and judged only once it has been.
                log(self.logger, logging.WARNING, "journal read failed", run_id=run_id, error=exc.message)
                break

        def current(run_id: str) -> bool:
            return looks.read_up_to_now(self.work, run_id, now)

        due = overdue_actions(self.work, now, self.grace_s, self.reask_s)
        overdue = [r for r in due if current(r.run_id)]
        unknown = [r for r in unsettled_unknowns(self.work, now, self.reask_s) if current(r.run_id)]
        asked: dict[str, list[str]] = {}
        for request in overdue + unknown:
            self.work.asked[request.key] = now
            self.work.times_asked[request.key] = self.work.times_asked.get(request.key, 0) + 1
            asked.setdefault(request.run_id, []).append(request.key)
        overdue_runs = {r.run_id for r in overdue}
        for run_id in sorted(asked):
            crash_point("reconciler.mid_resolution")
            # Only the runtime publishes action requests: the wake names the keys, the runtime re-sends them.
            keys = asked[run_id]
            reason = (
                f"{len(keys)} action(s) past their timeout with no outcome"
                if run_id in overdue_runs
                else f"{len(keys)} unknown outcome(s) to resolve by key"
            )
            # Each ask a trace of its own: the run's re-sent requests and their lookups by key hang under it.
            with span(
                SpanName.RECONCILER_ASK,
                context_from(None),
                run_id=run_id,
                outcome="overdue" if run_id in overdue_runs else "unknown",
                keys=len(keys),
            ) as ask:
                await wake_run(self.broker, self.settings, run_id, reason, self.worker, keys, ask)
            self.resolutions += len(keys)
        for run_id in filter(current, stalled_runs(self.work, now, self.quiet_s)):
            self.work.woken[run_id] = now
            await wake_run(
                self.broker,
                self.settings,
                run_id,
                f"journal quiet for {self.quiet_s:.0f}s with nothing in flight",
                self.worker,
            )
            self.wakes += 1
        for ticket in due_tickets(self.work, now, self.grace_s):
            # Idempotent: a ticket already standing refuses the second copy; one not taken is tried next tick.
            if await publish_ticket(self.broker, self.ns, ticket, self.logger):
                self.work.tickets.pop(ticket.run_id, None)
        await self._approval_backstop(now)
        await self.projection_checks.tick(now)
        self.report_unknowns()

    def report_unknowns(self) -> None:
        """crashsafe_unknown_outcomes_open by tool, from what this tick scanned (a tool back to none reads 0)."""
        counts: dict[str, int] = dict.fromkeys(self._unknown_tools, 0)
        for request in self.work.unknown.values():
            counts[request.tool] = counts.get(request.tool, 0) + 1
        for tool, count in counts.items():
            metrics.UNKNOWN_OUTCOMES_OPEN.labels(tool).set(count)
        self._unknown_tools.update(counts)

    async def _approval_backstop(self, now: datetime) -> None:
        """Runs waiting for an approval: woken if their record is decided but the journal does not say so yet,
        or if it is pending past its expiry (the timer's backstop). The run then asks the record itself."""
        if now - self._approvals_checked < timedelta(seconds=self.approval_check_s):
            return
        self._approvals_checked = now
        records = ApprovalRecords(self.broker, self.ns)
        for waiting in awaiting_runs(self.work):
            stored = await records.get(waiting.approval_id)
            status = stored.record.status if stored is not None else "pending"
            if approval_wake_due(self.work, waiting, status, waiting.expires_at, now, self.quiet_s):
                # Its journal read to now first: a decision the run has journaled since needs no wake.
                await self._look(waiting.run_id, now)
                run = self.work.runs.get(waiting.run_id)
                if run is None or run.awaiting != waiting:
                    continue
                self.work.woken[waiting.run_id] = now
                await wake_run(
                    self.broker,
                    self.settings,
                    waiting.run_id,
                    f"approval {waiting.approval_id} is {status}"
                    + (" past its expiry" if status == "pending" else ""),
                    self.worker,
                )
                self.wakes += 1
