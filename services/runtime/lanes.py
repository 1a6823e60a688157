"""Session lanes from the runtime's side: a finished run hands its session back and leaves its turn in history."""

from __future__ import annotations

from contracts.memory import SessionTurn
from services.runtime.core.state import RunState


class SessionLanes:
    async def history(self, tenant: str, session_id: str) -> list[SessionTurn]:
        """The session's earlier runs, for a run starting in it."""
        return []

    async def release(self, state: RunState) -> None:
        """The run ended: if it still owns its session, hand the session back (with this run in its history)."""
        return None
