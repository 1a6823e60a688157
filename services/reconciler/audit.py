"""`audit`: cross-checks run journals against what providers hold, and names every disagreement. Pure."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from contracts.run_events import ActionCompleted, ActionRequested, Event, RunCompleted, RunHandedOff
from contracts.tools import Effect, ToolContract


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # effect_without_intent | duplicate_effect | success_without_effect | effect_not_journaled | double_charge | orphan_charge
    key: str
    run_id: str
    detail: str


@dataclass(frozen=True, slots=True)
class Intent:
    run_id: str
    request: ActionRequested
    completed: ActionCompleted | None
    run_terminal: bool


def intents(journals: dict[str, list[Event]]) -> dict[str, Intent]:
    """Every keyed action any run journaled, by idempotency key, with its receipt if one was journaled."""
    out: dict[str, Intent] = {}
    for run_id, events in journals.items():
        terminal = any(isinstance(e, RunCompleted | RunHandedOff) for e in events)
        requested = {e.step_no: e for e in events if isinstance(e, ActionRequested)}
        completed = {e.step_no: e for e in events if isinstance(e, ActionCompleted)}
        for step, request in requested.items():
            out[request.key] = Intent(run_id, request, completed.get(step), terminal)
    return out


def audit(
    journals: dict[str, list[Event]],
    ledger: list[dict[str, Any]],
    found_by_key: dict[str, bool],
    contracts: dict[str, ToolContract],
) -> list[Finding]:
    """`ledger`: the providers' effects (kind, key, ref…); `found_by_key`: provider lookups of journaled write keys."""
    findings: list[Finding] = []
    known = intents(journals)
    for key, count in Counter(entry["key"] for entry in ledger).items():
        if count > 1:
            findings.append(Finding("duplicate_effect", key, _run_of(key), f"{count} effects hold key {key}"))
    for entry in ledger:
        intent = known.get(entry["key"])
        if intent is None:
            findings.append(
                Finding(
                    "effect_without_intent",
                    entry["key"],
                    _run_of(entry["key"]),
                    f"{entry['kind']} {entry.get('ref')} has no journaled intent",
                )
            )
    for key, intent in known.items():
        contract = contracts.get(intent.request.tool)
        if contract is None or contract.effect is Effect.READ or key not in found_by_key:
            continue
        found = found_by_key[key]
        status = intent.completed.status if intent.completed else None
        if status == "succeeded" and not found:
            findings.append(
                Finding(
                    "success_without_effect",
                    key,
                    intent.run_id,
                    f"journal says {intent.request.tool} succeeded; the provider has no effect for the key",
                )
            )
        if found and status != "succeeded" and intent.run_terminal:
            findings.append(
                Finding(
                    "effect_not_journaled",
                    key,
                    intent.run_id,
                    f"the provider holds {intent.request.tool} for the key; the ended run journaled {status or 'no receipt'}",
                )
            )
    findings.extend(_money(known))
    return findings


def _money(known: dict[str, Intent]) -> list[Finding]:
    """Two charges for one booking, or a charge kept for a booking that was released."""
    charges: dict[str, list[Intent]] = defaultdict(list)
    released: set[str] = set()
    refunded: set[str] = set()
    for intent in known.values():
        ok = intent.completed is not None and intent.completed.status == "succeeded"
        booking_id = str(intent.request.args.get("booking_id", ""))
        if intent.request.tool == "create_payment" and ok:
            charges[booking_id].append(intent)
        elif intent.request.tool == "release_booking" and ok:
            released.add(booking_id)
        elif intent.request.tool == "refund_payment" and ok:
            refunded.add(str(intent.request.args.get("payment_id", "")))
    out: list[Finding] = []
    for booking_id, paid in charges.items():
        if len(paid) > 1:
            keys = ", ".join(i.request.key for i in paid)
            out.append(
                Finding(
                    "double_charge",
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
                        "orphan_charge",
                        intent.request.key,
                        intent.run_id,
                        f"charge {payment_id} kept for released booking {booking_id}",
                    )
                )
    return out


def _run_of(key: str) -> str:
    return key.split(":", 1)[0]
