"""The runtime's pure core: folding a run's journal into state and deciding its next move, with no I/O at all."""

from __future__ import annotations

import json
from datetime import timedelta

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import ErrorCode
from contracts.keys import action_key, compensation_key, input_hash
from contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    RunCompleted,
    RunHandedOff,
    RunNudged,
    RunResumed,
    ToolCall,
    ToolRejected,
    event_decoder,
)
from services.runtime.core.decide import (
    Append,
    AskModel,
    AwaitActions,
    Idle,
    ModelReply,
    next_move,
    plan_calls,
)
from services.runtime.core.fold import fold_run, replay
from services.runtime.core.state import RunState
from tests.support.journals import DECISIONS, decision_steps
from tests.support.paths import GOLDEN
from tests.support.runs import (
    BOOK,
    BOOKING,
    NIGHTLY,
    RUN,
    SEARCH,
    STEPS5,
    T0,
    Run,
    assert_replays,
    booked_run,
    booking_model,
    call,
    drive,
    reply_of,
    started,
)


# Hypothesis writes no example database into the repository, and a busy 2-core machine must not trip deadlines.
PROPERTY = settings(
    max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


# Folding: transcript and bookkeeping -------------------------------------------------------------------------


def test_a_journal_opens_with_run_started() -> None:
    state = fold_run(None, started(text="hello"))
    assert state.transcript == ({"role": "user", "content": "hello"},)
    assert (state.status, state.next_step, state.steps_used, state.events) == ("running", 1, 0, 1)
    assert replay([]) is None
    with pytest.raises(ValueError, match="run.started"):
        fold_run(None, RunCompleted(run_id=RUN, at=T0, reply="x"))


def test_transcript_follows_the_responses_api_item_shapes() -> None:
    run = Run(started(text="Book a room in Lisbon"))
    run.answer(SEARCH, tokens=(100, 20))
    assert run.state.unplanned == (SEARCH,) and run.state.tokens_used == 120 and run.state.model_steps == 1
    (requested,) = run.decide()
    assert isinstance(requested, ActionRequested) and requested.origin == "model"
    assert run.state.unplanned == () and run.state.pending == (requested,)
    done = run.complete(2)
    run.answer(text="All done.", tokens=(50, 5))

    assert run.state.transcript == (
        {"role": "user", "content": "Book a room in Lisbon"},
        {
            "type": "function_call",
            "call_id": "call_search",
            "name": "search_hotels",
            "arguments": SEARCH.arguments,
        },
        {
            "type": "function_call_output",
            "call_id": "call_search",
            "output": msgspec.json.encode(done.result, order="sorted").decode(),
        },
        {"role": "assistant", "content": "All done."},
    )
    assert run.state.final_reply == "All done." and run.state.tokens_used == 175
    assert run.state.completed == ((requested, done),) and run.state.pending == ()


def test_a_failed_receipt_reaches_the_model_as_an_error_output() -> None:
    run = Run(started())
    run.answer(SEARCH)
    run.decide()
    run.complete(2, status="failed")
    last = run.state.transcript[-1]
    assert last["type"] == "function_call_output" and last["call_id"] == "call_search"
    assert json.loads(last["output"]) == {
        "error": {"code": "sim_failed", "message": "simulated failed"},
        "status": "failed",
    }


def test_duplicate_and_stray_completions_are_ignored() -> None:
    run = Run(started())
    run.answer(SEARCH)
    (requested,) = run.decide()
    done = run.complete(requested.step_no)
    before = run.state
    after = fold_run(before, done)  # the same receipt journaled twice (an outcome redelivered)
    assert after.completed == before.completed and after.transcript == before.transcript
    assert after.pending == () and after.next_step == before.next_step
    assert after.events == before.events + 1  # counted as seen, nothing else
    stray = msgspec.structs.replace(done, step_no=99, key=action_key(RUN, 99))
    assert fold_run(before, stray).completed == before.completed


def test_duplicate_action_request_is_ignored() -> None:
    run = Run(started())
    run.answer(SEARCH)
    (requested,) = run.decide()
    again = fold_run(run.state, requested)
    assert (
        again.pending == (requested,) and again.action_steps == 1 and again.transcript == run.state.transcript
    )
    run.complete(requested.step_no)
    assert fold_run(run.state, requested).pending == ()  # a late duplicate does not reopen a completed step


def test_resumed_and_nudged_only_leave_evidence() -> None:
    run = Run(started())
    run.answer(SEARCH)
    run.decide()
    before = run.state
    after = run.add(
        RunResumed(run_id=RUN, at=run.tick(), worker="w2", next_step=3, reason="restart"),
        RunNudged(run_id=RUN, at=run.tick(), by="reconciler", reason="overdue", keys=[action_key(RUN, 2)]),
    )
    assert after.resumes == 1 and after.events == before.events + 2
    assert (after.pending, after.transcript, after.next_step) == (
        before.pending,
        before.transcript,
        before.next_step,
    )


def test_step_numbers_are_contiguous_across_model_answers_actions_and_rejections() -> None:
    run = Run(started())
    run.answer(SEARCH, call("no_such_tool", {}, "call_x"))
    events = run.decide()
    assert [type(e) for e in events] == [ActionRequested, ToolRejected]
    run.complete(2)
    run.answer(BOOK)
    run.decide()
    assert decision_steps(run.events) == [1, 2, 3, 4, 5]
    assert run.state.next_step == 6 and run.state.steps_used == 5
    assert [p.key for p in run.state.pending] == [action_key(RUN, 5)]


def test_terminal_runs_are_idle() -> None:
    run = Run(started())
    run.answer(text="Which city?")
    (done,) = run.decide()
    assert done == RunCompleted(run_id=RUN, at=run.now, reply="Which city?")
    assert run.state.status == "completed" and run.state.outcome == "completed"
    assert next_move(run.state, BOOKING, run.tick()) == Idle()
    handed = fold_run(fold_run(None, started()), RunHandedOff(run_id=RUN, at=T0, reason="deadline"))
    assert (handed.status, handed.handoff_reason) == ("handed_off", "deadline")
    assert next_move(handed, BOOKING, T0) == Idle()


# Budgets -----------------------------------------------------------------------------------------------------


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


# Typed rejections: nothing bad ever reaches an executor ------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("transfer_money", "{}", ErrorCode.UNKNOWN_TOOL),
        ("create_booking", "{not json", ErrorCode.INVALID_TOOL_ARGUMENTS),
        ("create_booking", "[1, 2]", ErrorCode.INVALID_TOOL_ARGUMENTS),
        (
            "create_booking",
            '{"hotel_id": "lis-1", "check_in": "2026-12-03", "check_out": "2026-12-01"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        (
            "create_booking",
            '{"hotel_id": "lis-1", "check_in": "2026-02-30", "check_out": "2026-03-02"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        (
            "search_hotels",
            '{"check_in": "2026-12-01", "check_out": "2026-12-03"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        ("create_payment", '{"booking_id": "bk_never_made"}', ErrorCode.UNKNOWN_BOOKING),
        ("send_confirmation_email", '{"booking_id": "bk_never_made"}', ErrorCode.UNKNOWN_BOOKING),
        (
            "release_booking",
            '{"booking_id": "bk_1"}',
            ErrorCode.UNKNOWN_TOOL,
        ),  # the model never sees compensations
    ],
)
def test_bad_calls_become_typed_rejections(tool: str, arguments: str, code: ErrorCode) -> None:
    run = Run(started())
    bad = call(tool, arguments, "call_bad")
    run.answer(bad)
    (rejected,) = run.decide()
    assert isinstance(rejected, ToolRejected)
    assert (rejected.step_no, rejected.call_id, rejected.tool, rejected.error.code) == (
        2,
        "call_bad",
        tool,
        code.value,
    )
    assert run.state.pending == () and run.state.unplanned == () and run.state.next_step == 3
    output = run.state.transcript[-1]
    assert output["call_id"] == "call_bad" and json.loads(output["output"])["error"]["code"] == code.value
    assert isinstance(
        next_move(run.state, BOOKING, run.tick()), AskModel
    )  # the model hears why and decides again


