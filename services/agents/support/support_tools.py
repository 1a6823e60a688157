"""The support agent's own tool: reading the guest's payments. It refunds with the booking agent's `refund_payment`."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.argument_checks import parameters_of
from crashsafe.domain.registry import HttpOperation, HttpRequest, Tool


class FindPaymentsArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The listing is always all of the run's guest's payments; a model may say which booking the guest means."""

    booking_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | UnsetType = UNSET


FIND_PAYMENTS = Tool(
    ToolContract(
        name="find_payments",
        family="payment",
        effect=Effect.READ,
        timeout_s=2.0,
        retry=RetryRule.RETRY,
        max_attempts=3,
        # A read: no effect, nothing to deduplicate, and its answer must be fresh (what is left to refund).
        key_rule=KeyRule.NONE,
        description=(
            "List the guest's payments: payment_id, booking_id, amount_cents, currency, status and how much of"
            " each is already refunded (refunded_cents). Takes no arguments: the guest is the one you talk to."
        ),
        parameters=parameters_of(FindPaymentsArgs),
    ),
    HttpOperation(
        request=lambda args: HttpRequest("GET", "/payments", params={"guest_id": args["guest_id"]}),
        lookup_path=None,
        ref_field=None,
        requires=("guest_id",),
    ),
    audited=False,
)
