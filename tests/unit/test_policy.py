"""The policy engine, decided purely from the journal: every rule allows, denies or holds; an approval is bound to
the exact action's input hash; loops hand off; every hand-off tells the guest something defined."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.keys import action_key, tool_input_hash
from crashsafe.contracts.memory import GuestProfile
from crashsafe.contracts.policy import (
    ApprovalAbove,
    Approver,
    RefundWithinPaid,
    StayWindow,
    ToolsAllowed,
    VerifiedRecipient,
)
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    HandOffReason,
    Origin,
    PolicyDenied,
    RunHandedOff,
    ToolRejected,
)
from crashsafe.contracts.tools import Effect, RetryRule, ToolContract
from crashsafe.domain.argument_checks import check_schema, parameters_of
from crashsafe.domain.call_plan import plan_calls
from crashsafe.domain.decide import Append, AwaitApproval, next_move
from crashsafe.domain.fold import summarize
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.money_rules import approved
from crashsafe.domain.policy_engine import check_asked, check_policy
from crashsafe.domain.policy_verdicts import Allow, Deny, Hold, money
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents.booking.booking_tools import REFUND_PAYMENT, SEND_CONFIRMATION_EMAIL
from crashsafe.services.agents.support.support_agent import SupportAgent
from tests.support.runs import BOOKING, NIGHTLY, RUN, T0, Run, booked_run, call, started

PAY = BOOKING.tools["create_payment"]
BOOK_TOOL = BOOKING.tools["create_booking"]


def run_with(profile: GuestProfile | None = None) -> Run:
    return Run(msgspec.structs.replace(started(), profile=profile))


def hold_room(run: Run, hotel: str, check_in: str, check_out: str) -> str:
    run.answer(call("create_booking", {"hotel_id": hotel, "check_in": check_in, "check_out": check_out}))
    (booking,) = run.decide()
    assert isinstance(booking, ActionRequested), booking
    return str(run.complete(booking.step_no).result["booking_id"])


def pay_asked(run: Run, booking_id: str, call_id: str = "call_pay") -> Any:
    run.answer(call("create_payment", {"booking_id": booking_id}, call_id))
    (event,) = run.decide()
    return event


def decide_approval(
    run: Run, request: ApprovalRequested, decision: str, input_hash: str | None = None
) -> None:
    run.add(
        ApprovalDecided(
            run_id=RUN,
            at=run.tick(),
            approval_id=request.approval_id,
            decision=decision,
            decided_by="guest:guest-1" if request.approver == Approver.GUEST else "manager:m-1",
            input_hash=input_hash or request.input_hash,
        )
    )


def prepared_payment(state: RunState, booking_id: str) -> tuple[dict[str, Any], str]:
    args = BOOKING.prepare(state, PAY, {"booking_id": booking_id})
    assert isinstance(args, dict)
    return args, tool_input_hash("create_payment", args)


# StayWindow --------------------------------------------------------------------------------------------------


def test_a_stay_of_360_nights_is_denied_with_the_figures_and_nothing_is_requested() -> None:
    run = Run(started())
    run.answer(call("search_hotels", {"city": "Paris", "check_in": "2031-01-01", "check_out": "2031-12-27"}))
    (denied,) = run.decide()
    assert isinstance(denied, PolicyDenied) and denied.rule == "stay_window"
    assert "360 nights" in denied.reason and "30" in denied.reason
    assert run.state.pending == () and run.state.denials == 1
    output = json.loads(run.state.transcript[-1]["output"])
    assert output["error"]["code"] == "not_allowed" and output["error"]["rule"] == "stay_window"


def test_a_stay_of_exactly_the_longest_allowed_is_allowed() -> None:
    run = Run(started())
    run.answer(
        call("create_booking", {"hotel_id": "lis-1", "check_in": "2031-01-01", "check_out": "2031-01-31"})
    )
    (booking,) = run.decide()
    assert isinstance(booking, ActionRequested)


@pytest.mark.parametrize(("check_in", "allowed"), [("2026-11-30", False), ("2026-12-01", True)])
def test_a_check_in_before_today_is_denied(check_in: str, allowed: bool) -> None:
    run = Run(started())  # today is T0, 2026-12-01
    check_out = "2026-12-05"
    run.answer(call("create_booking", {"hotel_id": "lis-1", "check_in": check_in, "check_out": check_out}))
    (event,) = run.decide()
    if allowed:
        assert isinstance(event, ActionRequested)
    else:
        assert isinstance(event, PolicyDenied) and event.rule == "stay_window" and "past" in event.reason


def test_the_stay_window_is_the_pinned_configs() -> None:
    config = AgentConfig(agent="booking", rules=[StayWindow(name="short_stays", max_nights=3)])
    run = Run(started())
    run.answer(
        call("create_booking", {"hotel_id": "lis-1", "check_in": "2031-01-01", "check_out": "2031-01-05"})
    )
    move = next_move(run.state, BOOKING, run.tick(), config)
    assert isinstance(move, Append)
    (denied,) = move.events
    assert isinstance(denied, PolicyDenied) and denied.rule == "short_stays" and "4 nights" in denied.reason


# The amount is the server's ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["amount", "amount_cents", "price", "total", "currency", "Amount"])
def test_any_amount_the_model_names_is_a_denial(field: str) -> None:
    run, booking_id = booked_run()
    run.answer(call("create_payment", {"booking_id": booking_id, field: 100}))
    (denied,) = run.decide()
    assert isinstance(denied, PolicyDenied) and denied.rule == "server_computed_amount"
    assert field in denied.reason and run.state.pending == ()


def test_a_tool_that_declares_an_amount_may_take_it() -> None:
    """A support refund names its amount (the refund rule bounds it); only undeclared amounts are the server's."""
    refund = ToolContract(
        name="refund_payment",
        family="payment",
        effect=Effect.MONEY,
        timeout_s=10.0,
        retry=RetryRule.NEVER_BLIND,
        parameters={"type": "object", "properties": {"payment_id": {}, "amount_cents": {}}},
    )
    state = Run(started()).state
    config = AgentConfig(agent="support")
    assert (
        check_asked(state, config, refund, {"payment_id": "pay_1", "amount_cents": 5}, Origin.MODEL) is None
    )
    assert isinstance(
        check_asked(state, config, refund, {"payment_id": "pay_1", "price": 5}, Origin.MODEL), Deny
    )


