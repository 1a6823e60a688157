"""StayHub's tools, each defined once: its contract, how its provider is asked, and how the audit checks it."""

from __future__ import annotations

from crashsafe.contracts.projections import RetryPolicy
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.argument_checks import parameters_of
from crashsafe.domain.registry import HttpOperation, HttpRequest, Tool
from crashsafe.services.agents.booking.booking_arguments import (
    BookingRefArgs,
    CreateBookingArgs,
    RefundArgs,
    SearchHotelsArgs,
)

# A money record is read by its own status: a declined charge is a refusal, a pending one is not decided yet.
CHARGE_REFUSED = frozenset({"declined", "failed", "canceled"})
CHARGE_UNDECIDED = frozenset({"pending", "processing", "requires_action"})

SEARCH_HOTELS = Tool(
    ToolContract(
        name="search_hotels",
        family="booking",
        effect=Effect.READ,
        timeout_s=2.0,
        retry=RetryRule.RETRY,
        max_attempts=3,
        key_rule=KeyRule.NONE,
        description="Find hotels with rooms in a city for the dates.",
        parameters=parameters_of(SearchHotelsArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest("GET", "/hotels/search", params=args),
        lookup_path=None,
        ref_field=None,
        requires=("city", "check_in", "check_out"),
    ),
    audited=False,
)

CREATE_BOOKING = Tool(
    ToolContract(
        name="create_booking",
        family="booking",
        effect=Effect.WRITE,
        timeout_s=5.0,
        retry=RetryRule.KEYED,
        max_attempts=2,
        compensation="release_booking",
        # One hold per guest, hotel and stay: asked again in any step or run of the tenant, it is this hold.
        key_rule=KeyRule.BUSINESS,
        identity_kind="hold",
        identity=("guest_id", "hotel_id", "check_in", "check_out"),
        description="Hold a room for the guest. Returns a booking_id and the total price.",
        parameters=parameters_of(CreateBookingArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest("POST", "/bookings", json=args),
        lookup_path="/bookings/by-key/{key}",
        ref_field="booking_id",
        requires=("hotel_id", "guest_id", "check_in", "check_out"),
    ),
)

CREATE_PAYMENT = Tool(
    ToolContract(
        name="create_payment",
        family="payment",
        effect=Effect.MONEY,
        timeout_s=10.0,
        retry=RetryRule.NEVER_BLIND,
        max_attempts=2,
        compensation="refund_payment",
        # A booking is paid once: the charge is named by the booking it pays (a retry is a new, approved attempt).
        key_rule=KeyRule.BUSINESS,
        identity_kind="charge",
        identity=("booking_id",),
        description="Charge the guest for a held booking. The amount is computed by the server from the booking.",
        parameters=parameters_of(BookingRefArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest("POST", "/payments", json=args),
        lookup_path="/payments/by-key/{key}",
        ref_field="payment_id",
        requires=("booking_id", "guest_id", "amount_cents", "currency"),
        failed_statuses=CHARGE_REFUSED,
        pending_statuses=CHARGE_UNDECIDED,
    ),
)

SEND_CONFIRMATION_EMAIL = Tool(
    ToolContract(
        name="send_confirmation_email",
        family="notify",
        effect=Effect.WRITE,
        timeout_s=3.0,
        retry=RetryRule.KEYED,
        max_attempts=5,
        # One confirmation per booking and template: a second ask is the first email's receipt.
        key_rule=KeyRule.BUSINESS,
        identity_kind="email",
        identity=("booking_id",),
        identity_fixed={"template": "booking_confirmation"},
        description="Email the guest the confirmation of a paid booking.",
        parameters=parameters_of(BookingRefArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "POST",
            "/emails",
            json={
                "guest_id": args["guest_id"],
                "template": "booking_confirmation",
                "booking_id": args["booking_id"],
                # The guest's verified address when the profile has one (the policy allows no other).
                **({"to": args["to"]} if args.get("to") else {}),
            },
        ),
        lookup_path="/emails/by-key/{key}",
        ref_field="email_id",
        requires=("guest_id", "booking_id"),
    ),
    # Off the run's critical path (seed 001: "CRM and email queued"): planned when a paid booking's run ends,
    # delivered by the projector with its own retries, however long the email provider is down.
    projection=RetryPolicy(),
)

UPDATE_CRM = Tool(
    ToolContract(
        name="update_crm",
        family="notify",
        effect=Effect.WRITE,
        timeout_s=3.0,
        retry=RetryRule.KEYED,
        max_attempts=5,
        # The guest's CRM record of one booking: written once, whoever asks again.
        key_rule=KeyRule.BUSINESS,
        identity_kind="crm",
        identity=("guest_id", "booking_id"),
        description="Record the booking on the guest's CRM profile.",
        parameters=parameters_of(BookingRefArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "POST",
            "/crm/updates",
            json={
                "guest_id": args["guest_id"],
                "booking_id": args["booking_id"],
                "fields": {"last_booking_id": args["booking_id"]},
            },
        ),
        lookup_path="/crm/updates/by-key/{key}",
        ref_field="crm_update_id",
        requires=("guest_id", "booking_id"),
    ),
    projection=RetryPolicy(),
)

RELEASE_BOOKING = Tool(
    ToolContract(
        name="release_booking",
        family="booking",
        effect=Effect.WRITE,
        timeout_s=5.0,
        retry=RetryRule.KEYED,
        max_attempts=3,
        description="Release a held room whose payment failed or was abandoned.",
    ),
    HttpOperation(
        request=lambda args: HttpRequest("POST", f"/bookings/{args['booking_id']}/release", json={}),
        lookup_path="/booking-releases/by-key/{key}",
        ref_field="booking_id",
        requires=("booking_id",),
    ),
    compensation_only=True,
)

REFUND_PAYMENT = Tool(
    ToolContract(
        name="refund_payment",
        family="payment",
        effect=Effect.MONEY,
        timeout_s=10.0,
        retry=RetryRule.NEVER_BLIND,
        max_attempts=2,
        # As a compensation it takes the key of the charge it undoes (keys.compensation_key). Asked by the support
        # agent's model: one refund per payment and amount, so asking twice never pays back twice.
        key_rule=KeyRule.BUSINESS,
        identity_kind="refund",
        identity=("payment_id", "amount_cents"),
        description=(
            "Refund one of the guest's payments: all that is left of it, or amount_cents (in cents) of it."
        ),
        parameters=parameters_of(RefundArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest(
            "POST", f"/payments/{args['payment_id']}/refund", json={"amount_cents": args["amount_cents"]}
        ),
        lookup_path="/refunds/by-key/{key}",
        ref_field="refund_id",
        requires=("payment_id", "amount_cents"),
        failed_statuses=CHARGE_REFUSED,
        pending_statuses=CHARGE_UNDECIDED,
    ),
    compensation_only=True,
)

TOOLS: tuple[Tool, ...] = (
    SEARCH_HOTELS,
    CREATE_BOOKING,
    CREATE_PAYMENT,
    SEND_CONFIRMATION_EMAIL,
    UPDATE_CRM,
    RELEASE_BOOKING,
    REFUND_PAYMENT,
)