@pytest.mark.parametrize("field", ["amount", "amount_cents"])
def test_the_model_may_not_name_an_amount(field: str) -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id, field: 1}))
    (rejected,) = run.decide()
    assert (
        isinstance(rejected, ToolRejected) and rejected.error.code == ErrorCode.INVALID_TOOL_ARGUMENTS.value
    )
    assert "server" in rejected.error.message


def test_payment_amount_comes_from_the_journaled_booking() -> None:
    run, booking_id = booked_run()
    booking = run.state.succeeded_results("create_booking")[0]
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay"))
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested)
    assert payment.args == {
        "booking_id": booking_id,
        "guest_id": "guest-1",
        "amount_cents": booking["total_cents"],
        "currency": "EUR",
    }
    assert booking["total_cents"] == 2 * NIGHTLY
    assert (payment.family, payment.key) == ("payment", action_key(RUN, payment.step_no))
    assert payment.input_hash == input_hash({"tool": "create_payment", "args": payment.args})

    run.complete(payment.step_no)
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay_again"))
    (again,) = run.decide()
    assert isinstance(again, ToolRejected) and "already paid" in again.error.message


def test_two_payments_in_one_model_answer_request_one_charge() -> None:
    run, booking_id = booked_run()
    run.answer(
        call("create_payment", {"booking_id": booking_id}, "call_pay"),
        call("create_payment", {"booking_id": booking_id}, "call_pay2"),
    )
    payment, twice = run.decide()
    assert isinstance(payment, ActionRequested)
    assert (
        isinstance(twice, ToolRejected)
        and twice.step_no == payment.step_no + 1
        and "already paid" in twice.error.message
    )