def test_a_booking_without_a_currency_is_not_charged_as_euros() -> None:
    run = Run(started())
    run.answer(
        call("create_booking", {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"})
    )
    (booking,) = run.decide()
    run.complete(booking.step_no, result={"booking_id": "bk_nocur", "total_cents": 24_000})
    denied = pay_asked(run, "bk_nocur")
    assert isinstance(denied, PolicyDenied) and denied.rule == "server_computed_amount"
    assert "currency" in denied.reason and run.state.pending == ()


def test_paying_a_booking_released_in_this_run_is_denied() -> None:
    run, booking_id = booked_run()
    failed = pay_asked(run, booking_id)
    run.complete(failed.step_no, status="failed")
    (release,) = run.decide()
    assert isinstance(release, ActionRequested) and release.tool == "release_booking"
    # Still being released: paying it is denied already.
    args, hashed = prepared_payment(run.state, booking_id)
    in_flight = check_policy(run.state, BOOKING.config, PAY, args, hashed, Origin.MODEL, run.tick(), BOOKING)
    assert isinstance(in_flight, Deny) and in_flight.rule == "undone_effect"
    run.complete(release.step_no)
    denied = pay_asked(run, booking_id, "call_pay_again")
    assert isinstance(denied, PolicyDenied) and denied.rule == "undone_effect"


# ApprovalAbove -----------------------------------------------------------------------------------------------


def long_stay() -> tuple[Run, str]:
    """14 nights at 120.00: 1,680.00, above the guest's 1,500.00 limit."""
    run = Run(started())
    return run, hold_room(run, "lis-1", "2031-12-01", "2031-12-15")


def test_a_payment_at_or_under_the_limit_is_not_held() -> None:
    run, booking_id = booked_run()  # 240.00
    assert isinstance(pay_asked(run, booking_id), ActionRequested)


def test_a_payment_above_the_limit_waits_for_the_guests_yes_naming_what_is_paid() -> None:
    run, booking_id = long_stay()
    held = pay_asked(run, booking_id)
    assert isinstance(held, ApprovalRequested)
    assert (held.approver, held.amount_cents, held.currency) == ("guest", 14 * NIGHTLY, "EUR")
    assert (
        held.question
        == f"Reply yes to pay 1,680.00 EUR for booking {booking_id} at lis-1, 2031-12-01 to 2031-12-15"
    )
    assert held.expires_at == held.at + timedelta(hours=24)
    assert held.input_hash == tool_input_hash("create_payment", held.args)
    assert run.state.pending == () and isinstance(next_move(run.state, BOOKING, run.tick()), AwaitApproval)


def test_charges_under_the_limit_count_together_against_it() -> None:
    """Twelve nights (1,440.00) paid, then the adjacent twelve: each under the guest's 1,500.00, not together."""
    run = Run(started())
    first = hold_room(run, "lis-1", "2031-12-01", "2031-12-13")
    paid = pay_asked(run, first)
    assert isinstance(paid, ActionRequested)
    run.complete(paid.step_no)
    held = pay_asked(run, hold_room(run, "lis-1", "2031-12-13", "2031-12-25"), "call_pay_2")
    assert isinstance(held, ApprovalRequested) and held.amount_cents == 12 * NIGHTLY
    assert "(2,880.00 EUR in all with this conversation's other payments)" in held.question


def test_an_approved_action_passes_once_it_prepares_to_the_approved_hash() -> None:
    run, booking_id = long_stay()
    held = pay_asked(run, booking_id)
    decide_approval(run, held, ApprovalStatus.APPROVED)
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested) and payment.tool == "create_payment"
    assert payment.input_hash == held.input_hash and payment.call_id == held.call.call_id


def test_an_approval_of_another_hash_approves_nothing() -> None:
    run, booking_id = long_stay()
    held = pay_asked(run, booking_id)
    decide_approval(run, held, ApprovalStatus.APPROVED, input_hash="f" * 64)
    assert not approved(run.state, "create_payment", held.input_hash, Approver.GUEST)
    (again,) = run.decide()
    assert isinstance(again, ApprovalRequested) and again.approval_id != held.approval_id


def test_a_changed_action_needs_its_own_approval() -> None:
    run, first = long_stay()
    held = pay_asked(run, first)
    decide_approval(run, held, ApprovalStatus.APPROVED)
    (payment,) = run.decide()
    run.complete(payment.step_no)
    second = hold_room(run, "lis-2", "2031-12-20", "2032-01-05")  # another booking, another amount
    args, hashed = prepared_payment(run.state, second)
    assert hashed != held.input_hash
    verdict = check_policy(run.state, BOOKING.config, PAY, args, hashed, Origin.MODEL, run.tick())
    assert isinstance(verdict, Hold) and verdict.amount_cents == 16 * NIGHTLY


def test_a_rejected_approval_is_no_approval() -> None:
    run, booking_id = long_stay()
    held = pay_asked(run, booking_id)
    decide_approval(run, held, ApprovalStatus.REJECTED)
    assert not approved(run.state, "create_payment", held.input_hash, Approver.GUEST)
    output = json.loads(run.state.transcript[-1]["output"])
    assert output["error"]["code"] == "approval_rejected" and run.state.pending == ()


def test_a_corporate_guest_pays_nothing_without_the_managers_approval() -> None:
    run = run_with(GuestProfile(guest_id="guest-1", corporate=True, manager="m-1"))
    booking_id = hold_room(run, "lis-1", "2031-12-01", "2031-12-03")  # 240.00: under the guest's limit
    held = pay_asked(run, booking_id)
    assert isinstance(held, ApprovalRequested)
    assert (held.approver, held.rule) == ("manager", "corporate_approval")
    assert "m-1" in held.question and "240.00 EUR" in held.question
    decide_approval(run, held, ApprovalStatus.APPROVED)
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested)


