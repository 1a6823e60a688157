"""Session lanes from the runtime's side: a finished run hands its session back and leaves its turn in history;
a message whose session's owner has ended takes the session over for its own run."""

from __future__ import annotations

import msgspec

from contracts.memory import SessionLane, SessionTurn
from contracts.subjects import Namespace
from services.platform.jetstream import Broker
from services.platform.sessions import SessionRecords, with_turn
from services.runtime.core.state import RunState


def finished_turn(state: RunState) -> SessionTurn:
    """An ended run as the next run of its session is told about it."""
    return SessionTurn(
        run_id=state.run_id, text=state.started.text[:1000], reply=(state.final_reply or "")[:1000]
    )


class SessionLanes:
    """Without a broker (unit tests of the runtime shell) a session has no memory and no owner."""

    def __init__(self, broker: Broker | None = None, ns: Namespace | None = None) -> None:
        self.records = SessionRecords(broker, ns) if broker is not None and ns is not None else None

    async def history(self, tenant: str, session_id: str) -> list[SessionTurn]:
        """The session's earlier runs, for a run starting in it."""
        if self.records is None or not tenant:
            return []
        lane, _ = await self.records.get(tenant, session_id)
        return list(lane.history)

    async def owner(self, tenant: str, session_id: str) -> str:
        if self.records is None or not tenant:
            return ""
        lane, _ = await self.records.get(tenant, session_id)
        return lane.run_id

    async def take_over(
        self, tenant: str, session_id: str, run_id: str, owner: str, ended: RunState | None
    ) -> str:
        """Make `run_id` the owner if the session is free, or still owned by `owner` (a run that has ended, with
        its turn `ended` added to the history, or one that never started). Returns the owner afterwards."""
        if self.records is None or not tenant:
            return run_id

        def take(lane: SessionLane) -> SessionLane | None:
            if lane.run_id not in ("", owner, run_id):
                return None  # someone else won the session meanwhile
            lane = with_turn(lane, finished_turn(ended)) if ended is not None else lane
            return msgspec.structs.replace(lane, run_id=run_id, turns=0)

        return (await self.records.change(tenant, session_id, take)).run_id

    async def release(self, state: RunState) -> None:
        """The run ended: if it still owns its session, hand the session back (with this run in its history)."""
        tenant = state.started.tenant
        if self.records is None or not tenant or not state.terminal:
            return

        def give_back(lane: SessionLane) -> SessionLane | None:
            lane = with_turn(lane, finished_turn(state))
            return msgspec.structs.replace(lane, run_id="", turns=0) if lane.run_id == state.run_id else lane

        await self.records.change(tenant, state.session_id, give_back)
