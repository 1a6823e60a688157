"""Wire shapes of the sandbox provider: request bodies, stored records and ledger entries, all msgspec JSON."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

Cents = Annotated[int, msgspec.Meta(ge=0)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class EffectKind(StrEnum):
    """What a ledger entry records; also the namespace an Idempotency-Key lives in."""

    BOOKING = "booking"
    BOOKING_RELEASE = "booking_release"
    CHARGE = "charge"
    REFUND = "refund"
    EMAIL = "email"
    CRM_UPDATE = "crm_update"


# A provider keeps each account's records apart: a request made in one account (its `Provider-Account` header,
# never its body) finds nothing of another's, as with a real provider's per-account API keys.

# Request bodies. Unknown fields are ignored rather than refused so that a caller adding
# tracing fields does not break; the idempotency fingerprint covers only the fields below.


class BookingRequest(msgspec.Struct, frozen=True):
    hotel_id: NonEmpty
    guest_id: NonEmpty
    check_in: str
    check_out: str
    account: str = ""  # its Provider-Account header ("": the default account)


class ReleaseRequest(msgspec.Struct, frozen=True):
    booking_id: NonEmpty
    account: str = ""  # its Provider-Account header ("": the default account)


class PaymentRequest(msgspec.Struct, frozen=True):
    booking_id: NonEmpty
    guest_id: NonEmpty
    amount_cents: Cents
    # Optional because the booking already fixes the currency; when sent it must match.
    currency: str | None = None
    account: str = ""  # its Provider-Account header ("": the default account)


class RefundBody(msgspec.Struct, frozen=True):
    # None refunds whatever is left of the payment.
    amount_cents: Cents | None = None
    account: str = ""  # its Provider-Account header ("": the default account)


class RefundRequest(msgspec.Struct, frozen=True):
    payment_id: NonEmpty
    amount_cents: Cents | None = None
    account: str = ""  # its Provider-Account header ("": the default account)


class EmailRequest(msgspec.Struct, frozen=True):
    guest_id: NonEmpty
    template: NonEmpty
    booking_id: str | None = None
    # Where it goes; absent: the guest's address of record (the runtime sends only a verified address).
    to: str | None = None
    account: str = ""  # its Provider-Account header ("": the default account)


class CrmUpdateRequest(msgspec.Struct, frozen=True):
    guest_id: NonEmpty
    booking_id: str | None = None
    fields: dict[str, Any] = {}
    account: str = ""  # its Provider-Account header ("": the default account)


class AuditRecordIn(msgspec.Struct, frozen=True):
    """One journaled run event, as the audit trail receives it; `event_id` (`<run_id>/<n>`) is its identity."""

    event_id: NonEmpty
    run_id: NonEmpty
    tenant: str
    type: NonEmpty
    at: str
    event: dict[str, Any]


class AuditBatch(msgspec.Struct, frozen=True):
    """Body of POST /audit/records: a run's events, any prefix or slice of them, sent as often as it takes."""

    records: list[AuditRecordIn]


# Records: what the provider answers and stores. `key` is the Idempotency-Key that created it.


class Hotel(msgspec.Struct, frozen=True):
    hotel_id: str
    name: str
    city: str
    nightly_rate_cents: int
    currency: str
    available: bool


class HotelSearch(msgspec.Struct, frozen=True):
    hotels: list[Hotel]


class Booking(msgspec.Struct, frozen=True, omit_defaults=True):
    booking_id: str
    hotel_id: str
    hotel_name: str
    city: str
    guest_id: str
    check_in: str
    check_out: str
    nights: int
    total_cents: int
    currency: str
    status: str  # "held" | "released"
    key: str
    account: str = ""  # the provider account it belongs to


class Payment(msgspec.Struct, frozen=True, omit_defaults=True):
    payment_id: str
    booking_id: str
    guest_id: str
    amount_cents: int
    currency: str
    status: str  # "captured" | "declined" | "pending" (until settles_at, then "captured")
    key: str
    settles_at: str | None = None
    account: str = ""  # the provider account it belongs to


class Refund(msgspec.Struct, frozen=True, omit_defaults=True):
    refund_id: str
    payment_id: str
    booking_id: str
    guest_id: str
    amount_cents: int
    currency: str
    status: str  # "succeeded"
    key: str
    account: str = ""  # the provider account it belongs to


class Email(msgspec.Struct, frozen=True):
    email_id: str
    guest_id: str
    template: str
    booking_id: str | None
    status: str  # "sent"
    key: str
    to: str | None = None
    account: str = ""  # the provider account it belongs to


class CrmUpdate(msgspec.Struct, frozen=True, omit_defaults=True):
    crm_update_id: str
    guest_id: str
    booking_id: str | None
    fields: dict[str, Any]
    status: str  # "applied"
    key: str
    account: str = ""  # the provider account it belongs to


Record = Booking | Payment | Refund | Email | CrmUpdate


class AuditAccepted(msgspec.Struct, frozen=True):
    """The audit trail's answer: how many of the batch's records were new, how many it already held."""

    accepted: int
    duplicates: int


class AuditRecords(msgspec.Struct, frozen=True):
    """GET /audit/records?run_id=: the run's records the trail holds, in journal position order."""

    records: list[AuditRecordIn]


class AuditEntry(msgspec.Struct, frozen=True):
    """One audit record in the ledger view: no money, no Idempotency-Key, so not a `LedgerEntry` (the effect
    audit compares those with journaled intents); `guest_id` is the run's, once its run.started is held."""

    event_id: str
    run_id: str
    tenant: str
    type: str
    at: str
    guest_id: str | None = None


class LedgerEntry(msgspec.Struct, frozen=True):
    """One real-world effect; the crash tests count these (one charge per booking, never two)."""

    kind: EffectKind
    key: str
    guest_id: str
    amount_cents: int
    currency: str | None
    ref: str
    at: str


class PaymentSummary(msgspec.Struct, frozen=True, omit_defaults=True):
    """One of a guest's payments as `GET /payments?guest_id=` lists it: what was paid and what is left to refund."""

    payment_id: str
    booking_id: str
    guest_id: str
    amount_cents: int
    currency: str
    status: str
    refunded_cents: int
    account: str = ""  # the provider account it belongs to


class GuestPayments(msgspec.Struct, frozen=True):
    payments: list[PaymentSummary]


class LedgerView(msgspec.Struct, frozen=True):
    entries: list[LedgerEntry]
    counts: dict[str, int]
    # Requests answered from the idempotency store: evidence that retries arrived and were absorbed.
    replays: dict[str, int]
    # The audit trail: one entry per event id held, and how many re-sent records it absorbed.
    audit: list[AuditEntry] = []
    audit_records: int = 0
    audit_duplicates: int = 0
