"""The booking agent's rules, decided purely from the journal: typed rejections, amounts from the server, one
payment per booking, and compensations that undo a hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import msgspec
import pytest

from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.keys import action_key, compensation_key, input_hash, tool_input_hash
from crashsafe.contracts.memory import GuestProfile
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    PolicyDenied,
    RunHandedOff,
    ToolRejected,
)
from crashsafe.domain.agent import ProjectionCall
from crashsafe.domain.decide import AskModel, next_move
from crashsafe.domain.model_calls import model_answered
from crashsafe.services.agents import stayhub
from crashsafe.services.agents.booking.booking_agent import UNKNOWN_BOOKING
from tests.support.runs import BOOK, BOOKING, NIGHTLY, RUN, Run, booked_run, call, reply_of, started


def paid_anyway(run: Run, booking_id: str, call_id: str, answered: bool = False) -> ActionRequested:
    """A payment journaled the way a writer from before the `booking_released` rule did (the policy now denies
    paying a released booking): compensations must still settle such journals."""
    if not answered:
        run.answer(call("create_payment", {"booking_id": booking_id}, call_id))
    step = run.state.next_step
    args = BOOKING.prepare(run.state, BOOKING.tools["create_payment"], {"booking_id": booking_id})
    assert isinstance(args, dict)
    request = ActionRequested(
        run_id=RUN,
        at=run.tick(),
        step_no=step,
        call_id=call_id,
        tool="create_payment",
        family="payment",
        args=args,
        key=action_key(RUN, step),
        input_hash=tool_input_hash("create_payment", args),
        timeout_s=10.0,
        deadline_at=run.now + timedelta(seconds=10),
    )
    run.add(request)
    return request


# Typed rejections: nothing bad ever reaches an executor -------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("transfer_money", "{}", ErrorCode.UNKNOWN_TOOL),
        ("create_booking", "{not json", ErrorCode.INVALID_TOOL_ARGUMENTS),
        ("create_booking", "[1, 2]", ErrorCode.INVALID_TOOL_ARGUMENTS),
        (
            "create_booking",
            '{"hotel_id": "lis-1", "check_in": "2031-12-03", "check_out": "2031-12-01"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        (
            "create_booking",
            '{"hotel_id": "lis-1", "check_in": "2026-02-30", "check_out": "2026-03-02"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        (
            "create_booking",
            '{"hotel_id": "lis-1", "check_in": "2031-12-01"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        (
            "search_hotels",
            '{"check_in": "2031-12-01", "check_out": "2031-12-03"}',
            ErrorCode.INVALID_TOOL_ARGUMENTS,
        ),
        ("create_payment", '{"booking_id": "bk_never_made"}', UNKNOWN_BOOKING),
        # The email and the CRM record are projections now, never the model's: a model that still asks for
        # them (trained on the old flow, or obeying an injection) meets a clean unknown_tool, never an effect.
        ("send_confirmation_email", '{"booking_id": "bk_1"}', ErrorCode.UNKNOWN_TOOL),
        (
            "send_confirmation_email",
            '{"booking_id": "bk_1", "to": "attacker@evil.example"}',
            ErrorCode.UNKNOWN_TOOL,
        ),
        ("update_crm", '{"booking_id": "bk_1"}', ErrorCode.UNKNOWN_TOOL),
        (
            "release_booking",
            '{"booking_id": "bk_1"}',
            ErrorCode.UNKNOWN_TOOL,
        ),  # the model never sees compensations
    ],
)
def test_bad_calls_become_typed_rejections(tool: str, arguments: str, code: str) -> None:
    run = Run(started())
    bad = call(tool, arguments, "call_bad")
    run.answer(bad)
    (rejected,) = run.decide()
    assert isinstance(rejected, ToolRejected)
    assert (rejected.step_no, rejected.call_id, rejected.tool, rejected.error.code) == (
        2,
        "call_bad",
        tool,
        code,
    )
    assert run.state.pending == () and run.state.unplanned == () and run.state.next_step == 3
    output = run.state.transcript[-1]
    assert output["call_id"] == "call_bad" and json.loads(output["output"])["error"]["code"] == code
    assert isinstance(
        next_move(run.state, BOOKING, run.tick()), AskModel
    )  # the model hears why and decides again


@pytest.mark.parametrize("field", ["amount", "amount_cents"])
def test_the_model_may_not_name_an_amount(field: str) -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id, field: 1}))
    (denied,) = run.decide()
    assert isinstance(denied, PolicyDenied) and denied.rule == "server_computed_amount"
    assert "server" in denied.reason and run.state.pending == ()


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
    assert (again.error.code, again.error.details) == (
        ErrorCode.INVALID_TOOL_ARGUMENTS.value,
        {"booking_id": booking_id},
    )


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
    assert isinstance(rejected, ToolRejected)
    assert (rejected.error.code, rejected.error.details) == (
        UNKNOWN_BOOKING,
        {"booking_id": "bk_failed"},
    )


def test_a_server_field_named_by_the_model_is_refused_by_the_schema() -> None:
    run = Run(started())
    run.answer(
        call(
            "create_booking",
            {
                "hotel_id": "lis-1",
                "check_in": "2031-12-01",
                "check_out": "2031-12-03",
                "guest_id": "someone-else",
            },
        )
    )
    (rejected,) = run.decide()
    # Only the server names the guest: a call that tries is refused by the tool's schema, naming the field.
    assert isinstance(rejected, ToolRejected)
    assert rejected.error.code == ErrorCode.INVALID_TOOL_ARGUMENTS.value
    assert rejected.error.details["field"] == "guest_id" and run.state.tool_errors == 1


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


def test_a_charge_for_a_released_booking_is_refunded_once_with_the_amount_charged() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay"))
    (failed,) = run.decide()
    run.complete(failed.step_no, status="failed")
    (release,) = run.decide()
    run.complete(release.step_no)
    # A journal from before the `booking_released` rule: the released booking was paid again, and this time
    # the provider took the money.
    payment = paid_anyway(run, booking_id, "call_pay_again")
    charged = run.complete(payment.step_no)

    (refund,) = run.decide()

    assert isinstance(refund, ActionRequested)
    assert (refund.tool, refund.origin, refund.key) == (
        "refund_payment",
        "compensation",
        compensation_key(payment.key, "refund"),
    )
    assert refund.args == {
        "payment_id": charged.result["payment_id"],
        "amount_cents": payment.args["amount_cents"],
        "booking_id": booking_id,
    }
    assert payment.args["amount_cents"] == 2 * NIGHTLY
    assert BOOKING.compensations(run.state, ending=True) == ()  # in flight: not asked for again
    run.complete(refund.step_no)
    assert BOOKING.compensations(run.state, ending=True) == ()  # done: not asked for again
    assert isinstance(next_move(run.state, BOOKING, run.tick()), AskModel)


def test_a_release_in_flight_or_refused_is_no_release_and_its_charge_is_kept() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay"))
    (failed,) = run.decide()
    run.complete(failed.step_no, status="failed")
    (release,) = run.decide()
    # A payment journaled while the release is still in flight (the runtime waits for it; the rule must too).
    again = reply_of((call("create_payment", {"booking_id": booking_id}, "call_pay_again"),))
    run.add(model_answered(run.state, again, run.tick()))
    payment = paid_anyway(run, booking_id, "call_pay_again", answered=True)
    run.complete(payment.step_no)
    assert BOOKING.compensations(run.state, ending=True) == ()
    run.complete(release.step_no, status="failed")
    assert BOOKING.compensations(run.state, ending=True) == ()


def test_each_booking_of_a_run_is_compensated_on_its_own() -> None:
    """A paid booking next to an unpaid one: the unpaid one is released, the paid one kept."""
    run, paid = booked_run()
    run.answer(call("create_payment", {"booking_id": paid}, "call_pay"))
    (payment,) = run.decide()
    run.complete(payment.step_no)
    run.answer(
        call("create_booking", {"hotel_id": "lis-2", "check_in": "2031-12-05", "check_out": "2031-12-06"})
    )
    (second,) = run.decide()
    unpaid = run.complete(second.step_no).result["booking_id"]
    run.answer(call("create_payment", {"booking_id": unpaid}, "call_pay_second"))
    (other_payment,) = run.decide()
    assert isinstance(other_payment, ActionRequested)  # a second booking may be paid: one payment per booking
    run.complete(other_payment.step_no, status="failed")

    (release,) = run.decide()

    assert isinstance(release, ActionRequested)
    assert (release.tool, release.args) == ("release_booking", {"booking_id": unpaid})


def test_a_released_booking_is_refunded_next_to_a_hold_that_is_kept() -> None:
    run = Run(started())
    run.answer(BOOK)
    (first,) = run.decide()
    run.complete(first.step_no)  # held, not paid, and the run goes on: nothing to undo yet
    run.answer(
        call("create_booking", {"hotel_id": "lis-2", "check_in": "2031-12-05", "check_out": "2031-12-06"})
    )
    (second,) = run.decide()
    booking_id = run.complete(second.step_no).result["booking_id"]
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay"))
    (failed,) = run.decide()
    run.complete(failed.step_no, status="failed")
    (release,) = run.decide()
    assert release.args == {"booking_id": booking_id}  # type: ignore[union-attr]
    run.complete(release.step_no)
    payment = paid_anyway(run, booking_id, "call_pay_again")
    run.complete(payment.step_no)

    (refund,) = run.decide()

    assert isinstance(refund, ActionRequested)
    assert (refund.tool, refund.args["booking_id"]) == ("refund_payment", booking_id)


def test_two_bookings_paid_in_one_model_answer_are_two_payments() -> None:
    run, first = booked_run()
    run.answer(
        call("create_booking", {"hotel_id": "lis-2", "check_in": "2031-12-05", "check_out": "2031-12-06"})
    )
    (second_booking,) = run.decide()
    second = run.complete(second_booking.step_no).result["booking_id"]
    run.answer(
        call("create_payment", {"booking_id": first}, "call_pay_1"),
        call("create_payment", {"booking_id": second}, "call_pay_2"),
    )

    payments = run.decide()

    assert [type(p) for p in payments] == [ActionRequested, ActionRequested]
    assert [p.args["booking_id"] for p in payments] == [first, second]  # type: ignore[union-attr]


def test_a_booking_is_paid_in_the_currency_the_provider_held_it_in() -> None:
    run = Run(started())
    run.answer(BOOK)
    (booking,) = run.decide()
    run.complete(booking.step_no, result={"booking_id": "bk_gbp", "total_cents": 19_900, "currency": "GBP"})
    run.answer(call("create_payment", {"booking_id": "bk_gbp"}))
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested)
    assert (payment.args["amount_cents"], payment.args["currency"]) == (19_900, "GBP")


def test_a_stay_of_no_nights_is_refused_with_the_dates_it_was_given() -> None:
    run = Run(started())
    run.answer(
        call("create_booking", {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-01"})
    )
    (rejected,) = run.decide()
    assert isinstance(rejected, ToolRejected)
    assert (rejected.error.code, rejected.error.details) == (
        ErrorCode.INVALID_TOOL_ARGUMENTS.value,
        {"check_in": "2031-12-01", "check_out": "2031-12-01"},
    )


def test_a_release_the_provider_refused_hands_the_run_off_naming_it() -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (payment,) = run.decide()
    run.complete(payment.step_no, status="failed")
    (release,) = run.decide()
    run.complete(release.step_no, status="failed")

    (handed,) = run.decide()

    assert isinstance(handed, RunHandedOff) and handed.reason == "compensation_failed"
    assert release.key in handed.detail


def test_two_refused_compensations_of_one_decision_take_consecutive_steps_and_are_both_named() -> None:
    run = Run(started())
    run.answer(
        BOOK,
        call("create_booking", {"hotel_id": "lis-2", "check_in": "2031-12-05", "check_out": "2031-12-06"}),
    )
    first, second = run.decide()
    run.complete(first.step_no, result={"status": "held"})  # providers answered 200 without the ids
    run.complete(second.step_no, result={"status": "held"})
    run.answer(text="Your rooms are held.")

    refused = run.decide()  # the run ends: both holds are released, and neither release can be made

    assert [type(e) for e in refused] == [ToolRejected, ToolRejected]
    assert [e.step_no for e in refused] == [second.step_no + 2, second.step_no + 3]  # type: ignore[union-attr]
    (handed,) = run.decide()
    assert isinstance(handed, RunHandedOff) and handed.reason == "compensation_failed"
    assert compensation_key(first.key, "release") in handed.detail  # type: ignore[union-attr]
    assert compensation_key(second.key, "release") in handed.detail  # type: ignore[union-attr]
    assert run.state.next_step == second.step_no + 4


def test_each_charge_for_a_released_booking_gets_its_own_refund() -> None:
    """A refund already asked for one charge must not stand in for another charge's refund."""
    run = Run(started())
    run.answer(
        BOOK,
        call("create_booking", {"hotel_id": "lis-2", "check_in": "2031-12-05", "check_out": "2031-12-06"}),
    )
    bookings = run.decide()
    first, second = (run.complete(b.step_no).result["booking_id"] for b in bookings)
    refunds = []
    for booking_id in (first, second):
        run.answer(call("create_payment", {"booking_id": booking_id}, f"pay_{booking_id}"))
        (failed,) = run.decide()
        run.complete(failed.step_no, status="failed")
        (release,) = run.decide()
        run.complete(release.step_no)
        payment = paid_anyway(run, booking_id, f"pay_again_{booking_id}")
        run.complete(payment.step_no)
        (refund,) = run.decide()
        assert isinstance(refund, ActionRequested) and refund.tool == "refund_payment"
        assert refund.key == compensation_key(payment.key, "refund")
        run.complete(refund.step_no)
        refunds.append(refund.args["booking_id"])
    assert refunds == [first, second]