def test_a_corporate_guests_large_payment_asks_the_manager_once() -> None:
    run = run_with(GuestProfile(guest_id="guest-1", corporate=True))
    booking_id = hold_room(run, "lis-1", "2031-12-01", "2031-12-15")
    held = pay_asked(run, booking_id)
    assert isinstance(held, ApprovalRequested) and held.approver == "manager"
    decide_approval(run, held, ApprovalStatus.APPROVED)  # the manager's yes passes the guest's rule too
    (payment,) = run.decide()
    assert isinstance(payment, ActionRequested)


def test_a_guests_yes_does_not_pass_a_managers_rule() -> None:
    run = run_with(GuestProfile(guest_id="guest-1", corporate=True))
    booking_id = hold_room(run, "lis-1", "2031-12-01", "2031-12-15")
    only_guest = AgentConfig(
        agent="booking", rules=[ApprovalAbove(tool="create_payment", limit_cents=150_000)]
    )
    args, hashed = prepared_payment(run.state, booking_id)
    run.answer(call("create_payment", {"booking_id": booking_id}, "call_pay"))
    move = next_move(run.state, BOOKING, run.tick(), only_guest)
    assert isinstance(move, Append)
    (held,) = move.events
    assert isinstance(held, ApprovalRequested) and held.approver == "guest"
    run.add(held)
    decide_approval(run, held, ApprovalStatus.APPROVED)
    verdict = check_policy(run.state, BOOKING.config, PAY, args, hashed, Origin.MODEL, run.tick())
    assert isinstance(verdict, Hold) and verdict.approver == "manager"


