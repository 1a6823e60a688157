"""A guest's message into its session's lane (the rule is `domain/session_lanes.py`): it starts its own run, or is
journaled as the next turn of the session's running one (which is then driven), or waits for the owner's run to
start, or takes an ended owner's session over. Messages of one session are taken one at a time, in order."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import msgspec
from opentelemetry.context import Context

from crashsafe.contracts.errors import PoisonMessage, RunVersionConflict, SessionOfAnotherGuest
from crashsafe.contracts.inbound import InboundEvent, inbound_decoder
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.subjects import StreamKind
from crashsafe.domain import intake
from crashsafe.domain.registry import Registry
from crashsafe.domain.session_lanes import Join, Owner, Refuse, Start, TakeOver, Wait, lane_move
from crashsafe.services.platform.logs import log
from crashsafe.services.records.guest_profiles import GuestProfiles
from crashsafe.services.records.run_catalog import RunCatalog
from crashsafe.services.records.turn_holders import turn_holder
from crashsafe.services.runtime import append_path
from crashsafe.services.runtime.append_path import RunAppends, Write
from crashsafe.services.runtime.drive_loop import DriveLoop
from crashsafe.services.runtime.held_runs import HeldRun
from crashsafe.services.runtime.lanes import SessionLanes


def utcnow() -> datetime:
    return datetime.now(UTC)


class GuestMessages:
    def __init__(
        self,
        *,
        appends: RunAppends,
        loop: DriveLoop,
        lanes: SessionLanes,
        profiles: GuestProfiles,
        catalog: RunCatalog,
        registry: Registry,
        logger: logging.Logger,
    ) -> None:
        self.appends = appends
        self.runs = appends.runs
        self.broker = appends.broker
        self.ns = appends.ns
        self.loop = loop
        self.lanes = lanes
        self.profiles = profiles
        self.catalog = catalog
        self.registry = registry
        self.logger = logger
        # One lock per guest session with messages in hand, and how many handlers share it.
        self._sessions: dict[str, tuple[asyncio.Lock, int]] = {}

    async def admit(self, event: InboundEvent, ctx: Context, redelivered: bool = False) -> None:
        """A guest message, in its session's lane. The lane record decides (compare-and-set), not the gateway's
        hint (`turn_of`), which may be stale by now.

        Messages of one session are taken one at a time, in the order they were delivered (the session's lock is
        taken before the first await, and asyncio's locks are fair)."""
        session = f"{event.tenant}/{event.message.session_id}"
        lock, users = self._sessions.get(session, (asyncio.Lock(), 0))
        self._sessions[session] = (lock, users + 1)
        try:
            async with lock:
                await self._admit(event, ctx, redelivered)
        finally:
            lock, users = self._sessions[session]
            if users <= 1:
                del self._sessions[session]
            else:
                self._sessions[session] = (lock, users - 1)

    async def _admit(self, event: InboundEvent, ctx: Context, redelivered: bool) -> None:
        for _ in range(append_path.MAX_CONFLICT_RETRIES):
            move, lane = await self._lane(event, ctx, redelivered)
            if move is None:
                return  # a turn of a run that has ended since: taken already
            if isinstance(move, Start):
                async with self.runs.lock(event.run_id):
                    await self.accept(event, ctx, lane)
                return
            owner = move.error.run_id if isinstance(move, Refuse) else move.owner
            if isinstance(move, Join):
                async with self.runs.lock(owner):
                    try:
                        if await self.join(owner, event, ctx):
                            return
                        continue  # the owner ended before the turn reached it: decide the lane again
                    except SessionOfAnotherGuest:
                        pass
            # Refused after the gateway's 202 (the session changed hands after it checked the guest): the message
            # must not answer another guest's run, nor be lost. It becomes its own run, outside the lane, unless
            # it came again and is a turn of one of the session's runs that ended before the other guest's began.
            if await self._taken_already(event, redelivered):
                return
            log(
                self.logger,
                logging.WARNING,
                "a turn of another guest's session starts its own run",
                run_id=event.run_id,
                owner=owner,
            )
            async with self.runs.lock(event.run_id):
                await self.accept(msgspec.structs.replace(event, turn_of=""), ctx)
            return
        raise RunVersionConflict(subject=self.ns.run_events(event.run_id), expected_seq=0)

    async def _taken_already(self, event: InboundEvent, redelivered: bool) -> bool:
        """A message that comes again (its handler died before the ack, or its ack wait ran out while it queued
        behind its session's other messages) may already be a turn of a run of its session that has ended since:
        never start a second run of it, nor join it to the session's next run. Asked only after the lane's owner
        was read: asked earlier, the run holding the turn could end between the question and the lane's answer.

        On a redelivery the journals are read of the run its turn mark names (the last run it was handed to), the
        run the gateway answered it would join (`turn_of`), the session's owner and its last finished runs
        (`records/turn_holders.py`). A first delivery reads its mark alone (one KV read, and a journal only if it
        was marked): its handler may have stalled past the ack wait (a paused process sends no heartbeat) while
        another replica took its redelivery."""
        if not event.tenant:
            return False
        # The journals, never this replica's cached copies: a run it holds waiting may have taken this very message
        # as a turn on another replica and ended there (the copy would say "not ended, not taken").
        marked = await self.lanes.turn_mark(event.tenant, event.run_id)
        if not redelivered and not marked:
            return False
        lane = await self.lanes.lane(event.tenant, event.message.session_id) if redelivered else SessionLane()
        first = (marked, event.turn_of) if redelivered else (marked,)
        found = await turn_holder(
            self.appends.journal, lane, event.message.event_id, first, besides=event.run_id
        )
        return found is not None and found[1].terminal  # (a run still active that holds it is driven again)

    async def _lane(
        self, event: InboundEvent, ctx: Context, redelivered: bool
    ) -> tuple[Start | Join | Refuse | None, SessionLane | None]:
        """What the message is in its session now: its own run's, the session's active run's next turn, refused
        that run (another guest's), or None: a turn of a run that has ended since. Takes the session over when
        the rule says so. With a Start, the lane record as read for it (None: not read), which the run's start
        reads its history from instead of asking the bucket again."""
        tenant, session = event.tenant, event.message.session_id
        if not tenant or event.run_id in self.runs:
            return Start(), None  # no tenant, no lane; or its run is held already
        if await self.broker.first_on_subject(
            self.ns.stream(StreamKind.RUNS), self.ns.run_events(event.run_id)
        ):
            return Start(), None  # it started its run already (a redelivery)
        message = event.message
        for _ in range(append_path.MAX_CONFLICT_RETRIES):
            record = await self.lanes.lane(tenant, session)
            lane = SessionLane(run_id=record.run_id)
            owner, sent = Owner(read=True), None
            if lane.run_id and lane.run_id != event.run_id:
                state = await self.appends.peek(lane.run_id)
                if state is None:
                    sent = await self.broker.last_on_subject(
                        self.ns.stream(StreamKind.INBOUND), self.ns.inbound(lane.run_id)
                    )
                owner = Owner(state=state, read=True, sent=sent is not None)
            move = lane_move(
                lane, run_id=event.run_id, guest_id=message.guest_id, session_id=session, owner=owner
            )
            # Asked after the owner's state was read, so every run that had ended by then is final: a message that
            # came again and is a turn of one is neither joined to the next owner nor started as its own run.
            if not isinstance(move, Start) and await self._taken_already(event, redelivered):
                return None, None
            match move:
                case Start():
                    return move, record
                case Join() | Refuse():
                    return move, None
                case Wait(owner=first) if sent is not None:
                    # The owner's own message is on its way: start its run now, so this turn joins it in order.
                    started = inbound_decoder.decode(sent.data)
                    async with self.runs.lock(first):
                        await self.accept(msgspec.structs.replace(started, turn_of=""), ctx)
                    return Join(first), None
                case TakeOver(owner=ended_owner, ended=ended):
                    won = await self.lanes.take_over(
                        tenant, session, event.run_id, ended_owner, ended, message.guest_id
                    )
                    if won.run_id == event.run_id:
                        return Start(), won
        return Start(), None

    async def join(self, owner: str, event: InboundEvent, ctx: Context) -> bool:
        """Journal the message as the owner's next turn (once per event id) and drive the owner; False if the
        owner has ended (the caller decides the lane again). Another guest's message is refused
        (SessionOfAnotherGuest): it must never answer this run's approval."""
        run = await self.appends.load(owner, ctx, what="a turn")
        if run is None:
            return False
        message = event.message

        async def take_turn(held: HeldRun | None, write: Write) -> bool:
            assert held is not None
            move = lane_move(
                SessionLane(run_id=owner),
                run_id=event.run_id,
                guest_id=message.guest_id,
                session_id=message.session_id,
                owner=Owner(state=held.state, read=True),
            )
            if isinstance(move, Refuse):
                raise move.error
            if not isinstance(move, Join):
                return False  # ended
            turn = intake.turn(held.state, event, utcnow())
            if turn:
                # Marked before it is journaled: if it comes again, it is found here however long the session
                # has gone on since (the lane remembers only its last few runs).
                await self.lanes.mark_turn(event.tenant, event.run_id, owner)
            await write(turn)
            return True

        run, joined = await self.appends.decided(run, take_turn, ctx)
        if joined:
            await self.loop.drive(run, ctx)
        return joined

    async def accept(self, event: InboundEvent, ctx: Context, lane: SessionLane | None = None) -> None:
        """Start the message's run (pinned to the catalog's current revision) and drive it. `lane`: its session's
        record as this message's own lane move read it, if it did."""
        run = self.runs.get(event.run_id)
        if run is None:
            event = intake.addressed(event, self.registry.default_agent)
            if event.agent not in self.registry.agents:
                raise PoisonMessage(f"inbound event names unknown agent {event.agent!r}", run_id=event.run_id)
            revision, config = self.catalog.current(event.agent)
            message = event.message
            profile = await self.profiles.read(event.tenant, message.guest_id) if config.memory else None
            history = await self.lanes.history(event.tenant, message.session_id, message.guest_id, lane)
            started = intake.run_started(
                event, utcnow(), revision=revision, config=config, profile=profile, history=history
            )
            await self._not_archived(event)
            run = await self.appends.start(started, ctx)
        await self.loop.drive(run, ctx)

    async def _not_archived(self, event: InboundEvent) -> None:
        """RunArchived for a message whose run was archived and purged: its start at sequence 0 would succeed on the
        empty subject and run it a second time. Asked only of a message old enough to name one: a run is archived
        a hot window after its journal last moved, so a message received within half of it cannot (the margin is
        for the clocks); with no window set, always."""
        window = self.broker.retention.journals_s
        if window and utcnow() - event.received_at < timedelta(seconds=window / 2):
            return
        await self.appends.journal.refuse_archived(event.run_id, "its inbound message")
