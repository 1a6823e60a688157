"""The session-lane rule: a message starts its own run, joins the session's active run, waits for the owner's run
to start, takes an ended (or never started) owner's session over, or is refused as another guest's; and the lane
record's changes."""

from __future__ import annotations

from crashsafe.contracts.errors import SessionOfAnotherGuest
from crashsafe.contracts.memory import SessionLane, SessionTurn
from crashsafe.contracts.run_events import RunCompleted
from crashsafe.domain.session_lanes import (
    HISTORY,
    Join,
    Owner,
    Refuse,
    Start,
    TakeOver,
    Wait,
    claimed,
    finished_turn,
    given_back,
    handed_back,
    lane_move,
    taken_over,
    with_turn,
)
from tests.support.runs import RUN, Run, started

MINE = "run-mine"


def _move(lane: SessionLane, owner: Owner, guest_id: str = "guest-1") -> object:
    return lane_move(lane, run_id=MINE, guest_id=guest_id, session_id="sess-1", owner=owner)


def _active() -> Run:
    return Run(started())  # guest-1's run RUN, not ended


def _ended() -> Run:
    run = _active()
    run.add(RunCompleted(run_id=RUN, at=run.tick(), reply="done"))
    return run


def test_a_message_whose_run_owns_the_lane_starts_it() -> None:
    assert _move(SessionLane(run_id=MINE), Owner()) == Start()


def test_a_free_lane_is_taken() -> None:
    assert _move(SessionLane(), Owner(read=True)) == TakeOver(owner="")


def test_at_the_gateway_a_turn_of_the_same_guest_joins_and_another_guests_is_refused() -> None:
    lane = SessionLane(run_id=RUN, guest_id="guest-1")
    assert _move(lane, Owner(guest_id="guest-1")) == Join(RUN)
    assert _move(lane, Owner()) == Join(RUN)  # the owner's guest not known yet: the runtime checks again
    refused = _move(lane, Owner(guest_id="guest-1"), guest_id="guest-2")
    assert isinstance(refused, Refuse) and isinstance(refused.error, SessionOfAnotherGuest)
    assert (refused.error.run_id, refused.error.session_id) == (RUN, "sess-1")


def test_at_the_runtime_an_active_owner_is_joined_by_its_guest_only() -> None:
    state = _active().state
    assert _move(SessionLane(run_id=RUN), Owner(state=state, read=True)) == Join(RUN)
    refused = _move(SessionLane(run_id=RUN), Owner(state=state, read=True), guest_id="guest-2")
    assert isinstance(refused, Refuse)


def test_an_ended_owner_is_taken_over_with_its_turn_whoever_its_guest_was() -> None:
    state = _ended().state
    for guest in ("guest-1", "guest-2"):
        assert _move(SessionLane(run_id=RUN), Owner(state=state, read=True), guest) == TakeOver(RUN, state)


def test_an_owner_not_started_is_waited_for_if_its_message_is_on_its_way_else_taken_over() -> None:
    lane = SessionLane(run_id=RUN)
    assert _move(lane, Owner(read=True, sent=True)) == Wait(RUN)
    assert _move(lane, Owner(read=True)) == TakeOver(RUN, None)


def test_a_claim_takes_only_a_free_lane() -> None:
    free = claimed(SessionLane(turns=3), MINE, "guest-1")
    assert free == SessionLane(run_id=MINE, guest_id="guest-1", turns=0)
    assert claimed(free, "run-other", "guest-2") is None


def test_a_take_over_is_fenced_by_the_owner_it_expected_and_keeps_the_ended_turn() -> None:
    ended = _ended().state
    lane = SessionLane(run_id=RUN, guest_id="guest-1", turns=2)
    taken = taken_over(lane, MINE, RUN, ended, "guest-1")
    assert taken is not None and (taken.run_id, taken.guest_id, taken.turns) == (MINE, "guest-1", 0)
    assert [t.run_id for t in taken.history] == [RUN]
    assert taken_over(SessionLane(run_id="run-other"), MINE, RUN, ended, "guest-1") is None


def test_an_ended_run_hands_its_lane_back_with_its_turn() -> None:
    ended = _ended().state
    back = handed_back(SessionLane(run_id=RUN, guest_id="guest-1", turns=4), ended)
    assert back is not None and (back.run_id, back.guest_id, back.turns) == ("", "", 0)
    assert back.history == [finished_turn(ended)]
    # A run outside the lane (another guest's turn made its own run) leaves the lane as it is.
    assert handed_back(SessionLane(run_id="run-other", guest_id="guest-2"), ended) is None


def test_a_lane_claimed_for_a_refused_run_is_given_back_only_if_still_its() -> None:
    assert given_back(SessionLane(run_id=MINE, guest_id="g", turns=1), MINE) == SessionLane()
    assert given_back(SessionLane(run_id="run-other"), MINE) is None


def test_history_keeps_each_run_once_and_the_last_few() -> None:
    lane = SessionLane()
    for i in range(HISTORY + 2):
        lane = with_turn(lane, SessionTurn(run_id=f"run-{i}", text="t"))
    lane = with_turn(lane, SessionTurn(run_id=f"run-{HISTORY + 1}", text="again"))
    assert [t.run_id for t in lane.history] == [f"run-{i}" for i in range(2, HISTORY + 2)]