@pytest.mark.parametrize("amount", [1_680.5, 168_000.0, "168000", True, None])
def test_an_amount_that_is_not_whole_cents_is_refused_never_allowed(amount: object) -> None:
    """A provider's quote in a float (1680.5, or even 168000.0), a string, a bool or no amount at all: the
    limit cannot be judged in cents, so the charge is refused, not paid unasked."""
    run, booking_id = long_stay()
    args, _ = prepared_payment(run.state, booking_id)
    args = {**args, "amount_cents": amount}
    if amount is None:
        del args["amount_cents"]
    rule = ApprovalAbove(tool="create_payment", limit_cents=150_000)
    config = AgentConfig(agent="booking", rules=[rule])
    hashed = tool_input_hash("create_payment", args)
    verdict = check_policy(run.state, config, PAY, args, hashed, Origin.MODEL, run.tick())
    assert isinstance(verdict, Deny) and verdict.rule == "approval_above", verdict
    assert "whole number of cents" in verdict.reason


def test_compensations_are_never_held_back() -> None:
    run, booking_id = long_stay()
    args, hashed = prepared_payment(run.state, booking_id)
    assert check_policy(run.state, BOOKING.config, PAY, args, hashed, Origin.COMPENSATION, T0) == Allow()


# VerifiedRecipient -------------------------------------------------------------------------------------------


# The booking agent's model has no message tool any more (the confirmation email is a projection whose `to` comes
# from the profile alone: tests/unit/test_booking_rules.py); the rule is checked here on a catalog that gives a
# model a message tool, the email's own contract.
EMAIL = SEND_CONFIRMATION_EMAIL.contract
MESSAGE_RULES = AgentConfig(agent="booking", rules=[VerifiedRecipient()])


@pytest.mark.parametrize("field", ["to", "email", "cc", "bcc", "recipient"])
def test_the_model_naming_a_recipient_is_denied(field: str) -> None:
    run, booking_id = booked_run()
    args = {"booking_id": booking_id, field: "attacker@evil.example"}
    denied = check_asked(run.state, MESSAGE_RULES, EMAIL, args, Origin.MODEL)
    assert isinstance(denied, Deny) and denied.rule == "verified_recipient" and "verified" in denied.reason
    assert check_asked(run.state, MESSAGE_RULES, EMAIL, {"booking_id": booking_id}, Origin.MODEL) is None
    # The booking agent's own model asking it is refused before any rule: not a tool it has.
    run.answer(call("send_confirmation_email", args))
    (refused,) = run.decide()
    assert isinstance(refused, ToolRejected) and refused.error.code == ErrorCode.UNKNOWN_TOOL.value
    assert run.state.pending == ()


def test_the_booking_agents_default_rules_name_only_tools_it_has() -> None:
    named = {rule.tool for rule in BOOKING.config.rules if hasattr(rule, "tool")}
    named |= {t for rule in BOOKING.config.rules for t in getattr(rule, "tools", [])}
    assert named <= set(BOOKING.tools) and "verified_recipient" not in {r.name for r in BOOKING.config.rules}


