"""Bookings and revenue per hour, folded from run events: plain functions over plain data, no I/O.

An effect is counted once per action key (the idempotency key the provider deduplicates by), never once per
event: a redelivered event, a receipt replayed in the same run and a business key settled again by another
run (`hold:<digest>` asked twice) all name one effect, which the provider's ledger also holds once. Folding an
event is therefore idempotent, and it does not depend on the order receipts and requests arrive in (a receipt
seen before its request waits for it), so redelivery after a crash is harmless whatever it re-sends.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, JournalEvent, UnknownEvent
from crashsafe.contracts.tool_messages import OutcomeStatus

# The StayHub tools whose receipts are the business: a hold, its release, a charge, a refund.
BOOKING, RELEASE, PAYMENT, REFUND = "create_booking", "release_booking", "create_payment", "refund_payment"
COUNTED_TOOLS = frozenset({BOOKING, RELEASE, PAYMENT, REFUND})
# What a figure is keyed by: the UTC hour of the receipt's `at`.
HOUR_FORMAT = "%Y-%m-%dT%H:00Z"
# Receipts kept waiting for a request not seen yet: far more than a crash's redelivery can put out of order.
MAX_EARLY = 10_000


class Hour(msgspec.Struct, kw_only=True):
    """One hour's figures. Money is per currency, in cents; revenue is what was charged less what was refunded."""

    bookings: int = 0  # holds made (create_booking succeeded)
    released: int = 0  # holds given back (release_booking succeeded)
    payments: int = 0  # charges taken (create_payment succeeded)
    declined: int = 0  # charges the provider refused (create_payment failed)
    refunds: int = 0  # refunds paid (refund_payment succeeded: a compensation or a support agent's)
    charged_cents: dict[str, int] = {}
    refunded_cents: dict[str, int] = {}
    unpriced: int = 0  # a charge or refund whose receipt and request both lack a usable amount and currency

    def revenue_cents(self) -> dict[str, int]:
        currencies = sorted(set(self.charged_cents) | set(self.refunded_cents))
        return {c: self.charged_cents.get(c, 0) - self.refunded_cents.get(c, 0) for c in currencies}


class Intent(msgspec.Struct, kw_only=True):
    """What a journaled request says about its effect, kept until its receipt settles it."""

    tool: str
    args: dict[str, Any] = {}


class Receipt(msgspec.Struct, kw_only=True):
    """A settled receipt whose request this consumer has not seen yet (redelivered out of order)."""

    status: str
    at: datetime
    result: dict[str, Any] = {}


class Figures(msgspec.Struct, kw_only=True):
    """Everything the consumer knows: its figures per hour and what it needs to count each effect once."""

    hours: dict[str, Hour] = {}
    intents: dict[str, Intent] = {}  # action key -> request of a counted tool, not yet settled
    early: dict[str, Receipt] = {}  # action key -> settled receipt waiting for its request
    settled: dict[str, str] = {}  # action key -> the status it was counted as (each key counted once)
    events: int = 0  # events folded (every delivery, redeliveries included)
    unknown: int = 0  # events of a type this version does not know: skipped
    undecodable: int = 0  # deliveries that are not an event at all: skipped, never a wedge
    last_seq: int = 0  # the highest stream sequence folded (progress, not the dedupe)


def hour_of(at: datetime) -> str:
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime(HOUR_FORMAT)


