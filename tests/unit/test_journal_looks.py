"""When the reconciler reads a run's journal (domain/journal_looks.py): a run that ends in time is never read; a
late one is read exactly when a detector could act on it, and judged only once read."""

from __future__ import annotations

from datetime import timedelta

from crashsafe.contracts.run_events import RunCompleted, RunHandedOff, TurnReceived
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain import journal_looks as looks
from crashsafe.domain.open_work import OpenWork, observe, overdue_actions, stalled_runs
from tests.unit.test_reconciler_core import GRACE, QUIET, REASK, at, done, held, intent, started

CADENCE = looks.Cadence(grace_s=GRACE, reask_s=REASK, quiet_s=QUIET)


def read(work: OpenWork, run_id: str, now: float, *events: object, seq: int = 0) -> None:
    """What the shell does on a look: observe what the journal holds past the last read, then schedule the next."""
    for event in events:
        observe(work, event)  # type: ignore[arg-type]
    looks.looked(work, run_id, seq or len(events), at(now), CADENCE)


def test_an_accepted_run_is_first_read_a_little_later_and_not_before() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    assert looks.due_looks(work, at(CADENCE.first_s - 0.1), 10) == []
    assert looks.due_looks(work, at(CADENCE.first_s), 10) == ["run_a"]


def test_a_run_that_ends_before_its_first_look_is_never_read() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    observe(work, RunCompleted(run_id="run_a", at=at(1), reply="done"))
    looks.ended(work, "run_a", at(1))
    assert looks.due_looks(work, at(3600), 10) == []


def test_accepting_a_run_twice_keeps_its_first_schedule() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    looks.accepted(work, "run_a", at(50), CADENCE)
    assert work.looks["run_a"].next_at == at(CADENCE.first_s)


def test_a_pending_action_is_read_again_when_it_could_be_overdue() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    pay = intent("run_a", 1, t=1, timeout_s=10)
    read(work, "run_a", 3, started("run_a"), pay)
    assert work.looks["run_a"].next_at == pay.deadline_at + timedelta(seconds=GRACE)
    # Judged only once read: until then, the detector's answer about this run is not acted on.
    now = pay.deadline_at + timedelta(seconds=GRACE)
    assert looks.due_looks(work, now, 10) == ["run_a"]
    assert not looks.read_up_to_now(work, "run_a", now)
    read(work, "run_a", (now - at(0)).total_seconds(), seq=9)  # nothing new: still pending
    assert looks.read_up_to_now(work, "run_a", now)
    assert overdue_actions(work, now, GRACE, REASK) == [pay]


def test_a_completed_action_moves_the_next_look_to_when_the_journal_would_be_quiet() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    pay = intent("run_a", 1, t=1)
    read(work, "run_a", 3, started("run_a"), pay, done(pay, t=2))
    assert work.looks["run_a"].next_at == at(2 + QUIET)
    assert stalled_runs(work, at(2 + QUIET), QUIET) == ["run_a"]


def test_looks_at_one_run_are_spaced_at_least_a_second_and_at_most_a_quiet_period_apart() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    overdue = intent("run_a", 1, t=0, timeout_s=0.1)
    read(work, "run_a", 30, started("run_a"), overdue)
    assert work.looks["run_a"].next_at == at(30 + CADENCE.least_s)
    slow = intent("run_b", 1, t=0, timeout_s=3600)
    looks.accepted(work, "run_b", at(0), CADENCE)
    read(work, "run_b", 3, started("run_b"), slow)
    # A slow action, nothing else due before its deadline: read once every quiet period meanwhile.
    assert work.looks["run_b"].next_at == at(3 + QUIET)
    read(work, "run_b", 40, seq=9)
    assert work.looks["run_b"].next_at == at(40 + QUIET)


def test_a_run_read_and_ended_is_read_no_more() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    read(work, "run_a", 3, started("run_a"), RunCompleted(run_id="run_a", at=at(2), reply="done"))
    assert "run_a" not in work.looks


def test_a_hand_off_read_with_its_journal_leaves_its_pending_action_asked_about() -> None:
    work = OpenWork()
    pay = intent("run_a", 1, t=1)
    looks.accepted(work, "run_a", at(5), CADENCE)  # the hand-off, followed before any look
    handed = RunHandedOff(run_id="run_a", at=at(5), reason="deadline", detail="past its deadline")
    read(work, "run_a", 5, started("run_a"), pay, handed)
    assert ("run_a", pay.key) in work.unknown
    assert "run_a" not in work.looks and "run_a" not in work.runs


def test_an_unknown_outcome_read_from_the_journal_is_watched() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    pay = intent("run_a", 1, t=1)
    read(work, "run_a", 3, started("run_a"), pay, done(pay, t=2, status=OutcomeStatus.UNKNOWN))
    assert ("run_a", pay.key) in work.unknown