@pytest.mark.parametrize(
    ("verified", "to", "allowed"),
    [("ana@example.com", "ana@example.com", True), ("ana@example.com", "attacker@evil.example", False)],
)
def test_a_prepared_recipient_other_than_the_verified_one_is_denied(
    verified: str, to: str, allowed: bool
) -> None:
    run = run_with(GuestProfile(guest_id="guest-1", verified_email=verified))
    args = {"booking_id": "bk_1", "guest_id": "guest-1", "to": to}
    verdict = check_policy(run.state, MESSAGE_RULES, EMAIL, args, "h", Origin.PLAN, T0)
    if allowed:
        assert verdict == Allow()
    else:
        assert isinstance(verdict, Deny) and verdict.rule == "verified_recipient"


# OneActiveHold -----------------------------------------------------------------------------------------------


def test_a_second_hold_over_overlapping_dates_is_denied() -> None:
    run = Run(started())
    first = hold_room(run, "lis-1", "2031-12-01", "2031-12-05")
    run.answer(
        call("create_booking", {"hotel_id": "lis-2", "check_in": "2031-12-04", "check_out": "2031-12-08"})
    )
    (denied,) = run.decide()
    assert isinstance(denied, PolicyDenied) and denied.rule == "one_active_hold" and first in denied.reason