def fold(figures: Figures, event: JournalEvent | None, seq: int = 0) -> Figures:
    """`figures` with one delivered event folded in (`None`: a delivery that did not decode). Mutates and
    returns `figures`: the consumer persists it before it acknowledges the delivery."""
    figures.events += 1
    figures.last_seq = max(figures.last_seq, seq)
    match event:
        case None:
            figures.undecodable += 1
        case UnknownEvent():
            figures.unknown += 1
        case ActionRequested(tool=tool, key=key, args=args) if tool in COUNTED_TOOLS:
            if key in figures.settled:
                return figures
            early = figures.early.pop(key, None)
            intent = Intent(tool=tool, args=dict(args))
            if early is None:
                figures.intents.setdefault(key, intent)
            else:
                _settle(figures, key, intent, early)
        case ActionCompleted(key=key, status=status, result=result, at=at):
            if key in figures.settled or status not in (OutcomeStatus.SUCCEEDED, OutcomeStatus.FAILED):
                return figures  # counted already, or not settled yet (unknown, conflict: no effect to count)
            receipt = Receipt(status=status.value, at=at, result=dict(result))
            waiting = figures.intents.pop(key, None)
            if waiting is None:
                # Its request comes later (redelivered after a crash), or never (another tool's receipt): kept
                # for a while, the oldest dropped first; a request is redelivered within one ack wait.
                figures.early.setdefault(key, receipt)
                while len(figures.early) > MAX_EARLY:
                    figures.early.pop(next(iter(figures.early)))
            else:
                _settle(figures, key, waiting, receipt)
        case _:
            pass
    return figures


def _settle(figures: Figures, key: str, intent: Intent, receipt: Receipt) -> None:
    figures.settled[key] = receipt.status
    hour = figures.hours.setdefault(hour_of(receipt.at), Hour())
    succeeded = receipt.status == OutcomeStatus.SUCCEEDED.value
    if intent.tool == PAYMENT and not succeeded:
        hour.declined += 1
    elif not succeeded:
        return  # a refused hold, release or refund moved nothing
    elif intent.tool == BOOKING:
        hour.bookings += 1
    elif intent.tool == RELEASE:
        hour.released += 1
    elif intent.tool == PAYMENT:
        hour.payments += 1
        _add_money(hour, hour.charged_cents, receipt.result, intent.args)
    elif intent.tool == REFUND:
        hour.refunds += 1
        _add_money(hour, hour.refunded_cents, receipt.result, intent.args)


def _add_money(hour: Hour, into: dict[str, int], result: dict[str, Any], args: dict[str, Any]) -> None:
    """The provider's answer says what moved; the journaled request is the fallback. Nothing else is guessed."""
    amount = _cents(result.get("amount_cents"))
    if amount is None:
        amount = _cents(args.get("amount_cents"))
    currency = _currency(result.get("currency")) or _currency(args.get("currency"))
    if amount is None or currency is None:
        hour.unpriced += 1
        return
    into[currency] = into.get(currency, 0) + amount


def _cents(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _currency(value: object) -> str | None:
    return value.upper() if isinstance(value, str) and 0 < len(value) <= 8 and value.isalpha() else None


class Row(msgspec.Struct, kw_only=True):
    """One line of output (a JSON line, or a table row)."""

    hour: str
    bookings: int
    released: int
    payments: int
    declined: int
    refunds: int
    revenue_cents: dict[str, int]
    charged_cents: dict[str, int]
    refunded_cents: dict[str, int]
    unpriced: int = 0


def rows(figures: Figures) -> list[Row]:
    """The figures per hour, oldest first."""
    return [
        Row(
            hour=name,
            bookings=h.bookings,
            released=h.released,
            payments=h.payments,
            declined=h.declined,
            refunds=h.refunds,
            revenue_cents=h.revenue_cents(),
            charged_cents=dict(sorted(h.charged_cents.items())),
            refunded_cents=dict(sorted(h.refunded_cents.items())),
            unpriced=h.unpriced,
        )
        for name, h in sorted(figures.hours.items())
    ]


def totals(figures: Figures) -> Row:
    """Every hour added up (what the sandbox ledger's whole book must equal)."""
    total = Hour()
    for h in figures.hours.values():
        total.bookings += h.bookings
        total.released += h.released
        total.payments += h.payments
        total.declined += h.declined
        total.refunds += h.refunds
        total.unpriced += h.unpriced
        for into, part in ((total.charged_cents, h.charged_cents), (total.refunded_cents, h.refunded_cents)):
            for currency, cents in part.items():
                into[currency] = into.get(currency, 0) + cents
    (row,) = rows(Figures(hours={"total": total}))
    return row
