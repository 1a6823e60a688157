"""The policy engine: an agent's rules (data, from the pinned catalog) checked against an action before it is
journaled as requested, purely from the run's journal. Pure.

Two checks, both before anything is journaled as requested: `check_asked` reads the call as the model wrote
it (which tool, which fields it dared to name), `check_policy` the action the agent prepared from it (the
server's amount, the stay's dates, the run's holds and payments). Compensations are never held back."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.policy import (
    ApprovalAbove,
    Approver,
    OneActiveHold,
    RefundWithinPaid,
    StayWindow,
    ToolsAllowed,
    VerifiedRecipient,
)
from crashsafe.contracts.run_events import Origin
from crashsafe.contracts.tools import Effect, ToolContract
from crashsafe.domain.guest_scope import owns
from crashsafe.domain.money_rules import approval_above, payment_seen, refund_within_paid
from crashsafe.domain.policy_verdicts import LIVE, Allow, Deny, Hold, Verdict, rule_name
from crashsafe.domain.run_state import RunState

# Rules that hold for every agent, whatever its catalog entry says: not configurable, so not in `Rule`.
SERVER_COMPUTED_AMOUNT = "server_computed_amount"
BOOKING_RELEASED = "booking_released"
# Fields a model could use to name a price or where money or a message goes. A tool whose own parameters
# declare one of them (a support refund's amount) may take it; for every other tool, naming one is a denial.
AMOUNT_FIELDS = frozenset(
    {"amount", "amount_cents", "price", "price_cents", "total", "total_cents", "cost", "fee", "currency"}
)
RECIPIENT_FIELDS = frozenset({"to", "email", "recipient", "recipients", "cc", "bcc", "reply_to", "address"})


# The call as asked -------------------------------------------------------------------------------------------


def check_asked(
    state: RunState, config: AgentConfig, contract: ToolContract, asked: dict[str, Any], origin: Origin
) -> Deny | None:
    """What the rules say about a model's call as it wrote it, before its arguments are validated or prepared:
    a tool outside the agent's list, or a field only the server may fill (an amount, a recipient)."""
    if origin != Origin.MODEL:
        return None
    if config.tools and contract.name not in config.tools:
        return Deny(
            "tools_allowed", f"{contract.name} is not one of this agent's tools: {sorted(config.tools)}"
        )
    for rule in config.rules:
        if isinstance(rule, ToolsAllowed) and contract.name not in rule.tools:
            return Deny(
                rule_name(rule), f"{contract.name} is not allowed here; allowed: {sorted(rule.tools)}"
            )
    declared = set(contract.parameters.get("properties", {}))
    named = sorted(k for k in asked if k.lower() in AMOUNT_FIELDS and k not in declared)
    if named:
        return Deny(
            SERVER_COMPUTED_AMOUNT,
            f"{', '.join(named)} may not be named for {contract.name}: the server computes the amount from the "
            "booking; pass only the booking_id",
        )
    for rule in config.rules:
        if isinstance(rule, RefundWithinPaid) and contract.name == rule.tool and "amount_cents" in asked:
            # An amount the model names for a payment of this guest the run has seen is bounded here, as asked
            # (a payment the run has not seen is the agent's `prepare` to refuse: find it first).
            seen = payment_seen(state, str(asked.get("payment_id", "")))
            if seen is not None and owns(state, seen[0]):
                bounded = refund_within_paid(state, rule, asked, "")
                if isinstance(bounded, Deny):
                    return bounded
        if isinstance(rule, VerifiedRecipient) and contract.name in rule.tools:
            recipients = sorted(k for k in asked if k.lower() in RECIPIENT_FIELDS and k not in declared)
            if recipients:
                return Deny(
                    rule_name(rule),
                    f"{', '.join(recipients)} may not be named for {contract.name}: a message goes only to the "
                    "guest's verified address",
                )
    return None


# The action as prepared --------------------------------------------------------------------------------------