def test_a_failed_booking_cannot_be_paid() -> None:
    run = Run(started())
    run.answer(BOOK)
    (booking,) = run.decide()
    run.complete(booking.step_no, status="failed", result={"booking_id": "bk_failed"})
    run.answer(call("create_payment", {"booking_id": "bk_failed"}))
    (rejected,) = run.decide()
    assert isinstance(rejected, ToolRejected) and rejected.error.code == ErrorCode.UNKNOWN_BOOKING.value


def test_server_fields_override_what_the_model_sends() -> None:
    run = Run(started())
    run.answer(
        call(
            "create_booking",
            {
                "hotel_id": "lis-1",
                "check_in": "2026-12-01",
                "check_out": "2026-12-03",
                "guest_id": "someone-else",
            },
        )
    )
    (booking,) = run.decide()
    assert isinstance(booking, ActionRequested) and booking.args["guest_id"] == "guest-1"


def test_unknown_outcome_hands_off_instead_of_guessing() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (payment,) = run.decide()
    run.complete(payment.step_no, status="unknown")
    events = run.decide()
    assert [type(e) for e in events] == [RunHandedOff]
    assert events[0].reason == "outcome_unknown" and payment.key in events[0].detail  # type: ignore[union-attr]
    assert not any(
        isinstance(e, ActionRequested) and e.tool == "release_booking" for e in run.events
    )  # maybe paid


def test_failed_payment_releases_the_hold_with_a_key_bound_to_the_booking() -> None:
    run, booking_id = booked_run()
    booking_key = run.state.completed[-1][0].key
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (payment,) = run.decide()
    run.complete(payment.step_no, status="failed")
    transcript = run.state.transcript
    (release,) = run.decide()
    assert isinstance(release, ActionRequested)
    assert (release.tool, release.origin, release.key) == (
        "release_booking",
        "compensation",
        compensation_key(booking_key, "release"),
    )
    assert release.args == {"booking_id": booking_id} and release.step_no == payment.step_no + 1
    assert run.state.transcript == transcript  # compensations stay out of the model's view
    run.complete(release.step_no)
    assert run.state.transcript == transcript
    assert isinstance(next_move(run.state, BOOKING, run.tick()), AskModel)