# Projections: what a paid run leaves to the projector ---------------------------------------------------------


def journaled(
    run: Run, tool: str, args: dict[str, object], status: str = "succeeded", origin: str = "compensation"
) -> ActionCompleted:
    """An effect journaled as the runtime would (intent, then receipt), without a model asking for it."""
    step = run.state.next_step
    run.add(
        ActionRequested(
            run_id=RUN,
            at=run.tick(),
            step_no=step,
            call_id=f"call_{tool}_{step}",
            tool=tool,
            family="booking",
            args=dict(args),
            key=f"{RUN}:{step}:{tool}",
            input_hash="h",
            timeout_s=5.0,
            deadline_at=run.now + timedelta(seconds=5),
            origin=origin,
        )
    )
    return run.complete(step, status)


def paid(run: Run, booking_id: str, status: str = "succeeded") -> ActionCompleted:
    run.answer(call("create_payment", {"booking_id": booking_id}, f"call_pay_{run.state.next_step}"))
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested), payment
    return run.complete(payment.step_no, status)


def profiled(profile: GuestProfile | None) -> tuple[Run, str]:
    run, _ = booked_run()
    fresh = Run(msgspec.structs.replace(started(), profile=profile))
    for event in run.events[1:]:
        fresh.add(event)
    fresh.now = run.now
    return fresh, str(fresh.state.succeeded_results("create_booking")[0]["booking_id"])


