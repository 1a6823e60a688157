"""StayHub's booking rules as the neutral built-ins' parameters, and the booking agent's approval wording."""

from __future__ import annotations

from typing import Any

from crashsafe.contracts.policy import ApprovalAbove, Approver, DateWindow, OneActiveHold
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.policy_verdicts import Hold, default_question, money
from crashsafe.domain.run_state import RunState

# The booking agent's built-in rules (the catalog's default): a stay's check-in not in the past and at most 30
# nights; amounts above 1,500.00 wait for the guest's "yes", a corporate guest's bookings for their manager's
# approval (a booking paid again is not a second charge); one live hold per guest and overlapping dates. No
# `VerifiedRecipient`: the agent's model has no tool that sends a message. The confirmation email is a projection
# whose `to` `projections` takes from the guest's profile alone (the verified address, else none: the provider's
# address of record), so no recipient from the model can reach it; the rule stays in the contracts for a catalog
# giving a model a message tool.
DEFAULT_RULES = (
    DateWindow(
        tools=["search_hotels", "create_booking"],
        start_field="check_in",
        end_field="check_out",
        start_label="check-in",
        max_nights=30,
    ),
    ApprovalAbove(
        tool="create_payment", limit_cents=150_000, approver=Approver.GUEST.value, for_field="booking_id"
    ),
    ApprovalAbove(
        name="corporate_approval",
        tool="create_payment",
        limit_cents=0,
        approver=Approver.MANAGER.value,
        corporate_only=True,
        for_field="booking_id",
    ),
    OneActiveHold(
        tool="create_booking",
        holder_fields=["guest_id"],
        same_fields=["hotel_id"],
        start_field="check_in",
        end_field="check_out",
        result_field="booking_id",
    ),
)


def _booking(state: RunState, booking_id: str) -> dict[str, Any]:
    """A booking held in this run: what was asked (hotel, dates) under what the provider answered."""
    for req, done in state.completed:
        if (
            req.tool == "create_booking"
            and done.status == OutcomeStatus.SUCCEEDED
            and done.result.get("booking_id") == booking_id
        ):
            return {**req.args, **done.result}
    return {}


def booking_question(state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
    """A payment held for approval names the booking, its hotel and dates, and what the run pays in all."""
    if tool.name != "create_payment" or hold.amount_cents is None:
        return default_question(state, tool, args, hold)
    amount, currency = hold.amount_cents, hold.currency
    booking_id = str(args.get("booking_id", ""))
    booking = _booking(state, booking_id)
    what = f"{money(amount, currency)} for booking {booking_id}"
    if booking:
        what += f" at {booking.get('hotel_name') or booking.get('hotel_id', '')}, "
        what += f"{booking.get('check_in', '')} to {booking.get('check_out', '')}"
    if hold.total_cents is not None and hold.total_cents != amount:
        what += f" ({money(hold.total_cents, currency)} in all with this conversation's other payments)"
    if hold.approver == Approver.MANAGER:
        profile = state.started.profile
        manager = profile.manager if profile is not None and profile.manager else "the manager"
        return f"Approve paying {what} for {state.guest_id}? ({manager} decides)"
    return f"Reply yes to pay {what}"