def check_policy(
    state: RunState,
    config: AgentConfig,
    contract: ToolContract,
    args: dict[str, Any],
    input_hash: str,
    origin: Origin,
    now: datetime,
) -> Verdict:
    """What the rules say about one prepared action. Compensations are never held back.

    Denials win over holds; of several holds, a manager's is asked first (a manager's approval also passes
    the guest's rule, so a corporate guest is not asked twice)."""
    if origin == Origin.COMPENSATION:
        return Allow()
    built_in = _built_in(state, contract, args)
    if built_in is not None:
        return built_in
    holds: list[Hold] = []
    for rule in config.rules:
        verdict: Verdict = Allow()
        match rule:
            case StayWindow() if contract.name in rule.tools:
                verdict = _stay_window(rule, args, now)
            case ApprovalAbove() if contract.name == rule.tool:
                verdict = approval_above(state, rule, contract, args, input_hash)
            case VerifiedRecipient() if contract.name in rule.tools:
                verdict = _verified_recipient(state, rule, args)
            case OneActiveHold() if contract.name == rule.tool:
                verdict = _one_active_hold(state, rule, args)
            case RefundWithinPaid() if contract.name == rule.tool:
                verdict = refund_within_paid(state, rule, args, input_hash)
        if isinstance(verdict, Deny):
            return verdict
        if isinstance(verdict, Hold):
            holds.append(verdict)
    if holds:
        return next((h for h in holds if h.approver == Approver.MANAGER), holds[0])
    return Allow()


def _built_in(state: RunState, contract: ToolContract, args: dict[str, Any]) -> Deny | None:
    """A charge (money, with a compensation) needs the provider's currency, and never pays a released booking."""
    if contract.effect != Effect.MONEY or contract.compensation is None:
        return None
    if "amount_cents" in args and not args.get("currency"):
        return Deny(
            SERVER_COMPUTED_AMOUNT,
            f"the provider gave no currency for booking {args.get('booking_id', '')}; it cannot be charged "
            "until the booking is priced in a known currency",
        )
    booking_id = args.get("booking_id")
    if booking_id and _released(state, str(booking_id)):
        return Deny(
            BOOKING_RELEASED,
            f"booking {booking_id} was released in this run; hold the room again before paying",
        )
    return None


def _released(state: RunState, booking_id: str) -> bool:
    pending = any(
        p.tool == "release_booking" and p.args.get("booking_id") == booking_id for p in state.pending
    )
    return pending or any(
        req.tool == "release_booking" and req.args.get("booking_id") == booking_id and done.status in LIVE
        for req, done in state.completed
    )


def _dates(args: dict[str, Any]) -> tuple[date, date] | None:
    try:
        return date.fromisoformat(str(args["check_in"])), date.fromisoformat(str(args["check_out"]))
    except (KeyError, ValueError):
        return None


def _stay_window(rule: StayWindow, args: dict[str, Any], now: datetime) -> Verdict:
    stay = _dates(args)
    if stay is None:
        return Allow()  # nothing dated in this action (the agent's argument rules refuse bad dates)
    check_in, check_out = stay
    today = now.date()
    if rule.not_in_past and check_in < today:
        return Deny(
            rule_name(rule), f"check-in {check_in.isoformat()} is in the past (today is {today.isoformat()})"
        )
    nights = (check_out - check_in).days
    if nights > rule.max_nights:
        return Deny(
            rule_name(rule),
            f"{nights} nights from {check_in.isoformat()} to {check_out.isoformat()} is more than the "
            f"{rule.max_nights} nights a stay may last; ask the guest for shorter dates",
        )
    return Allow()


def _verified_recipient(state: RunState, rule: VerifiedRecipient, args: dict[str, Any]) -> Verdict:
    """Defence in depth after `check_asked`: the prepared recipient is the profile's verified address or none."""
    to = args.get("to")
    if not to:
        return Allow()
    profile = state.started.profile
    verified = profile.verified_email if profile is not None else ""
    if to != verified:
        return Deny(rule_name(rule), "a message goes only to the guest's verified address")
    return Allow()


def _overlap(a: tuple[date, date], b: tuple[date, date]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _one_active_hold(state: RunState, rule: OneActiveHold, args: dict[str, Any]) -> Verdict:
    stay = _dates(args)
    if stay is None:
        return Allow()
    holds: list[tuple[dict[str, Any], str]] = [(p.args, "") for p in state.pending if p.tool == rule.tool]
    for req, done in state.completed:
        if req.tool == rule.tool and done.status in LIVE:
            booking_id = str(done.result.get("booking_id", ""))
            if not (booking_id and _released(state, booking_id)):
                holds.append((req.args, booking_id))
    for held, booking_id in holds:
        other = _dates(held)
        if other is None or held.get("guest_id") != args.get("guest_id") or not _overlap(stay, other):
            continue
        if held.get("hotel_id") == args.get("hotel_id") and other == stay:
            continue  # the same hold asked again: the same action, answered from its receipt
        return Deny(
            rule_name(rule),
            f"this run already holds {held.get('hotel_id', '')} from {other[0].isoformat()} to "
            f"{other[1].isoformat()}{f' (booking {booking_id})' if booking_id else ''}; pay or let go of "
            "that hold before holding another room for overlapping dates",
        )
    return Allow()
