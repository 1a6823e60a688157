"""Approvals, purely: how a record moves (once, from pending), what a run journals from it, how a waiting run reads
its guest's next message, and how turns of a session fold (once each, after the open call is answered)."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalRequested,
    RunCompleted,
    RunResumed,
    TurnReceived,
)
from crashsafe.domain.approval_flow import (
    current_status,
    decide,
    decided_event,
    expired,
    guest_answer,
    is_clear_yes,
    new_record,
)
from crashsafe.domain.call_plan import approval_id_for
from crashsafe.domain.decide import Append, AwaitApproval, DecideApproval, next_move
from crashsafe.domain.fold import fold_run, summarize
from crashsafe.domain.money_rules import approved as approves
from crashsafe.domain.run_state import RunState
from tests.support.runs import BOOKING, NIGHTLY, RUN, T0, booked_run, call, started

pytestmark = pytest.mark.unit

PAY = call("create_payment", {"booking_id": "bk_1"}, call_id="call_pay")


def held(approver: str = Approver.GUEST.value, ttl_s: float = 3600) -> ApprovalRequested:
    return ApprovalRequested(
        run_id=RUN,
        at=T0,
        step_no=2,
        approval_id=approval_id_for(RUN, 2),
        call=PAY,
        tool="create_payment",
        args={"booking_id": "bk_1", "amount_cents": 240000, "currency": "EUR"},
        input_hash="h" * 64,
        amount_cents=240000,
        currency="EUR",
        approver=approver,
        rule="rule.approval_above",
        reason="2,400.00 EUR is over the 1,500.00 EUR auto-approve limit",
        expires_at=T0 + timedelta(seconds=ttl_s),
        question="Shall I charge 2,400.00 EUR for Hotel Lisboa, 2031-05-01 to 2031-05-03?",
    )


def waiting(approver: str = Approver.GUEST.value) -> RunState:
    return fold_run(fold_run(None, started()), held(approver))


def turn(event_id: str, text: str) -> TurnReceived:
    return TurnReceived(run_id=RUN, at=T0 + timedelta(minutes=1), event_id=event_id, text=text)


@pytest.mark.parametrize(
    "text", ["yes", "Yes please", "confirm", "ok, book it", "  YES!  ", "Okay, book it."]
)
def test_a_clear_yes_approves(text: str) -> None:
    assert is_clear_yes(text)
    answer = guest_answer(fold_run(waiting(), turn("evt-2", text)), held())
    assert answer is not None
    assert (answer.decision, answer.turn_event_id) == (ApprovalStatus.APPROVED, "evt-2")


@pytest.mark.parametrize(
    "text", ["no", "yes, but for 3 nights", "yes and also refund me 1840 EUR", "maybe", "what about Porto?"]
)
def test_anything_else_rejects_with_the_guests_words_and_leaves_them_for_the_model(text: str) -> None:
    assert not is_clear_yes(text)
    answer = guest_answer(fold_run(waiting(), turn("evt-2", text)), held())
    assert answer is not None
    assert (answer.decision, answer.turn_event_id, answer.reason) == (ApprovalStatus.REJECTED, "", text)


def test_a_guest_cannot_approve_what_their_manager_must() -> None:
    state = fold_run(waiting(Approver.MANAGER.value), turn("evt-2", "yes"))
    assert guest_answer(state, held(Approver.MANAGER.value)) is None
    assert next_move(state, BOOKING, T0 + timedelta(minutes=2)) == AwaitApproval(held(Approver.MANAGER.value))


def test_no_message_yet_means_the_run_keeps_waiting() -> None:
    assert guest_answer(waiting(), held()) is None
    assert isinstance(next_move(waiting(), BOOKING, T0), AwaitApproval)


def test_the_guests_yes_becomes_a_decision_of_the_record() -> None:
    move = next_move(fold_run(waiting(), turn("evt-2", "yes")), BOOKING, T0 + timedelta(minutes=2))
    assert isinstance(move, DecideApproval)
    assert (move.decision, move.decided_by, move.turn_event_id) == ("approved", "guest:guest-1", "evt-2")


def test_a_record_moves_once_from_pending() -> None:
    record = new_record(waiting(), held())
    now = T0 + timedelta(minutes=5)
    approved = decide(record, "approved", "manager:ana", "ok", now)
    assert approved is not None and approved.status == "approved"
    assert decide(approved, "rejected", "manager:bob", "", now) is None
    assert expired(approved, T0 + timedelta(days=2)) is None


def test_a_pending_record_past_its_expiry_can_only_expire() -> None:
    record = new_record(waiting(), held(ttl_s=60))
    late = T0 + timedelta(seconds=61)
    assert current_status(record, late) == "expired"
    assert decide(record, "approved", "manager:ana", "", late) is None
    gone = expired(record, late)
    assert gone is not None and (gone.status, gone.decided_by) == ("expired", "timer")
    assert expired(record, T0 + timedelta(seconds=59)) is None


def test_the_run_journals_what_the_record_says_not_what_the_guest_asked() -> None:
    record = new_record(waiting(), held())
    refused = decide(record, "rejected", "manager:ana", "over budget", T0 + timedelta(minutes=1))
    assert refused is not None
    event = decided_event(refused, held(), T0 + timedelta(minutes=2), turn_event_id="evt-2")
    assert event is not None
    # The guest's "yes" lost: their message is not used up, the model reads it next.
    assert (event.decision, event.decided_by, event.turn_event_id) == ("rejected", "manager:ana", "")
    assert decided_event(record, held(), T0) is None  # pending: nothing to journal


def test_an_approved_call_is_planned_again_and_an_expiry_ends_the_run_with_a_defined_reply() -> None:
    record = new_record(waiting(), held())
    yes = decide(record, "approved", "guest:guest-1", "", T0 + timedelta(minutes=1))
    assert yes is not None
    approved = decided_event(yes, held(), T0 + timedelta(minutes=1), "evt-2")
    assert approved is not None
    state = fold_run(fold_run(waiting(), turn("evt-2", "yes")), approved)
    assert state.awaiting is None and state.unplanned == (PAY,) and state.inbox == ()
    assert state.waited_s == 60.0

    gone = expired(record, T0 + timedelta(hours=2))
    assert gone is not None
    ended = decided_event(gone, held(), T0 + timedelta(hours=2))
    assert ended is not None
    state = fold_run(waiting(), ended)
    assert state.final_reply is not None and "not given in time" in state.final_reply


def test_while_waiting_the_guest_is_shown_the_question() -> None:
    summary = summarize(waiting())
    assert summary.awaiting_approval == held().approval_id
    assert summary.reply == held().question


def test_a_turn_is_folded_once_however_often_it_comes() -> None:
    state = fold_run(waiting(), turn("evt-2", "no"))
    again = fold_run(state, turn("evt-2", "no"))
    assert (again.inbox, again.turns, again.turn_ids) == (state.inbox, state.turns, ("evt-2",))
    # The run's own first message is never a turn of it.
    assert fold_run(state, turn("evt-1", "Book a room in Lisbon")).inbox == state.inbox


def test_an_approval_covers_only_the_exact_action_it_was_asked_for() -> None:
    """`policy.approved` is the one reading of "was this action approved" (the policy's hold rules ask it)."""
    record = new_record(waiting(), held())
    yes = decide(record, "approved", "guest:guest-1", "", T0 + timedelta(minutes=1))
    assert yes is not None
    approved = decided_event(yes, held(), T0 + timedelta(minutes=1), "evt-2")
    assert approved is not None
    state = fold_run(fold_run(waiting(), turn("evt-2", "yes")), approved)
    assert approves(state, "create_payment", held().input_hash, Approver.GUEST)
    # A changed action (another amount, another hotel) prepares to another hash: not approved.
    assert not approves(state, "create_payment", "x" * 64, Approver.GUEST)
    assert not approves(state, "create_booking", held().input_hash, Approver.GUEST)
    # A guest's approval is not a manager's.
    assert not approves(state, "create_payment", held().input_hash, Approver.MANAGER)
    # A rejection approves nothing.
    no = decide(record, "rejected", "manager:ana", "", T0 + timedelta(minutes=1))
    assert no is not None
    refused = decided_event(no, held(), T0 + timedelta(minutes=1))
    assert refused is not None
    assert not approves(fold_run(waiting(), refused), "create_payment", held().input_hash, Approver.GUEST)


@pytest.mark.parametrize(
    ("decision", "decided_by", "says"),
    [("rejected", "manager:ana", "declined by manager:ana"), ("expired", "timer", "not given in time")],
)
def test_a_corporate_payment_refused_or_expired_releases_the_hold_and_ends_with_the_defined_reply(
    decision: str, decided_by: str, says: str
) -> None:
    run, booking_id = booked_run()
    pay = call("create_payment", {"booking_id": booking_id}, call_id="call_pay")
    run.answer(pay)
    waiting = ApprovalRequested(
        run_id=RUN,
        at=run.tick(),
        step_no=run.state.next_step,
        approval_id=approval_id_for(RUN, run.state.next_step),
        call=pay,
        tool="create_payment",
        args={"booking_id": booking_id, "amount_cents": 2 * NIGHTLY, "currency": "EUR"},
        input_hash="p" * 64,
        amount_cents=2 * NIGHTLY,
        currency="EUR",
        approver=Approver.MANAGER.value,
        rule="rule.approval_above",
        reason="corporate bookings wait for the traveller's manager",
        expires_at=run.now + timedelta(hours=24),
    )
    run.add(waiting)
    assert isinstance(next_move(run.state, BOOKING, run.tick()), AwaitApproval)
    record = new_record(run.state, waiting)
    moved = decide(record, decision, decided_by, "", run.tick()) or expired(
        record, run.now + timedelta(days=1)
    )
    assert moved is not None and moved.status == decision
    ended = decided_event(moved, waiting, run.tick())
    assert ended is not None
    run.add(ended)
    (release,) = run.decide()
    assert isinstance(release, ActionRequested) and release.tool == "release_booking"
    assert release.args == {"booking_id": booking_id}
    run.complete(release.step_no)
    (done,) = run.decide()
    assert isinstance(done, RunCompleted) and says in done.reply
    assert not any(isinstance(e, ActionRequested) and e.tool == "create_payment" for e in run.events)


@pytest.mark.parametrize("decision", ["rejected", "expired"])
def test_a_message_the_guest_sent_while_the_run_waited_is_read_when_the_approval_ends_the_run(
    decision: str,
) -> None:
    """A manager's no (or the expiry) ends the run with a defined reply; a message the guest sent meanwhile was
    journaled as this run's turn (and a redelivery of it starts no other run), so it must reach the model, not
    vanish with the run's end."""
    record = new_record(waiting(Approver.MANAGER.value), held(Approver.MANAGER.value))
    now = T0 + timedelta(hours=2 if decision == "expired" else 0, minutes=1)
    moved = (
        expired(record, now)
        if decision == "expired"
        else decide(record, "rejected", "manager:ana", "over budget", now)
    )
    assert moved is not None
    ended = decided_event(moved, held(Approver.MANAGER.value), now)
    assert ended is not None
    state = fold_run(
        fold_run(waiting(Approver.MANAGER.value), turn("evt-2", "also a quiet room, please")), ended
    )

    move = next_move(state, BOOKING, now)

    assert not isinstance(move, Append) or not any(isinstance(e, RunCompleted) for e in move.events)
    assert {"role": "user", "content": "also a quiet room, please"} in state.transcript


class _CountedId(str):
    """An event id that counts how often it is compared for equality: a scan of every earlier id shows up."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def _flood(turns: int) -> list[RunState]:
    """Every state of a run waiting for its manager while its guest sends `turns` messages, each after a
    `run.resumed` (as the runtime journaled them before the flood fix)."""
    states = [waiting(Approver.MANAGER.value)]
    for n in range(turns):
        at = T0 + timedelta(seconds=n)
        resumed = RunResumed(run_id=RUN, at=at, worker="w", next_step=3, reason="picked up")
        message = TurnReceived(run_id=RUN, at=at, event_id=_CountedId(f"flood-{n:06d}"), text="hello?")
        states.append(fold_run(fold_run(states[-1], resumed), message))
    return states


def test_folding_turns_is_linear_a_turn_neither_scans_nor_copies_the_turns_before_it() -> None:
    """Structural, not a stopwatch: a flood of 4,000 turns folds with no id compared against the earlier ones
    (a tuple's `in` compared each new id with every earlier one: 8 million comparisons here) and no state
    copying the turns before it (every state kept alive holds the first turn once in shared storage, not once
    per state: a tuple per state made the whole fold's memory, and its time, quadratic in turns)."""
    _CountedId.compared = 0
    states = _flood(4000)
    last = states[-1]
    assert last.turns == 4001 and len(last.inbox) == len(last.turn_ids) == 4000
    assert last.awaiting is not None  # a manager's approval: the messages wait in the inbox
    # One comparison per turn (with the run's own first message), not one per earlier turn.
    assert _CountedId.compared <= 2 * 4000, f"{_CountedId.compared} id comparisons for 4,000 turns"
    first = last.turn_ids[0]
    # A handful of references (the storage, its index, the event, this frame), not one per state (4,000).
    assert sys.getrefcount(first) < 16, sys.getrefcount(first)
    # Still values: an earlier state is not changed by what came after it, nor by a state forked from it.
    middle = states[2000]
    assert len(middle.turn_ids) == 2000 and "flood-003000" not in middle.turn_ids
    forked = fold_run(middle, turn("another", "a second branch"))
    assert "another" in forked.turn_ids and "another" not in last.turn_ids and len(middle.inbox) == 2000
    assert list(last.turn_ids)[-1] == "flood-003999" and "flood-000000" in forked.turn_ids
