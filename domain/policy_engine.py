"""The policy engine: an agent's rules (data, from the pinned catalog) checked against an action before it is
journaled as requested, purely from the run's journal. Pure.

Two checks, both before anything is journaled as requested: `check_asked` reads the call as the model wrote
it (which tool, which fields it dared to name), `check_policy` the action the agent prepared from it (the
server's amount, the stay's dates, the run's holds and payments). Compensations are never held back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.contracts.policy import (
    ApprovalAbove,
    Approver,
    OneActiveHold,
    RefundWithinPaid,
    Rule,
    StayWindow,
    ToolsAllowed,
    VerifiedRecipient,
)
from crashsafe.contracts.run_events import Origin
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import Effect, ToolContract
from crashsafe.domain.guest_scope import owns
from crashsafe.domain.run_state import RunState


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Deny:
    """Journaled as `run.policy_denied`; the model is told `not_allowed`, nothing reaches an executor."""

    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Hold:
    """The action waits for `approver`'s approval of exactly these prepared arguments (`run.approval_requested`)."""

    rule: str
    reason: str
    approver: str
    ttl_s: float
    amount_cents: int | None = None
    currency: str = ""
    question: str = ""


Verdict = Allow | Deny | Hold

# Rules that hold for every agent, whatever its catalog entry says: not configurable, so not in `Rule`.
SERVER_COMPUTED_AMOUNT = "server_computed_amount"
BOOKING_RELEASED = "booking_released"
# Fields a model could use to name a price or where money or a message goes. A tool whose own parameters
# declare one of them (a support refund's amount) may take it; for every other tool, naming one is a denial.
AMOUNT_FIELDS = frozenset(
    {"amount", "amount_cents", "price", "price_cents", "total", "total_cents", "cost", "fee", "currency"}
)
RECIPIENT_FIELDS = frozenset({"to", "email", "recipient", "recipients", "cc", "bcc", "reply_to", "address"})
# What a held (not yet released) booking or a charge may be in: succeeded, or not known to have failed.
_LIVE = (OutcomeStatus.SUCCEEDED, OutcomeStatus.UNKNOWN)


def rule_name(rule: Rule) -> str:
    """What a denial names: the rule's own `name`, else its kind (`stay_window`)."""
    tag = type(rule).__struct_config__.tag
    return rule.name or str(tag).removeprefix("rule.")


