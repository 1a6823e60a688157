"""The booking agent's own audit rules: two charges for one booking, a charge kept for a released booking. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from enum import StrEnum

from crashsafe.contracts.audit import Finding, Intent


class BookingFinding(StrEnum):
    DOUBLE_CHARGE = "double_charge"
    ORPHAN_CHARGE = "orphan_charge"


def money_rules(known: Mapping[str, Intent]) -> list[Finding]:
    """Two charges for one booking, or a charge kept for a booking that was released (in an ended run)."""
    charges: dict[str, list[Intent]] = defaultdict(list)
    released: set[str] = set()
    refunded: set[str] = set()
    for intent in known.values():
        booking_id = str(intent.request.args.get("booking_id", ""))
        if not intent.succeeded:
            continue
        if intent.request.tool == "create_payment":
            charges[booking_id].append(intent)
        elif intent.request.tool == "release_booking":
            released.add(booking_id)
        elif intent.request.tool == "refund_payment":
            refunded.add(str(intent.request.args.get("payment_id", "")))
    out: list[Finding] = []
    for booking_id, paid in charges.items():
        if len(paid) > 1:
            keys = ", ".join(i.request.key for i in paid)
            out.append(
                Finding(
                    BookingFinding.DOUBLE_CHARGE,
                    paid[0].request.key,
                    paid[0].run_id,
                    f"booking {booking_id} charged {len(paid)} times: {keys}",
                )
            )
        for intent in paid:
            payment_id = str(intent.completed.result.get("payment_id", "")) if intent.completed else ""
            if booking_id in released and payment_id not in refunded and intent.run_terminal:
                out.append(
                    Finding(
                        BookingFinding.ORPHAN_CHARGE,
                        intent.request.key,
                        intent.run_id,
                        f"charge {payment_id} kept for released booking {booking_id}",
                    )
                )
    return out
