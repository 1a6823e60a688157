"""The reconciler's pure core (domain/open_work.py): the open-work projection folded from every journal,
and what in it is overdue, still unknown, or stalled at a given time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    Budget,
    RunCompleted,
    RunHandedOff,
    RunNudged,
    RunStarted,
    ToolCall,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.open_work import (
    OpenRun,
    OpenWork,
    approval_wake_due,
    awaiting_runs,
    observe,
    overdue_actions,
    stalled_runs,
    unsettled_unknowns,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
GRACE, REASK, QUIET = 2.0, 5.0, 30.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def started(run_id: str, t: float = 0.0) -> RunStarted:
    return RunStarted(
        run_id=run_id,
        at=at(t),
        agent="booking",
        session_id="s",
        guest_id="g",
        event_id=run_id,
        idempotency_key=run_id,
        input_hash="0" * 64,
        text="book",
        budget=Budget(),
        deadline_at=at(t + 90),
    )


def intent(run_id: str, step_no: int, t: float, timeout_s: float = 10.0) -> ActionRequested:
    return ActionRequested(
        run_id=run_id,
        at=at(t),
        step_no=step_no,
        call_id=f"call_{step_no}",
        tool="create_payment",
        family="payment",
        args={"booking_id": "bk_1"},
        key=f"{run_id}:{step_no}",
        input_hash="a" * 64,
        timeout_s=timeout_s,
        deadline_at=at(t + timeout_s),
    )


def done(
    request: ActionRequested, t: float, status: OutcomeStatus = OutcomeStatus.SUCCEEDED
) -> ActionCompleted:
    return ActionCompleted(
        run_id=request.run_id, at=at(t), step_no=request.step_no, key=request.key, status=status
    )


def fold(*events: object) -> OpenWork:
    work = OpenWork()
    for event in events:
        observe(work, event)  # type: ignore[arg-type]
    return work


def ask(work: OpenWork, request: ActionRequested, now: datetime) -> None:
    """What the reconciler shell records each time it asks an executor about a key."""
    work.asked[request.key] = now
    work.times_asked[request.key] = work.times_asked.get(request.key, 0) + 1


# observe: the open-work projection ----------------------------------------------------------------------------


def test_a_run_and_its_requested_actions_are_open_work() -> None:
    pay, email = intent("run_a", 6, t=3), intent("run_a", 8, t=4)

    work = fold(started("run_a"), pay, email)

    assert set(work.runs) == {"run_a"}
    assert work.runs["run_a"].pending == {6: pay, 8: email} and work.runs["run_a"].last_at == at(4)
    assert work.requests == {(pay.run_id, pay.key): pay, (email.run_id, email.key): email}
    assert work.unknown == {}


def test_a_completed_action_is_no_longer_open_and_its_asking_history_is_forgotten() -> None:
    pay = intent("run_a", 6, t=3)
    work = fold(started("run_a"), pay)
    ask(work, pay, at(20))

    observe(work, done(pay, t=21))

    assert work.runs["run_a"].pending == {} and work.runs["run_a"].last_at == at(21)
    assert (
        (pay.run_id, pay.key) not in work.requests
        and pay.key not in work.asked
        and pay.key not in work.times_asked
    )
    assert work.unknown == {}


def test_events_of_a_run_started_before_the_look_back_window_are_ignored() -> None:
    pay = intent("run_old", 6, t=3)

    work = fold(pay, RunNudged(run_id="run_old", at=at(5), by="r", reason="x"), done(pay, t=6))
    observe(work, RunCompleted(run_id="run_old", at=at(7), reply="done"))
    observe(work, RunHandedOff(run_id="run_older", at=at(7), reason="deadline"))

    assert work.runs == {} and work.requests == {} and work.unknown == {}


def test_a_completion_journaled_twice_is_folded_once() -> None:
    """An outcome redelivered can be journaled twice; the projection must take the second one in its stride."""
    pay = intent("run_a", 6, t=3)
    work = fold(started("run_a"), pay, done(pay, t=10))

    observe(work, done(pay, t=11))

    assert work.runs["run_a"] == OpenRun(last_at=at(11)) and work.requests == {} and work.unknown == {}


def test_other_events_only_move_the_runs_clock() -> None:
    work = fold(started("run_a"), RunNudged(run_id="run_a", at=at(12), by="r", reason="overdue"))
    assert work.runs["run_a"] == OpenRun(last_at=at(12))


def test_an_unknown_outcome_is_kept_past_the_end_of_its_run_until_it_settles() -> None:
    pay = intent("run_a", 6, t=3)
    work = fold(started("run_a"), pay, done(pay, t=15, status=OutcomeStatus.UNKNOWN))
    assert work.unknown == {(pay.run_id, pay.key): pay} and work.runs["run_a"].pending == {}

    observe(work, RunHandedOff(run_id="run_a", at=at(16), reason="outcome_unknown"))
    assert work.runs == {} and work.unknown == {
        (pay.run_id, pay.key): pay
    }  # a handed-off run still needs the truth

    ask(work, pay, at(30))
    observe(work, done(pay, t=31))  # found by key, late
    assert work.unknown == {} and pay.key not in work.times_asked


def test_a_run_ending_clears_its_work() -> None:
    pay, email = intent("run_a", 6, t=3), intent("run_b", 4, t=3)
    work = fold(started("run_a"), started("run_b"), pay, email)
    ask(work, pay, at(20))
    work.woken["run_a"] = at(20)

    observe(work, RunCompleted(run_id="run_a", at=at(21), reply="done"))

    assert set(work.runs) == {"run_b"}
    assert (
        pay.key not in work.asked and (pay.run_id, pay.key) not in work.requests and "run_a" not in work.woken
    )
    assert (email.run_id, email.key) in work.requests  # another run's work is untouched
    later = at(1000)
    assert overdue_actions(work, later, GRACE, REASK) == [email]
    assert stalled_runs(work, later, QUIET) == []  # run_b has an action in flight; run_a is gone
    observe(work, RunHandedOff(run_id="run_b", at=at(22), reason="deadline"))
    assert overdue_actions(work, later, GRACE, REASK) == [] and stalled_runs(work, later, QUIET) == []


# overdue_actions: past deadline plus grace, asked again with a growing pause ----------------------------------


def test_an_action_is_overdue_from_its_deadline_plus_grace() -> None:
    pay = intent("run_a", 6, t=3, timeout_s=10)  # deadline at 13 s
    work = fold(started("run_a"), pay)

    assert overdue_actions(work, at(14.999), GRACE, REASK) == []
    assert overdue_actions(work, at(15), GRACE, REASK) == [pay]
    assert overdue_actions(work, at(15), grace_s=0.0, reask_s=REASK) == [pay]
    assert overdue_actions(work, at(13), grace_s=0.0, reask_s=REASK) == [pay]


def test_an_overdue_action_is_asked_about_again_with_a_doubling_pause() -> None:
    pay = intent("run_a", 6, t=0, timeout_s=10)  # overdue from 12 s
    work = fold(started("run_a"), pay)

    asked_at: list[float] = []
    for second in range(0, 200):  # the shell ticks once a second and asks about whatever is due
        if overdue_actions(work, at(second), GRACE, REASK):
            asked_at.append(second)
            ask(work, pay, at(second))

    # First at the deadline plus grace, then after 10 s, 20 s, 40 s, 80 s (reask 5 s times 2^asks so far).
    assert asked_at == [12, 22, 42, 82, 162]


def test_every_overdue_action_is_found_whatever_comes_before_it() -> None:
    slow = intent("run_a", 6, t=0, timeout_s=100)  # not yet due at 50 s
    asked = intent("run_a", 7, t=0)  # due, but asked about 1 s ago
    due = intent("run_a", 8, t=0)
    work = fold(started("run_a"), slow, asked, due)
    ask(work, asked, at(49))

    assert overdue_actions(work, at(50), GRACE, REASK) == [due]


def test_the_pause_between_asks_is_at_most_five_minutes() -> None:
    pay = intent("run_a", 6, t=0)
    work = fold(started("run_a"), pay)
    work.asked[pay.key], work.times_asked[pay.key] = at(100), 10  # 5 s * 2^10 would be 85 minutes

    assert overdue_actions(work, at(399), GRACE, REASK) == []
    assert overdue_actions(work, at(400), GRACE, REASK) == [pay]


# unsettled_unknowns: unknown outcomes, in any run, asked about until they settle ------------------------------


def test_an_unknown_outcome_never_asked_about_is_due_at_once() -> None:
    pay = intent("run_a", 6, t=3)
    work = fold(started("run_a"), pay, done(pay, t=15, status=OutcomeStatus.UNKNOWN))

    assert unsettled_unknowns(work, at(15), REASK) == [pay]


def test_an_unknown_outcome_is_asked_about_again_with_a_doubling_pause_up_to_a_cap() -> None:
    pay = intent("run_a", 6, t=3)
    work = fold(started("run_a"), pay, done(pay, t=15, status=OutcomeStatus.UNKNOWN))
    ask(work, pay, at(20))  # asked once: the next ask after 10 s

    assert unsettled_unknowns(work, at(29.9), REASK) == []
    assert unsettled_unknowns(work, at(30), REASK) == [pay]
    ask(work, pay, at(30))
    assert unsettled_unknowns(work, at(49.9), REASK) == []
    assert unsettled_unknowns(work, at(50), REASK) == [pay]

    work.times_asked[pay.key] = 12
    assert unsettled_unknowns(work, at(30 + 299), REASK) == []
    assert unsettled_unknowns(work, at(30 + 300), REASK) == [pay]
    assert unsettled_unknowns(work, at(30 + 60), REASK, max_gap_s=60.0) == [pay]


def test_a_settled_or_never_unknown_outcome_is_not_asked_about() -> None:
    pay, email = intent("run_a", 6, t=3), intent("run_a", 7, t=3)
    work = fold(started("run_a"), pay, email, done(email, t=5, status=OutcomeStatus.FAILED))
    assert unsettled_unknowns(work, at(1000), REASK) == []

    observe(work, done(pay, t=15, status=OutcomeStatus.UNKNOWN))
    observe(work, done(pay, t=16, status=OutcomeStatus.SUCCEEDED))
    assert unsettled_unknowns(work, at(1000), REASK) == []


# stalled_runs: nothing in flight and a quiet journal ----------------------------------------------------------


def test_a_run_with_nothing_in_flight_and_a_quiet_journal_is_stalled() -> None:
    pay = intent("run_a", 6, t=3)
    work = fold(started("run_a"), pay, done(pay, t=10))

    assert stalled_runs(work, at(39.9), QUIET) == []
    assert stalled_runs(work, at(40), QUIET) == ["run_a"]


def test_a_run_waiting_on_an_action_is_not_stalled_however_quiet() -> None:
    work = fold(started("run_a"), intent("run_a", 6, t=3), started("run_b"))
    assert stalled_runs(work, at(10_000), QUIET) == ["run_b"]


def test_a_woken_run_is_woken_again_only_after_another_quiet_period() -> None:
    work = fold(started("run_a"), started("run_b", t=35))
    work.woken["run_a"] = at(40)

    assert stalled_runs(work, at(64.9), QUIET) == []
    assert stalled_runs(work, at(65), QUIET) == ["run_b"]  # quiet for 30 s and never woken
    assert stalled_runs(work, at(69.9), QUIET) == ["run_b"]  # run_a was woken at 40 s
    assert stalled_runs(work, at(70), QUIET) == ["run_a", "run_b"]


# Runs waiting for an approval ----------------------------------------------------------------------------------


def held(run_id: str, t: float, ttl_s: float) -> ApprovalRequested:
    return ApprovalRequested(
        run_id=run_id,
        at=at(t),
        step_no=2,
        approval_id=f"apr_{run_id}_2",
        call=ToolCall(call_id="call_pay", name="create_payment", arguments="{}"),
        tool="create_payment",
        args={},
        input_hash="a" * 64,
        approver="manager",
        rule="rule.approval_above",
        reason="over the limit",
        expires_at=at(t + ttl_s),
    )


def test_a_run_waiting_for_an_approval_is_not_stalled_however_quiet() -> None:
    waiting = held("run_a", 1, ttl_s=86_400)
    work = fold(started("run_a"), waiting)
    assert stalled_runs(work, at(10 * QUIET), QUIET) == []
    assert awaiting_runs(work) == [waiting]
    decided = ApprovalDecided(
        run_id="run_a",
        at=at(20),
        approval_id=waiting.approval_id,
        decision="approved",
        decided_by="manager:ana",
        input_hash=waiting.input_hash,
    )
    observe(work, decided)
    assert awaiting_runs(work) == [] and stalled_runs(work, at(20 + QUIET), QUIET) == ["run_a"]


def test_the_backstop_wakes_a_waiting_run_once_its_record_is_decided_or_past_expiry() -> None:
    waiting = held("run_a", 0, ttl_s=60)
    work = fold(started("run_a"), waiting)
    assert not approval_wake_due(work, waiting, "pending", waiting.expires_at, at(30), QUIET)
    # A gateway died between its compare-and-set and its wake: the record says approved, the journal not yet.
    assert approval_wake_due(work, waiting, "approved", waiting.expires_at, at(30), QUIET)
    # The durable timer never fired: pending past expiry.
    assert approval_wake_due(work, waiting, "pending", waiting.expires_at, at(61), QUIET)
    work.woken["run_a"] = at(61)
    assert not approval_wake_due(work, waiting, "pending", waiting.expires_at, at(62), QUIET)
    assert approval_wake_due(work, waiting, "pending", waiting.expires_at, at(61 + QUIET), QUIET)


def test_two_runs_left_unknown_on_one_business_key_are_each_asked_about_it() -> None:
    """A business key is asked by many runs: the unknown outcome of one run is watched for that run, and another
    run's receipt for the same key settles only that other run's."""
    charge = "charge:" + "c" * 64
    first = msgspec.structs.replace(intent("run_a", 6, t=3), key=charge)
    second = msgspec.structs.replace(intent("run_b", 2, t=5), key=charge)
    work = fold(
        started("run_a"),
        started("run_b", t=4),
        first,
        second,
        done(first, 20, OutcomeStatus.UNKNOWN),
        RunHandedOff(run_id="run_a", at=at(21), reason="outcome_unknown", detail="unknown"),
    )
    assert [r.run_id for r in unsettled_unknowns(work, at(22), REASK)] == ["run_a"]

    observe(work, done(second, 30))  # run_b's own ask was answered (the executor resolved it by key)

    assert [r.run_id for r in unsettled_unknowns(work, at(31), REASK)] == ["run_a"]