def test_a_paid_booking_projects_its_confirmation_email_and_crm_record() -> None:
    run, booking_id = booked_run()
    assert BOOKING.projections(run.state) == ()  # held, not paid: nothing to confirm
    paid(run, booking_id)
    assert BOOKING.projections(run.state) == (
        ProjectionCall("send_confirmation_email", {"booking_id": booking_id, "guest_id": "guest-1"}),
        ProjectionCall("update_crm", {"booking_id": booking_id, "guest_id": "guest-1"}),
    )
    assert {p.tool for p in BOOKING.projections(run.state)} <= set(stayhub().projections)


@pytest.mark.parametrize("status", ["failed", "unknown"])
def test_a_payment_that_did_not_succeed_projects_nothing(status: str) -> None:
    run, booking_id = booked_run()
    paid(run, booking_id, status)
    assert BOOKING.projections(run.state) == ()


@pytest.mark.parametrize(
    ("undo", "args"),
    [
        ("release_booking", lambda booking_id: {"booking_id": booking_id}),
        (
            "refund_payment",
            lambda booking_id: {"payment_id": "pay_1", "amount_cents": 24000, "booking_id": booking_id},
        ),
    ],
)
def test_a_paid_booking_released_or_refunded_in_the_run_projects_nothing(
    undo: str, args: Callable[[str], dict[str, object]]
) -> None:
    run, booking_id = booked_run()
    paid(run, booking_id)
    journaled(run, undo, args(booking_id), status="failed")
    assert len(BOOKING.projections(run.state)) == 2  # an undo that failed undid nothing
    journaled(run, undo, args(booking_id))
    assert BOOKING.projections(run.state) == ()


