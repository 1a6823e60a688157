"""The booking agent's rules, decided purely from the journal: typed rejections, amounts from the server, one
payment per booking, and compensations that undo a hold."""

from __future__ import annotations

import json

import pytest

from contracts.errors import ErrorCode
from contracts.keys import action_key, compensation_key, input_hash
from contracts.run_events import ActionRequested, RunHandedOff, ToolRejected
from services.runtime.core.decide import AskModel, next_move
from tests.support.runs import BOOK, BOOKING, NIGHTLY, RUN, Run, booked_run, call, started


# Typed rejections: nothing bad ever reaches an executor -------------------------------------------------------


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


# Unknown outcomes and compensations ---------------------------------------------------------------------------


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
