"""Session lanes from the runtime's side: a finished run hands its session back and leaves its turn (with its guest)
in history; a message whose session's owner has ended takes the session over for its own run; a run starting in
a session is given its own guest's earlier turns only."""

from __future__ import annotations

import msgspec

from crashsafe.contracts.memory import SessionLane, SessionTurn
from crashsafe.contracts.run_events import RunStarted, decode_event
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.run_state import RunState
from crashsafe.domain.session_lanes import finished_turn, handed_back, taken_over
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lane_records import SessionRecords

__all__ = ["SessionLanes", "finished_turn"]


class SessionLanes:
    """Without a broker (unit tests of the runtime shell) a session has no memory and no owner."""

    def __init__(self, broker: Broker | None = None, ns: Namespace | None = None) -> None:
        self.records = SessionRecords(broker, ns) if broker is not None and ns is not None else None

    async def history(
        self, tenant: str, session_id: str, guest_id: str, lane: SessionLane | None = None
    ) -> list[SessionTurn]:
        """The guest's own earlier runs in the session, for a run of theirs starting in it. A session's history is
        (tenant, guest, session)'s: another guest's turns in the same session id are never given (guarantee 8),
        so a session id reused by another guest starts clean. `lane`: the record as the run's own claim left it,
        read once already (only its owner adds to a history, so it is still the session's)."""
        if self.records is None or not tenant or not guest_id:
            return []
        if lane is None:
            lane, _ = await self.records.get(tenant, session_id)
        own: list[SessionTurn] = []
        for turn in lane.history:
            whose = turn.guest_id or await self._guest_of(turn.run_id)
            if whose == guest_id:
                own.append(msgspec.structs.replace(turn, guest_id=whose))
        return own

    async def _guest_of(self, run_id: str) -> str:
        """Whose run `run_id` was, from its journal's `run.started`, for a turn recorded before turns carried their
        guest; "" (nobody's: given to no one) when the journal is gone."""
        assert self.records is not None
        ns = self.records.ns
        first = await RunJournal(self.records.broker, ns).first(run_id)
        started = decode_event(first.data) if first is not None else None
        return started.guest_id if isinstance(started, RunStarted) else ""

    async def mark_turn(self, tenant: str, message_run_id: str, holder: str) -> None:
        if self.records is not None and tenant:
            await self.records.mark_turn(tenant, message_run_id, holder)

    async def turn_mark(self, tenant: str, message_run_id: str) -> str:
        if self.records is None or not tenant:
            return ""
        return await self.records.turn_mark(tenant, message_run_id)

    async def lane(self, tenant: str, session_id: str) -> SessionLane:
        if self.records is None or not tenant:
            return SessionLane()
        lane, _ = await self.records.get(tenant, session_id)
        return lane

    async def take_over(
        self,
        tenant: str,
        session_id: str,
        run_id: str,
        owner: str,
        ended: RunState | None,
        guest_id: str = "",
    ) -> SessionLane:
        """Make `run_id` (a message of `guest_id`) the owner if the session is free, or still owned by `owner` (a
        run that has ended, with its turn `ended` added to the history, or one that never started). Returns the
        lane afterwards."""
        if self.records is None or not tenant:
            return SessionLane(run_id=run_id)
        return await self.records.change(
            tenant, session_id, lambda lane: taken_over(lane, run_id, owner, ended, guest_id)
        )

    async def release(self, state: RunState) -> None:
        """The run ended: if it still owns its session, hand the session back (with this run in its history)."""
        tenant = state.started.tenant
        if self.records is None or not tenant or not state.terminal:
            return
        await self.records.change(tenant, state.session_id, lambda lane: handed_back(lane, state))
