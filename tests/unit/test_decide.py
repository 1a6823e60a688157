"""Deciding the next move from a folded run: idle when ended, budgets and deadlines, a plan-driven workflow."""

from __future__ import annotations

from datetime import timedelta

import pytest

from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.keys import action_key
from crashsafe.contracts.run_events import (
    ActionRequested,
    Budget,
    RunCompleted,
    RunHandedOff,
    ToolCall,
    ToolRejected,
)
from crashsafe.domain.call_plan import plan_calls
from crashsafe.domain.decide import Append, AskModel, AwaitActions, Idle, next_move
from crashsafe.domain.fold import fold_run
from crashsafe.domain.model_calls import model_answered
from tests.support.journals import decision_steps
from tests.support.runs import (
    BOOK,
    BOOKING,
    RUN,
    SEARCH,
    STEPS5,
    T0,
    Run,
    booked_run,
    call,
    reply_of,
    started,
)

# Ended runs ---------------------------------------------------------------------------------------------------


def test_terminal_runs_are_idle() -> None:
    run = Run(started())
    run.answer(text="Which city?")
    (done,) = run.decide()
    assert done == RunCompleted(run_id=RUN, at=run.now, reply="Which city?")
    assert run.state.status == "completed" and run.state.outcome == "completed"
    assert next_move(run.state, BOOKING, run.tick()) == Idle()
    handed = fold_run(fold_run(None, started()), RunHandedOff(run_id=RUN, at=T0, reason="deadline"))
    assert (handed.status, handed.outcome, handed.handoff_reason) == ("handed_off", "handed_off", "deadline")
    assert next_move(handed, BOOKING, T0) == Idle()


# Budgets ------------------------------------------------------------------------------------------------------


def test_step_budget_hands_off_a_call_that_would_exceed_it() -> None:
    run = Run(started(budget=Budget(max_steps=3)))
    run.answer(SEARCH)
    run.decide()
    run.complete(2)
    run.answer(BOOK)  # step 3, the last one
    (handed,) = run.decide()
    assert isinstance(handed, RunHandedOff) and handed.reason == "budget_steps"
    assert "create_booking" in handed.detail and run.state.status == "handed_off"
    assert not any(isinstance(e, ActionRequested) and e.step_no > 3 for e in run.events)


def test_step_budget_hands_off_before_asking_the_model_again() -> None:
    run = Run(started(budget=Budget(max_steps=2)))
    run.answer(SEARCH)
    run.decide()
    run.complete(2)
    (handed,) = run.decide()
    assert isinstance(handed, RunHandedOff) and handed.reason == "budget_steps" and "2 of 2" in handed.detail


def test_token_budget_hands_off() -> None:
    run = Run(started(budget=Budget(max_tokens=1_000)))
    run.answer(SEARCH, tokens=(900, 100))
    run.decide()
    run.complete(2)
    (handed,) = run.decide()
    assert (
        isinstance(handed, RunHandedOff)
        and handed.reason == "budget_tokens"
        and "1000 of 1000" in handed.detail
    )


def test_deadline_hands_off_and_caps_each_action_timeout() -> None:
    first = started(budget=Budget(deadline_s=30.0))
    state = fold_run(None, first)
    assert isinstance(next_move(state, BOOKING, first.deadline_at - timedelta(microseconds=1)), AskModel)
    move = next_move(state, BOOKING, first.deadline_at)
    assert isinstance(move, Append)
    (handed,) = move.events
    assert isinstance(handed, RunHandedOff) and handed.reason == "deadline" and handed.at == first.deadline_at

    # Three seconds left: a 10 s payment gets three, and its own deadline is the run's.
    run, booking_id = booked_run()
    run.now = run.state.deadline_at - timedelta(seconds=3) - timedelta(seconds=1)
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested) and payment.timeout_s == pytest.approx(2.0)
    assert payment.deadline_at == run.state.deadline_at


def test_a_tool_call_the_model_made_before_the_deadline_is_not_planned_at_or_after_it() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    for now in (run.state.deadline_at, run.state.deadline_at + timedelta(seconds=5)):
        move = next_move(run.state, BOOKING, now)
        assert isinstance(move, Append)
        (handed,) = move.events
        assert (
            isinstance(handed, RunHandedOff)
            and handed.reason == "deadline"
            and "create_payment" in handed.detail
        )


