"""Which of a guest session's runs took a message as its turn, read from their journals: the runtime asks before it
takes a message that came again (never twice), the gateway before it answers a client's retry (with where it is).

Read first: the run the message's turn mark names (the last run it was handed to, `SessionRecords.mark_turn`), then
the run the gateway first answered it would join, the session's owner and its last finished runs. The mark finds
it however many runs the session has had since; the others find a message handed over before marks were written."""

from __future__ import annotations

from collections.abc import Iterable

from crashsafe.contracts.memory import SessionLane
from crashsafe.domain.fold import replay
from crashsafe.domain.run_state import RunState
from crashsafe.services.records.run_journal import RunJournal


async def turn_holder(
    journal: RunJournal, lane: SessionLane, event_id: str, first: Iterable[str], besides: str
) -> tuple[str, RunState] | None:
    """The run whose journal holds message `event_id` as a turn, with its state as folded now; None if no
    candidate took it (yet). `lane`: the session's record as the caller read it; `first`: runs to read before the
    lane's (the mark, the gateway's answer); `besides`: the message's own run, which a turn never is."""
    candidates = [*first, lane.run_id, *(turn.run_id for turn in reversed(lane.history))]
    for run_id in dict.fromkeys(candidates):
        if not run_id or run_id == besides:
            continue
        events, _ = await journal.read(run_id)
        state = replay(events)
        if state is not None and event_id in state.turn_ids:
            return run_id, state
    return None