def test_a_run_not_started_yet_is_read_again_with_a_growing_pause_and_let_go_in_the_end() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    read(work, "run_a", 3, seq=0)
    first = work.looks["run_a"].next_at
    read(work, "run_a", (first - at(0)).total_seconds(), seq=0)
    second = work.looks["run_a"].next_at
    assert (second - first) > (first - at(3))
    looks.looked(work, "run_a", 0, at(CADENCE.forget_unstarted_s), CADENCE)
    assert "run_a" not in work.looks


def test_a_turns_own_id_is_let_go_once_the_run_it_was_sent_to_journaled_it_as_a_turn() -> None:
    work = OpenWork()
    looks.accepted(work, "run_turn", at(0), CADENCE, turn_of="run_a", event_id="ev_2")
    look = work.looks["run_turn"]
    other = TurnReceived(run_id="run_a", at=at(1), event_id="ev_1", text="hello")
    assert not looks.turn_taken(look, [(7, other)])
    assert look.owner_seq == 7  # the run's journal is read on from there next time
    looks.looked(work, "run_turn", 0, at(3), CADENCE)
    assert "run_turn" in work.looks
    mine = TurnReceived(run_id="run_a", at=at(2), event_id="ev_2", text="and a sea view")
    assert looks.turn_taken(look, [(9, mine)])
    looks.looked(work, "run_turn", 0, at(9), CADENCE, taken=True)
    assert "run_turn" not in work.looks


def test_a_turn_the_runtime_takes_late_and_starts_as_its_own_run_is_still_read() -> None:
    """A backlog (the runtime down for a quarter of an hour): the session's run ended meanwhile, so the turn
    starts its own run when the runtime takes it. It must still be watched (its stall woken, its actions asked
    about): only a journaled turn lets its id go before `forget_unstarted_s`."""
    work = OpenWork()
    looks.accepted(work, "run_turn", at(0), CADENCE, turn_of="run_a", event_id="ev_2")
    while work.looks["run_turn"].next_at < at(900):
        looks.looked(work, "run_turn", 0, work.looks["run_turn"].next_at, CADENCE)
        assert "run_turn" in work.looks
    first = work.looks["run_turn"].next_at
    assert first <= at(900 + 8 * QUIET)
    read(work, "run_turn", (first - at(0)).total_seconds(), started("run_turn", t=900), seq=3)
    assert "run_turn" in work.runs and "run_turn" in work.looks


def test_a_waiting_run_is_not_judged_stalled_but_is_still_read_every_quiet_period() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    wait = held("run_a", t=2, ttl_s=86_400)
    read(work, "run_a", 3, started("run_a"), wait)
    assert work.looks["run_a"].next_at == at(3 + QUIET)
    assert stalled_runs(work, at(3600), QUIET) == []


def test_the_longest_overdue_looks_come_first_and_a_tick_reads_at_most_its_limit() -> None:
    work = OpenWork()
    for n in range(5):
        looks.accepted(work, f"run_{n}", at(5 - n), CADENCE)
    assert looks.due_looks(work, at(60), 2) == ["run_4", "run_3"]


def test_a_run_whose_journal_moved_but_could_not_be_read_is_read_next_and_not_judged_till_then() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    pay = intent("run_a", 1, t=1, timeout_s=60)
    read(work, "run_a", 3, started("run_a"), pay)
    assert looks.read_up_to_now(work, "run_a", at(10))
    looks.moved(work, "run_a", at(10))  # its hand-off followed, the read refused
    assert looks.due_looks(work, at(10), 10) == ["run_a"]
    assert not looks.read_up_to_now(work, "run_a", at(10))
    looks.moved(work, "run_never_accepted", at(10))
    assert "run_never_accepted" not in work.looks


def test_a_run_whose_end_is_followed_before_its_inbound_message_is_not_read_for_it() -> None:
    """A restarted reconciler replays the inbound messages and the milestones of the look-back window at once: an
    end followed first must not leave its run to be read once its message comes (every run ended in the window
    would be, oldest first, ahead of the runs that may be due)."""
    work = OpenWork()
    observe(work, RunCompleted(run_id="run_a", at=at(1), reply="done"))
    looks.ended(work, "run_a", at(100))
    looks.accepted(work, "run_a", at(0), CADENCE)
    assert "run_a" not in work.looks and looks.due_looks(work, at(200), 10) == []
    assert not work.ended_first  # its message came: nothing more is kept for it


def test_ends_whose_inbound_message_never_came_are_forgotten_after_an_hour() -> None:
    work = OpenWork()
    looks.ended(work, "run_old", at(0))
    looks.ended(work, "run_new", at(1800))
    looks.forget_ended(work, at(3601))
    assert list(work.ended_first) == ["run_new"]
    looks.forget_ended(work, at(5401))
    assert not work.ended_first


def test_a_run_whose_journal_does_not_decode_is_neither_read_nor_judged_any_more() -> None:
    work = OpenWork()
    looks.accepted(work, "run_a", at(0), CADENCE)
    read(work, "run_a", 3, started("run_a"), intent("run_a", 1, t=1))
    looks.unreadable(work, "run_a")
    assert looks.due_looks(work, at(3600), 10) == []
    assert overdue_actions(work, at(3600), GRACE, REASK) == [] and stalled_runs(work, at(3600), QUIET) == []
