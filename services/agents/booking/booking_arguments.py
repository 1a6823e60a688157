"""The booking tools' arguments as the model may send them: typed structs, each tool's schema generated from one."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

IsoDate = Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}-\d{2}$", description="ISO date, YYYY-MM-DD")]
Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class SearchHotelsArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    city: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    check_in: IsoDate
    check_out: IsoDate


class CreateBookingArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    hotel_id: Ident
    check_in: IsoDate
    check_out: IsoDate


class BookingRefArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every tool that acts on a held booking names only it: the server fills in the rest."""

    booking_id: Ident


class RefundArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A refund as the support agent's model asks it: absent `amount_cents` is all that is left of the payment."""

    payment_id: Ident
    amount_cents: Annotated[int, msgspec.Meta(ge=1)] | UnsetType = UNSET


# The model's tools only: the confirmation email and the CRM record are projections, whose arguments the agent's
# `projections` builds from the journal (the model names nothing of them).
ARGUMENT_TYPES: dict[str, type[msgspec.Struct]] = {
    "search_hotels": SearchHotelsArgs,
    "create_booking": CreateBookingArgs,
    "create_payment": BookingRefArgs,
}
