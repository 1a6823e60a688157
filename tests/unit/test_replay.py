"""Replay: folding and deciding a journal again gives the same decisions (recorded journals and driven runs)."""

from __future__ import annotations


import msgspec
import pytest

from contracts.errors import ErrorCode
from contracts.run_events import ActionRequested, ModelAnswered, RunResumed, ToolRejected, event_decoder
from services.runtime.core.decide import Append, next_move
from services.runtime.core.fold import replay
from tests.support.journals import decision_steps
from tests.support.paths import GOLDEN
from tests.support.runs import agent_named, assert_replays, booking_model, drive, started

EMAIL = "send_confirmation_email"


# Recorded journals --------------------------------------------------------------------------------------------


def test_recorded_journal_of_a_killed_and_resumed_run_replays() -> None:
    """Recorded from a real stack whose runtime was SIGKILLed right after journaling an action request, when the
    confirmation email and the CRM record were still model steps: a legacy journal now (slice REPLAY records
    the new corpus). Its fold must still work, for a run in flight across the deploy is such a journal: its
    already journaled email and CRM steps are served by executor-notify under the projections' own keys (never
    twice). Its decisions hold up to the payment; from there the code decides otherwise, and says so below."""
    lines = (GOLDEN / "journal_booking_runtime_killed.jsonl").read_bytes().splitlines()
    journal = [event_decoder.decode(line) for line in lines]
    assert any(isinstance(e, RunResumed) for e in journal)
    email = next(i for i, e in enumerate(journal) if isinstance(e, ActionRequested) and e.tool == EMAIL)
    assert_replays(journal[:email])
    # The model's ask for the email, decided today: refused as a tool the model does not have (nothing reaches
    # an executor; the projector sends the email once the run has ended).
    asked = journal[email - 1]
    assert isinstance(asked, ModelAnswered) and [c.name for c in asked.tool_calls] == [EMAIL]
    move = next_move(replay(journal[:email]), agent_named("booking"), journal[email].at)  # type: ignore[arg-type]
    assert isinstance(move, Append)
    (refused,) = move.events
    assert isinstance(refused, ToolRejected) and refused.tool == EMAIL
    assert refused.error.code == ErrorCode.UNKNOWN_TOOL.value
    state = replay(journal)
    assert state is not None and state.status == "completed" and state.resumes == 1
    assert decision_steps(journal) == list(range(1, state.next_step))
    assert [req.tool for req, _ in state.completed] == [
        "search_hotels",
        "create_booking",
        "create_payment",
        "send_confirmation_email",
        "update_crm",
    ]


# Driven runs --------------------------------------------------------------------------------------------------


def test_a_driven_booking_replays_to_the_same_decisions() -> None:
    run = drive(started(), booking_model, lambda request: "succeeded")
    assert run.state.status == "completed" and run.state.final_reply == "Booked and paid."
    assert decision_steps(run.events) == list(
        range(1, 8)
    )  # search, hold, pay: three asks, three steps, the reply
    assert_replays(run.events)
    assert replay(run.events) == run.state
    # A journal that lost its last decisions (a crash before they were appended) decides them again identically.
    for cut in range(1, len(run.events)):
        assert_replays(run.events[:cut])


def test_a_driven_steps5_run_replays() -> None:
    run = drive(started(agent="steps5"), booking_model, lambda request: "succeeded")
    assert run.state.status == "completed" and decision_steps(run.events) == [1, 2, 3, 4, 5]
    assert_replays(run.events)


def test_replay_catches_a_journal_that_the_code_would_not_have_written() -> None:
    run = drive(started(), booking_model, lambda request: "succeeded")
    payment = next(
        i for i, e in enumerate(run.events) if isinstance(e, ActionRequested) and e.tool == "create_payment"
    )
    forged = msgspec.structs.replace(
        run.events[payment], args={**run.events[payment].args, "amount_cents": 1}
    )  # type: ignore[union-attr]
    with pytest.raises(AssertionError, match="differs on replay"):
        assert_replays([*run.events[:payment], forged, *run.events[payment + 1 :]])