def money(cents: int, currency: str) -> str:
    """1,840.00 EUR: how an amount is shown to the person asked to approve it."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100:,}.{cents % 100:02d} {currency}".strip()


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
            seen = _payment(state, str(asked.get("payment_id", "")))
            if seen is not None and owns(state, seen[0]):
                bounded = _refund_within_paid(state, rule, asked, "")
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
                verdict = _approval_above(state, rule, contract, args, input_hash)
            case VerifiedRecipient() if contract.name in rule.tools:
                verdict = _verified_recipient(state, rule, args)
            case OneActiveHold() if contract.name == rule.tool:
                verdict = _one_active_hold(state, rule, args)
            case RefundWithinPaid() if contract.name == rule.tool:
                verdict = _refund_within_paid(state, rule, args, input_hash)
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
        req.tool == "release_booking" and req.args.get("booking_id") == booking_id and done.status in _LIVE
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


def approved(state: RunState, tool: str, input_hash: str, approver: str) -> bool:
    """Whether exactly this action (tool and input hash) was approved by `approver` (or by a manager, who may
    approve what a guest may). A changed action has another hash: it needs its own approval."""
    asked = {r.approval_id: r for r in state.approval_requests}
    for decided in state.approvals:
        request = asked.get(decided.approval_id)
        if (
            request is not None
            and decided.decision == ApprovalStatus.APPROVED
            and decided.input_hash == input_hash
            and request.input_hash == input_hash
            and request.tool == tool
            and request.approver in (approver, Approver.MANAGER)
        ):
            return True
    return False


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


def _approval_above(
    state: RunState, rule: ApprovalAbove, contract: ToolContract, args: dict[str, Any], input_hash: str
) -> Verdict:
    amount = args.get("amount_cents")
    if not isinstance(amount, int):
        return Allow()
    currency = str(args.get("currency", ""))
    # What the run charges in all counts, not this charge alone: stays split into charges under the limit (twelve
    # nights, then the next twelve) would otherwise never be confirmed by anyone.
    earlier = _charged(state, contract.name, currency, str(args.get("booking_id", "")))
    if amount + earlier <= rule.limit_cents:
        return Allow()
    profile = state.started.profile
    if rule.corporate_only and not (profile is not None and profile.corporate):
        return Allow()
    if approved(state, contract.name, input_hash, rule.approver):
        return Allow()
    booking_id = str(args.get("booking_id", ""))
    booking = _booking(state, booking_id)
    what = f"{money(amount, currency)} for booking {booking_id}"
    if booking:
        what += f" at {booking.get('hotel_name') or booking.get('hotel_id', '')}, "
        what += f"{booking.get('check_in', '')} to {booking.get('check_out', '')}"
    if earlier:
        what += f" ({money(amount + earlier, currency)} in all with this conversation's other payments)"
    if rule.approver == Approver.MANAGER:
        manager = profile.manager if profile is not None and profile.manager else "the manager"
        question = f"Approve paying {what} for {state.guest_id}? ({manager} decides)"
    else:
        question = f"Reply yes to pay {what}"
    return Hold(
        rule=rule_name(rule),
        reason=f"{money(amount + earlier, currency)} is above {money(rule.limit_cents, currency)}; "
        f"{rule.approver} approval needed",
        approver=rule.approver,
        ttl_s=rule.ttl_s,
        amount_cents=amount,
        currency=currency,
        question=question,
    )


def _charged(state: RunState, tool: str, currency: str, booking_id: str) -> int:
    """Cents this run has charged with `tool` in `currency` for other bookings: pending, done or maybe done."""
    asked = [p for p in state.pending if p.tool == tool]
    asked += [req for req, done in state.completed if req.tool == tool and done.status in _LIVE]
    return sum(
        int(r.args.get("amount_cents") or 0)
        for r in asked
        if str(r.args.get("currency", "")) == currency and str(r.args.get("booking_id", "")) != booking_id
    )


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
        if req.tool == rule.tool and done.status in _LIVE:
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


def _payment(state: RunState, payment_id: str) -> tuple[dict[str, Any], int] | None:
    """A payment this run has seen, and the place in `state.completed` after which its refunds are not in it: as
    the latest `find_payments` answer lists it (an older answer may miss refunds made since), or as the run made
    it (-1: none of the run's refunds are in it). A refund answered after the listing, or still in flight, is not
    in the listing whatever its step: the model may list the payments again while a refund is on its way."""
    found = [
        (index, done.result)
        for index, (req, done) in enumerate(state.completed)
        if req.tool == "find_payments" and done.status == OutcomeStatus.SUCCEEDED
    ]
    if found:
        at, result = found[-1]
        payments = result.get("payments", [])
        for payment in payments if isinstance(payments, list) else []:
            if isinstance(payment, dict) and payment.get("payment_id") == payment_id:
                return payment, at
    for req, done in state.completed:
        if (
            req.tool == "create_payment"
            and done.status == OutcomeStatus.SUCCEEDED
            and done.result.get("payment_id") == payment_id
        ):
            made = {
                "payment_id": payment_id,
                "guest_id": req.args.get("guest_id"),
                ACCOUNT_ARG: req.args.get(ACCOUNT_ARG, ""),
                "amount_cents": req.args.get("amount_cents"),
                "currency": req.args.get("currency", ""),
            }
            return made, -1
    return None


def _refunded_since(state: RunState, payment_id: str, since: int) -> int:
    """Cents this run asked to refund of the payment that the listing at `state.completed[since]` cannot show:
    in flight, or answered (done, or maybe done) after it."""
    asked = [p for p in state.pending if p.tool == "refund_payment"]
    asked += [
        req
        for index, (req, done) in enumerate(state.completed)
        if index > since and req.tool == "refund_payment" and done.status in _LIVE
    ]
    return sum(int(r.args.get("amount_cents") or 0) for r in asked if r.args.get("payment_id") == payment_id)


def _refund_within_paid(
    state: RunState, rule: RefundWithinPaid, args: dict[str, Any], input_hash: str
) -> Verdict:
    name = rule_name(rule)
    payment_id = str(args.get("payment_id", ""))
    amount = args.get("amount_cents")
    seen = _payment(state, payment_id)
    if seen is None or not owns(state, seen[0]):  # (tenant, guest): another tenant's "alice" is not ours
        return Deny(name, f"payment {payment_id} is not one of this guest's payments found in this run")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return Deny(name, "a refund names a positive amount in cents")
    payment, since = seen
    paid = int(payment.get("amount_cents") or 0)
    refunded = int(payment.get("refunded_cents") or 0) + _refunded_since(state, payment_id, since)
    currency = str(payment.get("currency", ""))
    left = paid - refunded
    if amount > left:
        return Deny(
            name,
            f"{money(amount, currency)} is more than the {money(max(left, 0), currency)} left of payment "
            f"{payment_id} ({money(paid, currency)} paid, {money(refunded, currency)} refunded)",
        )
    # What the payment has been refunded in all counts, not this refund alone: split into refunds under the
    # limit (140.00, then 100.00), a refund above it would otherwise never reach a manager.
    if refunded + amount > rule.manager_above_cents and not approved(
        state, rule.tool, input_hash, Approver.MANAGER
    ):
        already = f" ({money(refunded, currency)} refunded already)" if refunded else ""
        return Hold(
            rule=name,
            reason=f"refunds of a payment above {money(rule.manager_above_cents, currency)} in all need a "
            f"manager's approval{already}",
            approver=Approver.MANAGER.value,
            ttl_s=rule.ttl_s,
            amount_cents=amount,
            currency=currency,
            question=f"Approve refunding {money(amount, currency)} of payment {payment_id} to {state.guest_id}?",
        )
    return Allow()