def test_the_same_hold_asked_again_and_other_dates_are_not_denied() -> None:
    run = Run(started())
    hold_room(run, "lis-1", "2031-12-01", "2031-12-05")
    same = {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-05", "guest_id": "guest-1"}
    later = {"hotel_id": "lis-2", "check_in": "2031-12-05", "check_out": "2031-12-07", "guest_id": "guest-1"}
    for args in (same, later):
        verdict = check_policy(run.state, BOOKING.config, BOOK_TOOL, args, "h", Origin.MODEL, T0)
        assert verdict == Allow(), args


def test_a_pending_hold_counts_and_a_released_one_does_not() -> None:
    run = Run(started())
    run.answer(
        call("create_booking", {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-05"})
    )
    (pending,) = run.decide()
    other = {"hotel_id": "lis-2", "check_in": "2031-12-02", "check_out": "2031-12-03", "guest_id": "guest-1"}
    assert isinstance(check_policy(run.state, BOOKING.config, BOOK_TOOL, other, "h", Origin.MODEL, T0), Deny)
    booking_id = run.complete(pending.step_no).result["booking_id"]
    failed = pay_asked(run, booking_id)
    run.complete(failed.step_no, status="failed")
    (release,) = run.decide()
    run.complete(release.step_no)
    assert check_policy(run.state, BOOKING.config, BOOK_TOOL, other, "h", Origin.MODEL, T0) == Allow()


# RefundWithinPaid (the support agent's rule) -----------------------------------------------------------------

REFUND = REFUND_PAYMENT.contract  # as the support agent offers it to its model: it declares amount_cents
# As a catalog from before the rule's parameters published it: the support agent's own rule fills them in.
SUPPORT = AgentConfig(agent="support", rules=[RefundWithinPaid(manager_above_cents=15_000)])
SUPPORT_AGENT = SupportAgent()


def found_payments(payments: list[dict[str, Any]], run: Run | None = None) -> Run:
    """A run whose `find_payments` read answered with these payments."""
    run = run or Run(started(agent="booking"))
    step = run.state.next_step
    found = ActionRequested(
        run_id=RUN,
        at=run.tick(),
        step_no=step,
        call_id=f"call_find_{step}",
        tool="find_payments",
        family="payment",
        args={"guest_id": "guest-1"},
        key=action_key(RUN, step),
        input_hash="0" * 64,
        timeout_s=5.0,
        deadline_at=run.now + timedelta(seconds=5),
    )
    run.add(found)
    run.complete(found.step_no, result={"payments": payments})
    return run


def refund_verdict(run: Run, payment_id: str, amount: int) -> Any:
    args = {"payment_id": payment_id, "amount_cents": amount}
    return check_policy(
        run.state,
        SUPPORT,
        REFUND,
        args,
        tool_input_hash("refund_payment", args),
        Origin.MODEL,
        T0,
        SUPPORT_AGENT,
    )


PAID = {"payment_id": "pay_1", "guest_id": "guest-1", "amount_cents": 30_000, "currency": "EUR"}


def test_a_refund_within_what_was_paid_and_under_the_managers_limit_is_allowed() -> None:
    assert refund_verdict(found_payments([PAID]), "pay_1", 15_000) == Allow()


def test_a_refund_above_the_managers_limit_is_held_for_a_manager() -> None:
    verdict = refund_verdict(found_payments([PAID]), "pay_1", 20_000)
    assert isinstance(verdict, Hold) and verdict.approver == "manager" and verdict.amount_cents == 20_000


@pytest.mark.parametrize(
    ("payments", "payment_id", "amount", "why"),
    [
        ([PAID], "pay_1", 30_001, "more than"),
        ([{**PAID, "refunded_cents": 20_000}], "pay_1", 15_000, "more than"),
        ([{**PAID, "guest_id": "guest-2"}], "pay_1", 100, "not one of this guest's"),
        ([PAID], "pay_unseen", 100, "not one of this guest's"),
        ([PAID], "pay_1", 0, "positive"),
    ],
)
def test_a_refund_beyond_the_guests_own_payment_is_denied(
    payments: list[dict[str, Any]], payment_id: str, amount: int, why: str
) -> None:
    verdict = refund_verdict(found_payments(payments), payment_id, amount)
    assert isinstance(verdict, Deny) and verdict.rule == "refund_within_paid" and why in verdict.reason


def test_refunds_already_asked_in_the_run_count_against_what_is_left() -> None:
    run = found_payments([PAID])
    step = run.state.next_step
    run.add(
        ActionRequested(
            run_id=RUN,
            at=run.tick(),
            step_no=step,
            call_id="call_refund_1",
            tool="refund_payment",
            family="payment",
            args={"payment_id": "pay_1", "amount_cents": 14_000},
            key=action_key(RUN, step),
            input_hash="1" * 64,
            timeout_s=10.0,
            deadline_at=run.now + timedelta(seconds=10),
        )
    )
    assert isinstance(refund_verdict(run, "pay_1", 16_001), Deny)
    assert refund_verdict(run, "pay_1", 1_000) == Allow()
    # 14,000 asked and 15,000 more: under the manager's limit each, above it together.
    held = refund_verdict(run, "pay_1", 15_000)
    assert (
        isinstance(held, Hold) and held.approver == "manager" and "140.00 EUR refunded already" in held.reason
    )


def test_a_payment_refunded_before_this_run_counts_towards_the_managers_limit() -> None:
    run = found_payments([{**PAID, "refunded_cents": 14_000}])
    assert refund_verdict(run, "pay_1", 1_000) == Allow()
    held = refund_verdict(run, "pay_1", 1_001)
    assert isinstance(held, Hold) and held.approver == "manager" and held.amount_cents == 1_001


def test_a_refund_still_in_flight_when_the_payments_were_listed_again_counts_against_what_is_left() -> None:
    """14,000 of 30,000 asked; before its answer the model lists the payments again (the listing does not show
    the refund yet) and asks for 20,000 more: 34,000 of a 30,000 payment, denied."""
    run = found_payments([PAID])
    step = run.state.next_step
    run.add(
        ActionRequested(
            run_id=RUN,
            at=run.tick(),
            step_no=step,
            call_id="call_refund_1",
            tool="refund_payment",
            family="payment",
            args={"payment_id": "pay_1", "amount_cents": 14_000},
            key=action_key(RUN, step),
            input_hash="1" * 64,
            timeout_s=10.0,
            deadline_at=run.now + timedelta(seconds=10),
        )
    )
    found_payments([PAID], run)  # listed while the refund is in flight
    denied = refund_verdict(run, "pay_1", 20_000)
    assert isinstance(denied, Deny) and "more than the 160.00 EUR left" in denied.reason
    run.complete(step)  # answered after the listing: still not in it
    assert isinstance(refund_verdict(run, "pay_1", 20_000), Deny)


# ToolsAllowed ------------------------------------------------------------------------------------------------


def test_a_tool_outside_the_allowed_list_is_denied_to_the_model_only() -> None:
    config = AgentConfig(agent="booking", rules=[ToolsAllowed(tools=["search_hotels"])])
    state = Run(started()).state
    args = {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}
    denied = check_asked(state, config, BOOK_TOOL, args, Origin.MODEL)
    assert isinstance(denied, Deny) and denied.rule == "tools_allowed"
    assert check_asked(state, config, BOOK_TOOL, args, Origin.COMPENSATION) is None
    assert check_asked(state, config, BOOK_TOOL, args, Origin.PLAN) is None
    narrowed = AgentConfig(agent="booking", tools=["search_hotels"])
    assert isinstance(check_asked(state, narrowed, BOOK_TOOL, args, Origin.MODEL), Deny)


# Tool-call schema validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", [BOOKING, SupportAgent()], ids=lambda a: a.name)
def test_each_model_tools_schema_is_generated_from_its_argument_struct(agent: Any) -> None:
    """Every tool any agent's model may call has one argument struct, and its schema is generated from it."""
    assert set(agent.argument_types) == set(agent.tools)
    for name, struct in agent.argument_types.items():
        assert agent.tools[name].parameters == parameters_of(struct)
        assert agent.tools[name].parameters["additionalProperties"] is False


@pytest.mark.parametrize(
    ("agent", "tool", "arguments", "field"),
    [
        (
            BOOKING,
            "remember_preference",
            {"name": "quiet_room", "value": "yes", "guest_id": "g-2"},
            "guest_id",
        ),
        (BOOKING, "remember_preference", {"name": "password", "value": "hunter2"}, "name"),
        (SupportAgent(), "find_payments", {"guest_id": "another-guest"}, "guest_id"),
        (SupportAgent(), "refund_payment", {"payment_id": "pay_1", "amount_cents": -500}, "amount_cents"),
        (SupportAgent(), "refund_payment", {"payment_id": "pay_1", "to_account": "x"}, "to_account"),
    ],
)
def test_every_agents_calls_are_checked_against_their_structs(
    agent: Any, tool: str, arguments: dict[str, Any], field: str
) -> None:
    misfit = check_schema(tool, arguments, agent.argument_types[tool])
    assert misfit is not None and misfit.code == ErrorCode.INVALID_TOOL_ARGUMENTS.value
    assert misfit.details["field"] == field


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"city": 7, "check_in": "2031-12-01", "check_out": "2031-12-03"}, "city"),
        ({"city": "Lisbon", "check_in": "next friday", "check_out": "2031-12-03"}, "check_in"),
        ({"city": "Lisbon", "check_in": "2031-12-01", "check_out": "2031-12-03", "stars": 5}, "stars"),
        ({"city": "", "check_in": "2031-12-01", "check_out": "2031-12-03"}, "city"),
    ],
)
def test_arguments_that_do_not_fit_the_schema_are_rejected_naming_the_field(
    arguments: dict[str, Any], field: str
) -> None:
    run = Run(started())
    run.answer(call("search_hotels", arguments))
    (rejected,) = run.decide()
    assert isinstance(rejected, ToolRejected)
    assert rejected.error.code == ErrorCode.INVALID_TOOL_ARGUMENTS.value
    assert rejected.error.details["field"] == field and run.state.tool_errors == 1


