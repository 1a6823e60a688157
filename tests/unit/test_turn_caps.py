"""A run's caps at the door (services/gateway/turns.py), purely: a message joins the session's run as its next turn
only below the run's turn cap (else 409) and while fewer than the inbox cap of its messages wait unread (else 429
with Retry-After); a refused message changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from crashsafe.contracts.errors import RunInboxFull, TurnLimitReached
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.run_events import TurnReceived
from crashsafe.domain.admission import status_for
from crashsafe.domain.fold import fold_run
from crashsafe.domain.run_state import RunState
from crashsafe.services.gateway.turns import INBOX_RETRY_AFTER_S, TurnCaps, counted, unread
from tests.support.runs import RUN, T0, started

pytestmark = pytest.mark.unit

CAPS = TurnCaps(per_run=5, inbox=3)


def _with_turns(n: int) -> RunState:
    """A run with nothing open that took `n` turns: it reads each at once."""
    state = fold_run(None, started())
    for i in range(n):
        state = fold_run(
            state, TurnReceived(run_id=RUN, at=T0 + timedelta(seconds=i), event_id=f"t{i}", text="hi")
        )
    return state


def test_a_turn_is_counted_while_the_run_has_room() -> None:
    lane = SessionLane(run_id=RUN, turns=1)
    state = fold_run(None, started())
    after = counted(lane, RUN, CAPS, state, "s-1")
    assert after is not None and after.turns == 2 and after.run_id == RUN


def test_past_the_turn_cap_a_message_is_a_409_naming_the_run_and_the_cap() -> None:
    lane = SessionLane(run_id=RUN, turns=5)
    with pytest.raises(TurnLimitReached) as refused:
        counted(lane, RUN, CAPS, fold_run(None, started()), "s-1")
    assert status_for(refused.value) == 409
    assert refused.value.details() == {"run_id": RUN, "session_id": "s-1", "cap": 5}
    assert refused.value.code.value == "turn_limit_reached"


def test_unread_messages_past_the_inbox_cap_are_a_429_with_retry_after() -> None:
    # Three turns accepted, none journaled yet (the run has not taken them): all three wait unread.
    lane = SessionLane(run_id=RUN, turns=3)
    assert unread(3, fold_run(None, started())) == 3 and unread(3, None) == 3
    with pytest.raises(RunInboxFull) as refused:
        counted(lane, RUN, CAPS, fold_run(None, started()), "s-1")
    assert status_for(refused.value) == 429 and refused.value.retry_after_s == INBOX_RETRY_AFTER_S
    assert refused.value.details()["waiting"] == 3 and refused.value.code.value == "run_inbox_full"


def test_turns_the_model_has_read_free_the_inbox() -> None:
    # Three accepted and journaled by a run with nothing open: read at once, nothing waits.
    state = _with_turns(3)
    assert unread(3, state) == 0
    after = counted(SessionLane(run_id=RUN, turns=3), RUN, CAPS, state, "s-1")
    assert after is not None and after.turns == 4


def test_a_session_whose_owner_changed_is_left_to_the_runtime() -> None:
    assert counted(SessionLane(run_id="run_other", turns=9), RUN, CAPS, None, "s-1") is None
    assert counted(SessionLane(), RUN, CAPS, None, "s-1") is None