def test_two_payments_of_one_booking_project_one_email_and_one_crm_record() -> None:
    """A journal from before the one-payment rule (or a payment asked again) holds two successful charges of one
    booking: the guest is confirmed once."""
    run, booking_id = booked_run()
    first = paid(run, booking_id)
    journaled(
        run,
        "create_payment",
        {"booking_id": booking_id, "guest_id": "guest-1", "amount_cents": 24000, "currency": "EUR"},
        origin="model",
    )
    assert (
        len([r for r, d in run.state.completed if r.tool == "create_payment" and d.status == "succeeded"])
        == 2
    )
    assert [p.tool for p in BOOKING.projections(run.state)] == ["send_confirmation_email", "update_crm"]
    assert first.status == "succeeded"


@pytest.mark.parametrize(
    ("profile", "to"),
    [
        (GuestProfile(guest_id="guest-1", verified_email="ana@example.com"), "ana@example.com"),
        (GuestProfile(guest_id="guest-1"), None),  # no verified address: the provider's address of record
        (None, None),
    ],
)
def test_the_email_goes_to_the_verified_address_or_the_address_of_record(
    profile: GuestProfile | None, to: str | None
) -> None:
    run, booking_id = profiled(profile)
    paid(run, booking_id)
    email, _ = BOOKING.projections(run.state)
    assert email.args.get("to") == to


def test_never_an_address_from_the_model() -> None:
    """A model that names a recipient anywhere (its payment call, an email call it has no tool for) changes
    nothing: the projection reads the profile and the journaled payment, never the model's words."""
    run, booking_id = profiled(GuestProfile(guest_id="guest-1", verified_email="ana@example.com"))
    run.answer(call("send_confirmation_email", {"booking_id": booking_id, "to": "attacker@evil.example"}))
    (refused,) = run.decide()
    assert isinstance(refused, ToolRejected) and refused.error.code == ErrorCode.UNKNOWN_TOOL.value
    run.answer(
        call("create_payment", {"booking_id": booking_id, "cc": "attacker@evil.example"}, "call_pay_cc")
    )
    (denied,) = run.decide()  # a field the payment does not take: refused before anything is journaled
    assert isinstance(denied, ToolRejected | PolicyDenied)
    paid(run, booking_id)
    projections = BOOKING.projections(run.state)
    assert "attacker" not in json.dumps([p.args for p in projections])
    assert projections[0].args == {"booking_id": booking_id, "guest_id": "guest-1", "to": "ana@example.com"}