def test_a_step_gets_the_fraction_of_a_second_the_run_has_left() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    move = next_move(run.state, BOOKING, run.state.deadline_at - timedelta(seconds=0.5))
    assert isinstance(move, Append)
    (payment,) = move.events
    assert isinstance(payment, ActionRequested) and payment.timeout_s == pytest.approx(0.5)


def test_a_compensation_gets_its_full_timeout_whatever_the_deadline() -> None:
    """Undoing an effect must not be starved by the deadline that ended the run (a release takes up to 5 s)."""
    late = Run(started())
    late.answer(BOOK)
    (booking,) = late.decide()
    late.complete(booking.step_no)
    late.now = late.state.deadline_at + timedelta(seconds=1)  # the run is over; its hold is never paid
    (release,) = late.decide()
    assert isinstance(release, ActionRequested) and release.tool == "release_booking"
    assert (release.timeout_s, release.deadline_at) == (5.0, late.now + timedelta(seconds=5))

    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (payment,) = run.decide()
    run.complete(payment.step_no, status="failed")
    run.now = run.state.deadline_at - timedelta(seconds=2)
    (release,) = run.decide()
    assert isinstance(release, ActionRequested) and release.tool == "release_booking"
    assert release.timeout_s == 5.0


# Reading the model's calls ------------------------------------------------------------------------------------


def test_a_model_answer_with_tool_calls_journals_no_reply() -> None:
    state = fold_run(None, started())
    answered = model_answered(state, reply_of((SEARCH,), text="Let me look."), T0)
    assert (answered.tool_calls, answered.reply) == ([SEARCH], None)
    assert model_answered(state, reply_of((), text="Which city?"), T0).reply == "Which city?"


@pytest.mark.parametrize(
    ("name", "arguments", "code"),
    [
        ("transfer_money", "{}", ErrorCode.UNKNOWN_TOOL),
        ("search_hotels", "{not json", ErrorCode.INVALID_TOOL_ARGUMENTS),
        ("search_hotels", '["Lisbon"]', ErrorCode.INVALID_TOOL_ARGUMENTS),
    ],
)
def test_a_call_the_runtime_cannot_read_is_rejected_naming_the_tool(
    name: str, arguments: str, code: ErrorCode
) -> None:
    state = fold_run(None, started())
    (rejected,) = plan_calls(state, BOOKING, (ToolCall(call_id="c1", name=name, arguments=arguments),), T0)
    assert isinstance(rejected, ToolRejected)
    assert (rejected.error.code, rejected.error.details) == (code.value, {"tool": name})


def test_a_call_with_empty_arguments_is_a_call_with_no_arguments() -> None:
    state = fold_run(None, started(agent="steps5"))
    (requested,) = plan_calls(state, STEPS5, (ToolCall(call_id="c1", name="noop", arguments=""),), T0)
    assert isinstance(requested, ActionRequested) and requested.args == {"i": 0, "sleep_ms": 0}


# The steps5 plan ----------------------------------------------------------------------------------------------


def test_steps5_plan_makes_five_actions_then_completes() -> None:
    run = Run(started(agent="steps5"))
    for step in range(1, 6):
        (requested,) = run.decide(STEPS5)
        assert isinstance(requested, ActionRequested)
        assert (requested.step_no, requested.tool, requested.family, requested.origin) == (
            step,
            "noop",
            "noop",
            "plan",
        )
        assert requested.key == action_key(RUN, step) and requested.args["i"] == step
        assert isinstance(next_move(run.state, STEPS5, run.tick()), AwaitActions)
        run.complete(step)
    (done,) = run.decide(STEPS5)
    assert done == RunCompleted(run_id=RUN, at=run.now, reply="5 steps done")
    assert decision_steps(run.events) == [1, 2, 3, 4, 5]
    calls = [item for item in run.state.transcript if item.get("type") == "function_call"]
    assert [c["call_id"] for c in calls] == [
        f"plan-{i}" for i in range(1, 6)
    ]  # the plan's calls are in the model's view
    assert calls[0] == {
        "type": "function_call",
        "call_id": "plan-1",
        "name": "noop",
        "arguments": '{"i":1,"sleep_ms":0}',
    }
    assert run.state.final_reply == "5 steps done"
    assert run.state.model_steps == 0 and run.state.action_steps == 5


def test_plan_calls_is_pure() -> None:
    state = fold_run(None, started())
    calls = (SEARCH, BOOK)
    assert plan_calls(state, BOOKING, calls, T0) == plan_calls(state, BOOKING, calls, T0)