# Loops -------------------------------------------------------------------------------------------------------


def test_the_same_call_asked_more_than_max_repeats_times_hands_off_as_a_loop() -> None:
    run = Run(started())
    search = {"city": "Paris", "check_in": "2031-12-01", "check_out": "2031-12-03"}
    for i in range(BOOKING.config.max_repeats):
        # The same arguments in another key order and spacing are the same call.
        arguments = json.dumps(dict(reversed(search.items())) if i % 2 else search, indent=i)
        run.answer(call("search_hotels", arguments, f"call_{i}"))
        (request,) = run.decide()
        assert isinstance(request, ActionRequested)
        run.complete(request.step_no)
    run.answer(call("search_hotels", search, "call_again"))
    (handed,) = run.decide()
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.LOOP
    assert handed.reply == handoff_reply(HandOffReason.LOOP)
    assert run.state.steps_used < run.state.budget.max_steps
    assert summarize(run.state).reply == handed.reply


def test_calls_after_a_held_one_stop_at_the_step_budget_instead_of_one_rejection_each() -> None:
    """A hostile answer: a payment held for approval, then hundreds of calls. Each skipped call was journaled as a
    rejection of its own, past the step budget (an answer of 1 MB: 20,000 events and half a minute of a blocked
    runtime). Past the budget the run hands off, as it does for calls that are not skipped, and lets the hold go."""
    run, booking = booked_run()
    stay = {"city": "Paris", "check_in": "2031-12-01", "check_out": "2031-12-03"}
    flood = [call("search_hotels", stay, f"call_{i}") for i in range(200)]
    run.answer(call("create_payment", {"booking_id": booking}, "call_pay"), *flood)
    config = AgentConfig(agent="booking", rules=[ApprovalAbove(tool="create_payment", limit_cents=0)])
    events = plan_calls(run.state, BOOKING, run.state.unplanned, run.now, config=config)
    assert isinstance(events[0], ApprovalRequested)
    assert isinstance(events[-1], RunHandedOff) and events[-1].reason == HandOffReason.BUDGET_STEPS
    assert len(events) <= run.state.budget.max_steps
    run.add(*events)
    assert summarize(run.state).reply == events[-1].reply  # not the approval's question: nobody is asked
    release = next_move(run.state, BOOKING, run.tick(), config)
    assert isinstance(release, Append) and [e.tool for e in release.events] == ["release_booking"]  # type: ignore[union-attr]