def test_a_refused_compensation_ends_the_run_instead_of_looping() -> None:
    run = Run(started())
    run.answer(BOOK)
    (booking,) = run.decide()
    run.complete(booking.step_no, result={"status": "held"})  # a provider answered 200 without the id
    run.answer(text="Your room is held.")
    for _ in range(30):
        if run.state.terminal:
            break
        run.decide()
    assert run.state.status == "handed_off", [type(e).__name__ for e in run.events[-5:]]


# The steps5 plan ---------------------------------------------------------------------------------------------


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
    assert run.state.model_steps == 0 and run.state.action_steps == 5


def test_plan_calls_is_pure() -> None:
    state = fold_run(None, started())
    calls = (SEARCH, BOOK)
    assert plan_calls(state, BOOKING, calls, T0) == plan_calls(state, BOOKING, calls, T0)


# Replay: the same journal gives the same decisions -----------------------------------------------------------


def test_recorded_journal_of_a_killed_and_resumed_run_replays() -> None:
    """Recorded from a real stack whose runtime was SIGKILLed right after journaling an action request."""
    lines = (GOLDEN / "journal_booking_runtime_killed.jsonl").read_bytes().splitlines()
    journal = [event_decoder.decode(line) for line in lines]
    assert any(isinstance(e, RunResumed) for e in journal)
    assert_replays(journal)
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


def test_a_driven_booking_replays_to_the_same_decisions() -> None:
    run = drive(started(), booking_model, lambda request: "succeeded")
    assert run.state.status == "completed" and run.state.final_reply == "Booked and paid."
    assert decision_steps(run.events) == list(range(1, 12))
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


# Properties over random journals -----------------------------------------------------------------------------

CANDIDATE_CALLS = [
    ("search_hotels", lambda s: SEARCH.arguments),
    ("search_hotels", lambda s: '{"city": "Lisbon"}'),
    ("create_booking", lambda s: BOOK.arguments),
    (
        "create_booking",
        lambda s: '{"hotel_id": "lis-1", "check_in": "2026-12-05", "check_out": "2026-12-01"}',
    ),
    ("create_payment", lambda s: json.dumps({"booking_id": _latest_booking(s)})),
    ("create_payment", lambda s: json.dumps({"booking_id": _latest_booking(s), "amount_cents": 5})),
    ("create_payment", lambda s: '{"booking_id": "bk_unknown"}'),
    ("send_confirmation_email", lambda s: json.dumps({"booking_id": _latest_booking(s)})),
    ("update_crm", lambda s: json.dumps({"booking_id": _latest_booking(s)})),
    ("drop_database", lambda s: "{}"),
    ("create_booking", lambda s: "{oops"),
    ("update_crm", lambda s: '"just a string"'),
]


def _latest_booking(state: RunState) -> str:
    results = state.succeeded_results("create_booking")
    return str(results[-1]["booking_id"]) if results else "bk_none_yet"


