"""Runs that never wedge: what the model sends cannot raise in the argument check, every model call counts, the
deadline holds while actions are pending, a late failure is still compensated, an unknown event is skipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.run_events import (
    MAX_TOOL_ARGUMENT_BYTES,
    ActionRequested,
    ApprovalRequested,
    ArgumentLimits,
    Budget,
    HandOffReason,
    ModelAsked,
    Origin,
    PolicyDenied,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    ToolRejected,
    UnknownEvent,
    decode_event,
    event_encoder,
)
from crashsafe.domain.argument_checks import check_arguments, nesting_depth
from crashsafe.domain.call_plan import plan_calls
from crashsafe.domain.decide import Append, AskModel, AwaitActions, Idle, next_move
from crashsafe.domain.effect_audit import unknown_events
from crashsafe.domain.fold import fold_run, replay
from crashsafe.domain.model_calls import MAX_FAILED_ASKS, ask_at_risk, model_asked, model_rejected
from crashsafe.domain.open_work import OpenWork, observe, overdue_actions, unsettled_unknowns
from tests.support.runs import BOOKING, RUN, T0, Run, assert_replays, booked_run, call, reply_of, started

LIMITS = ArgumentLimits()


# The argument check -------------------------------------------------------------------------------------------


def test_an_argument_over_the_size_limit_is_refused_before_it_is_decoded() -> None:
    huge = json.dumps({"booking_id": "x" * 600_000})  # the 600 kB argument that once reached the HTTP client
    refused = check_arguments("create_payment", huge, LIMITS)
    assert isinstance(refused, ErrorInfo) and refused.code == ErrorCode.TOOL_ARGUMENTS_TOO_LARGE
    assert refused.details["limit"] == MAX_TOOL_ARGUMENT_BYTES == 16 * 1024
    # Multi-byte characters count as bytes, not characters.
    euros = json.dumps({"note": "€" * 6000}, ensure_ascii=False)  # 6,000 characters, 18,000 bytes
    assert len(euros) < MAX_TOOL_ARGUMENT_BYTES < len(euros.encode())
    assert isinstance(check_arguments("t", euros, LIMITS), ErrorInfo)


def test_deep_nesting_is_refused_without_recursion() -> None:
    deep = '{"a":' * 20_000 + "1" + "}" * 20_000  # raised RecursionError in the old check
    roomy = ArgumentLimits(max_bytes=1_000_000, max_depth=32)
    refused = check_arguments("t", deep, roomy)
    assert isinstance(refused, ErrorInfo) and refused.code == ErrorCode.TOOL_ARGUMENTS_TOO_DEEP
    assert nesting_depth(deep, stop_at=32) == 33  # counting stops just past the limit
    assert nesting_depth('{"a":"[[[[{{{{"}', stop_at=32) == 1  # brackets inside strings do not nest
    assert nesting_depth('{"a":"\\"[[["}', stop_at=32) == 1  # nor after an escaped quote
    ok = '{"a":' * 32 + "1" + "}" * 32
    assert isinstance(check_arguments("t", ok, roomy), dict)


@pytest.mark.parametrize(
    ("arguments", "code"),
    [("{not json", ErrorCode.INVALID_TOOL_ARGUMENTS), ("[1, 2]", ErrorCode.INVALID_TOOL_ARGUMENTS)],
)
def test_undecodable_or_non_object_arguments_are_refused(arguments: str, code: ErrorCode) -> None:
    refused = check_arguments("t", arguments, LIMITS)
    assert isinstance(refused, ErrorInfo) and refused.code == code


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet='{}[]":,\\1a ').map(lambda s: s * 50)))
def test_any_argument_string_never_raises_in_the_check(arguments: str) -> None:
    result = check_arguments("t", arguments, ArgumentLimits(max_bytes=4096, max_depth=8))
    assert isinstance(result, dict | ErrorInfo)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = st.sampled_from(
    ["booking_id", "hotel_id", "check_in", "check_out", "city", "amount_cents", "payment_id", "guest_id"]
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_planning_any_arguments_for_any_booking_tool_never_raises(data: st.DataObject) -> None:
    run, booking_id = booked_run()
    tool = data.draw(st.sampled_from(sorted(BOOKING.tools)))
    args = data.draw(
        st.dictionaries(_FIELDS, _JSON | st.just(booking_id) | st.just("2031-12-01"), max_size=5)
    )
    (event,) = plan_calls(run.state, BOOKING, (call(tool, json.dumps(args)),), run.tick())
    assert isinstance(event, ActionRequested | ToolRejected | PolicyDenied | ApprovalRequested)


def test_an_oversized_call_is_a_typed_rejection_before_any_intent_and_costs_a_step() -> None:
    run, booking_id = booked_run()
    before = run.state.steps_used
    run.answer(call("create_payment", json.dumps({"booking_id": booking_id, "pad": "x" * 20_000})))
    (rejected,) = run.decide()
    assert isinstance(rejected, ToolRejected) and rejected.error.code == ErrorCode.TOOL_ARGUMENTS_TOO_LARGE
    assert not run.state.pending
    assert run.state.steps_used == before + 2  # the model's answer and the rejection each took a step


def test_an_agent_may_declare_its_own_argument_limits() -> None:
    @dataclass
    class Strict:
        argument_limits: ArgumentLimits = ArgumentLimits(max_bytes=64, max_depth=2)

        def __getattr__(self, name: str) -> object:
            return getattr(BOOKING, name)

    run, booking_id = booked_run()
    run.answer(call("create_payment", json.dumps({"booking_id": booking_id, "pad": "x" * 100})))
    (rejected,) = plan_calls(run.state, Strict(), run.state.unplanned, run.tick())  # type: ignore[arg-type]
    assert isinstance(rejected, ToolRejected) and rejected.error.code == ErrorCode.TOOL_ARGUMENTS_TOO_LARGE


# Every model call counts --------------------------------------------------------------------------------------


def test_model_calls_whose_answers_are_never_journaled_still_spend_the_step_budget() -> None:
    run = Run(started(budget=Budget(max_steps=20)))
    calls = 0
    for _ in range(100):
        move = next_move(run.state, BOOKING, run.tick())
        if not isinstance(move, AskModel):
            break
        calls += (
            1  # a run at risk journals the ask, calls the model, and crashes before journaling the answer
        )
        run.add(model_asked(run.state, "m", 4000, run.now))
    assert calls == 20, "a 20-step budget allows 20 model calls, answered or not"
    assert isinstance(move, Append)
    (handed,) = move.events
    assert isinstance(handed, RunHandedOff) and handed.reason == "budget_steps"
    assert "never answered" in handed.detail
    assert run.state.next_step == 1  # no step number was spent: keys stay run_id:step_no of journaled steps
    assert run.state.tokens_used == 19 * 1000  # each lost ask is charged its input (4000 bytes / 4)


def test_failed_model_calls_spend_the_step_budget_and_put_the_run_at_risk() -> None:
    run = Run(started(budget=Budget(max_steps=20)))
    assert not ask_at_risk(run.state)  # the happy path journals no ask
    calls = 0
    for _ in range(100):
        move = next_move(run.state, BOOKING, run.tick())
        if not isinstance(move, AskModel):
            break
        calls += 1  # as the runtime does: an ask first if at risk, then the call fails and that is journaled
        if ask_at_risk(run.state):
            run.add(model_asked(run.state, "m", 400, run.now))
        run.add(model_asked(run.state, "m", 400, run.now, failed="model m did not answer: 503"))
        assert not run.state.asking and ask_at_risk(run.state)
    # Every route down: the run is handed off after MAX_FAILED_ASKS failures in a row, each a spent step.
    assert calls == MAX_FAILED_ASKS and run.state.lost_asks == MAX_FAILED_ASKS
    assert run.state.steps_used == MAX_FAILED_ASKS and run.state.tokens_used == MAX_FAILED_ASKS * 100
    assert isinstance(move, Append) and isinstance(move.events[0], RunHandedOff)
    assert move.events[0].reason == HandOffReason.MODEL_UNAVAILABLE


def test_failed_model_calls_that_are_not_in_a_row_still_spend_the_step_budget() -> None:
    run = Run(started(budget=Budget(max_steps=20)))
    calls = 0
    for _ in range(100):
        move = next_move(run.state, BOOKING, run.tick())
        if not isinstance(move, AskModel):
            break
        calls += 1
        if calls % MAX_FAILED_ASKS == 0:
            # An answer now and then (a flapping provider: here one too large to act on) resets the run of
            # failures, not the budget.
            run.add(model_rejected(run.state, reply_of(text="x"), 2_000_000, run.now))
            continue
        if ask_at_risk(run.state):
            run.add(model_asked(run.state, "m", 400, run.now))
        run.add(model_asked(run.state, "m", 400, run.now, failed="model m did not answer: 503"))
    assert isinstance(move, Append) and isinstance(move.events[0], RunHandedOff)
    assert move.events[0].reason == HandOffReason.BUDGET_STEPS


def test_a_resumed_run_is_at_risk() -> None:
    run = Run(started())
    run.add(RunResumed(run_id=RUN, at=run.tick(), worker="w2", next_step=1, reason="picked up"))
    assert ask_at_risk(run.state)


def test_an_answer_too_large_for_the_journal_is_a_refused_step_the_model_is_told_about() -> None:
    run = Run(started(budget=Budget(max_steps=3)))
    run.add(model_asked(run.state, "m", 100, run.tick()))
    run.add(model_rejected(run.state, reply_of(text="x"), 2_000_000, run.now))
    assert run.state.steps_used == 1 and not run.state.asking
    assert run.state.tokens_used == 15
    assert "refused" in str(run.state.transcript[-1]["content"])
    assert run.state.final_reply is None
    move = next_move(run.state, BOOKING, run.tick())
    assert isinstance(move, AskModel) and move.step_no == 2


# The deadline holds while actions are pending ----------------------------------------------------------------


def _paying_run() -> tuple[Run, ActionRequested]:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (pay,) = run.decide()
    assert isinstance(pay, ActionRequested)
    return run, pay


def test_past_the_deadline_a_run_waiting_on_an_action_hands_off_and_leaves_it_pending() -> None:
    run, pay = _paying_run()
    assert isinstance(next_move(run.state, BOOKING, run.now), AwaitActions)
    late = run.state.deadline_at + timedelta(seconds=1)
    move = next_move(run.state, BOOKING, late)
    assert isinstance(move, Append)
    (handed,) = move.events  # a booking whose payment is pending is never released
    assert isinstance(handed, RunHandedOff) and handed.reason == "deadline" and pay.key in handed.detail
    run.add(handed)
    assert run.state.terminal and run.state.pending_step(pay.step_no) is not None


def test_a_late_failed_payment_after_a_deadline_hand_off_releases_the_hold() -> None:
    run, pay = _paying_run()
    run.now = run.state.deadline_at + timedelta(seconds=1)
    run.decide()  # hands off, payment pending
    run.complete(pay.step_no, status="failed")  # the reconciler's ask by key settles it, late
    (release,) = run.decide()
    assert isinstance(release, ActionRequested)
    assert release.origin == Origin.COMPENSATION and release.key == f"{RUN}:4:release"
    assert isinstance(next_move(run.state, BOOKING, run.tick()), AwaitActions)  # its request gets published
    run.complete(release.step_no)
    assert next_move(run.state, BOOKING, run.tick()) == Idle()


def test_a_late_successful_payment_after_hand_off_needs_nothing() -> None:
    run, pay = _paying_run()
    run.now = run.state.deadline_at + timedelta(seconds=1)
    run.decide()
    run.complete(pay.step_no)
    assert next_move(run.state, BOOKING, run.tick()) == Idle()


def test_a_pending_compensation_is_awaited_past_the_deadline() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (pay,) = run.decide()
    run.complete(pay.step_no, status="failed")
    (release,) = run.decide()
    assert isinstance(release, ActionRequested) and release.origin == Origin.COMPENSATION
    late = run.state.deadline_at + timedelta(seconds=30)
    assert isinstance(next_move(run.state, BOOKING, late), AwaitActions)


# Unknown events -----------------------------------------------------------------------------------------------

FUTURE = b'{"type":"run.thought.v9","run_id":"%s","at":"2031-12-01T09:00:05Z","step_no":7,"mood":"calm"}' % (
    RUN.encode()
)


def test_an_unknown_tag_decodes_as_an_unknown_event_and_a_broken_known_one_still_raises() -> None:
    event = decode_event(FUTURE)
    assert isinstance(event, UnknownEvent) and event.type == "run.thought.v9" and event.step_no == 7
    assert event.data == FUTURE
    with pytest.raises(msgspec.DecodeError):
        decode_event(b'{"type":"run.nudged","run_id":"r","at":"2031-12-01T09:00:05Z"}')  # `by` is missing
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"not json")


def test_the_fold_skips_an_unknown_event_but_never_reuses_its_step_number() -> None:
    run = Run(started())
    run.answer(call("search_hotels", {"city": "Lisbon"}))
    state = fold_run(run.state, decode_event(FUTURE))
    assert state.unknown_events == ("run.thought.v9",) and state.next_step == 8
    assert state.unplanned == run.state.unplanned and state.transcript == run.state.transcript
    move = next_move(state, BOOKING, run.tick())
    assert isinstance(move, Append) and move.events[0].step_no == 8  # type: ignore[union-attr]


def _journal() -> list[RunEvent]:
    run, pay = _paying_run()
    run.complete(pay.step_no)
    return run.events


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_folding_any_prefix_with_unknown_events_never_raises(data: st.DataObject) -> None:
    journal: list[RunEvent | UnknownEvent] = list(_journal())
    cut = data.draw(st.integers(min_value=1, max_value=len(journal)))
    prefix = journal[:cut]
    for _ in range(data.draw(st.integers(min_value=0, max_value=4))):
        where = data.draw(st.integers(min_value=1, max_value=len(prefix)))
        step = data.draw(st.one_of(st.none(), st.integers(min_value=0, max_value=50)))
        tag = data.draw(st.text(alphabet="abcdefghij.", min_size=1, max_size=12).map(lambda t: "run.x" + t))
        prefix.insert(where, UnknownEvent(type=tag, run_id=RUN, at=T0, data=b"{}", step_no=step))
    state = replay(prefix)
    assert state is not None
    next_move(state, BOOKING, T0 + timedelta(seconds=cut))  # and deciding from it never raises either


def test_audit_names_the_runs_holding_unknown_events() -> None:
    journal: list[RunEvent | UnknownEvent] = [*_journal(), decode_event(FUTURE)]
    assert unknown_events({RUN: journal, "run_other": _journal()}) == {RUN: ["run.thought.v9"]}


# The reconciler keeps asking about what a handed-off run left pending -----------------------------------------


def test_an_action_pending_at_hand_off_stays_watched_until_it_settles() -> None:
    run, pay = _paying_run()
    work = OpenWork()
    for event in run.events:
        observe(work, event)
    handed_at = run.state.deadline_at + timedelta(seconds=1)
    observe(work, RunHandedOff(run_id=RUN, at=handed_at, reason="deadline", detail=""))
    observe(work, decode_event(FUTURE))  # an unknown event only moves nothing
    assert overdue_actions(work, handed_at, 2.0, 5.0) == []  # the run is gone from open runs...
    assert unsettled_unknowns(work, handed_at, 5.0) == [pay]  # ...but its pending key is still asked about
    run.complete(pay.step_no, status="failed")
    observe(work, run.events[-1])
    assert unsettled_unknowns(work, handed_at + timedelta(hours=1), 5.0) == []
    assert (pay.run_id, pay.key) not in work.requests


def test_journal_events_encode_as_before() -> None:
    nudged = RunNudged(run_id=RUN, at=T0, by="x", reason="y")
    assert decode_event(event_encoder.encode(nudged)) == nudged
    asked = ModelAsked(run_id=RUN, at=T0, step_no=3)
    assert decode_event(event_encoder.encode(asked)) == asked


def test_a_journal_with_asks_failed_calls_and_a_refused_answer_replays() -> None:
    run = Run(started())
    run.add(model_asked(run.state, "m", 400, run.tick(), failed="model m did not answer: 503"))
    run.add(model_asked(run.state, "m", 400, run.tick()))
    run.add(model_rejected(run.state, reply_of(text="x"), 2_000_000, run.tick()))
    run.add(model_asked(run.state, "m", 400, run.tick()))
    run.answer(text="Which city?")
    run.decide()
    assert_replays(run.events)