def test_other_arguments_are_not_a_loop() -> None:
    run = Run(started())
    for day in range(1, 6):
        args = {"city": "Paris", "check_in": f"2031-12-0{day}", "check_out": f"2031-12-0{day + 1}"}
        run.answer(call("search_hotels", args))
        (request,) = run.decide()
        assert isinstance(request, ActionRequested)
        run.complete(request.step_no)


def test_the_loop_limit_is_the_pinned_configs() -> None:
    config = AgentConfig(agent="booking", max_repeats=1)
    run = Run(started())
    search = call("search_hotels", {"city": "Paris", "check_in": "2031-12-01", "check_out": "2031-12-03"})
    run.answer(search, msgspec.structs.replace(search, call_id="call_twin"))
    events = plan_calls(run.state, BOOKING, run.state.unplanned, run.tick(), config=config)
    assert [type(e) for e in events] == [RunHandedOff]


# Hand-off replies --------------------------------------------------------------------------------------------


def test_every_hand_off_reason_has_its_own_defined_reply() -> None:
    replies = {reason: handoff_reply(reason) for reason in HandOffReason}
    assert all(replies.values()) and len(set(replies.values())) == len(replies)
    assert handoff_reply("a_reason_from_a_newer_writer")  # an unknown reason still tells the guest something


def test_a_budget_hand_off_carries_its_reply_into_the_summary() -> None:
    run = Run(started(budget=msgspec.structs.replace(started().budget, max_steps=2)))
    run.answer(call("search_hotels", {"city": "Paris", "check_in": "2031-12-01", "check_out": "2031-12-03"}))
    (search,) = run.decide()
    run.complete(search.step_no)
    (handed,) = run.decide()
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.BUDGET_STEPS
    assert summarize(run.state).reply == handoff_reply(HandOffReason.BUDGET_STEPS)


def test_money_is_shown_with_thousands_and_cents() -> None:
    assert (money(184_000, "EUR"), money(5, "GBP"), money(0, "")) == ("1,840.00 EUR", "0.05 GBP", "0.00")


def test_a_refund_amount_above_what_is_left_is_denied_as_asked_before_the_agent_prepares_it() -> None:
    run = found_payments([PAID])
    over = {"payment_id": "pay_1", "amount_cents": 30_001}
    denied = check_asked(run.state, SUPPORT, REFUND, over, Origin.MODEL, SUPPORT_AGENT)
    assert isinstance(denied, Deny) and denied.rule == "refund_within_paid"
    # A payment the run has not seen is the agent's to refuse (find it first); within what is left, no verdict yet.
    assert (
        check_asked(
            run.state,
            SUPPORT,
            REFUND,
            {"payment_id": "pay_x", "amount_cents": 1},
            Origin.MODEL,
            SUPPORT_AGENT,
        )
        is None
    )
    assert (
        check_asked(
            run.state,
            SUPPORT,
            REFUND,
            {"payment_id": "pay_1", "amount_cents": 20_000},
            Origin.MODEL,
            SUPPORT_AGENT,
        )
        is None
    )