def random_run(data: st.DataObject) -> Run:
    budget = Budget(
        max_steps=data.draw(st.integers(2, 20), label="max_steps"),
        max_tokens=data.draw(st.sampled_from([300, 2_000, 60_000, 60_000]), label="max_tokens"),
        deadline_s=data.draw(st.sampled_from([20.0, 90.0, 600.0]), label="deadline_s"),
    )
    agent = data.draw(st.sampled_from(["booking", "booking", "steps5"]), label="agent")
    counter = iter(range(10_000))

    def model(state: RunState) -> ModelReply:
        tokens = (data.draw(st.integers(1, 200)), data.draw(st.integers(1, 40)))
        kind = data.draw(
            st.sampled_from(["text", "sensible", "sensible", "sensible", "random", "random"]), label="model"
        )
        if kind == "text":
            return reply_of(text=data.draw(st.sampled_from(["Done.", "Which dates?"])), tokens=tokens)
        if kind == "sensible":
            sensible = booking_model(state)
            return reply_of(
                tuple(
                    msgspec.structs.replace(c, call_id=f"call_{next(counter)}") for c in sensible.tool_calls
                ),
                sensible.reply,
                tokens,
            )
        picks = data.draw(
            st.lists(st.sampled_from(range(len(CANDIDATE_CALLS))), min_size=1, max_size=3), label="calls"
        )
        calls = tuple(
            ToolCall(
                call_id=f"call_{next(counter)}",
                name=CANDIDATE_CALLS[p][0],
                arguments=CANDIDATE_CALLS[p][1](state),
            )
            for p in picks
        )
        return reply_of(calls, tokens=tokens)

    def outcome(request: ActionRequested) -> str:
        return data.draw(
            st.sampled_from(["succeeded"] * 10 + ["failed", "unknown"]), label=f"outcome {request.tool}"
        )

    def extra(run: Run) -> None:
        # Redeliveries and restarts journal more events; none of them may change a decision.
        last = run.events[-1]
        if isinstance(last, ActionCompleted) and data.draw(st.integers(0, 4)) == 0:
            run.add(msgspec.structs.replace(last, at=run.tick(), deliveries=2))
        if not run.state.terminal and data.draw(st.integers(0, 6)) == 0:
            run.add(
                RunResumed(
                    run_id=RUN, at=run.tick(), worker="w2", next_step=run.state.next_step, reason="restart"
                )
            )

    return drive(
        started(agent=agent, budget=budget),
        model,
        outcome,
        pick=lambda n: data.draw(st.integers(0, n - 1)),
        gap=lambda: data.draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 3.0, 15.0])),
        extra=extra,
    )


@PROPERTY
@given(st.data())
def test_property_every_prefix_folds_and_steps_stay_contiguous(data: st.DataObject) -> None:
    run = random_run(data)
    assert run.state.terminal  # every run ends: completes or is handed to a person
    for cut in range(len(run.events) + 1):
        replay(run.events[:cut])  # never raises
    steps = decision_steps(run.events)
    assert steps == list(range(1, len(steps) + 1))
    requested = [e.step_no for e in run.events if isinstance(e, ActionRequested)]
    assert len(requested) == len(set(requested))
    keys = [e.key for e in run.events if isinstance(e, ActionRequested)]
    assert len(keys) == len(set(keys))  # one key, one intent: never two effects for one key
    # Only compensations may go past the step budget: undoing an effect is never starved.
    for event in run.events:
        if (
            isinstance(event, DECISIONS)
            and getattr(event, "origin", "model") != "compensation"
            and not getattr(event, "call_id", "").startswith("comp:")
        ):
            assert event.step_no <= run.state.budget.max_steps


@PROPERTY
@given(st.data())
def test_property_replay_equals_incremental_fold(data: st.DataObject) -> None:
    run = random_run(data)
    assert replay(run.events) == run.state
    state = None
    for i, event in enumerate(run.events):
        state = fold_run(state, event)
        assert state == replay(run.events[: i + 1])


@PROPERTY
@given(st.data())
def test_property_replaying_a_journal_gives_the_same_decisions(data: st.DataObject) -> None:
    run = random_run(data)
    assert_replays(run.events)


@PROPERTY
@given(st.data())
def test_property_money_moves_only_for_a_booking_made_in_the_run(data: st.DataObject) -> None:
    run = random_run(data)
    booked = {}
    for event in run.events:
        if (
            isinstance(event, ActionCompleted)
            and event.status == "succeeded"
            and "booking_id" in event.result
            and "nights" in event.result
        ):
            booked[event.result["booking_id"]] = event.result["total_cents"]
        if isinstance(event, ActionRequested) and event.tool == "create_payment":
            assert booked.get(event.args["booking_id"]) == event.args["amount_cents"]
