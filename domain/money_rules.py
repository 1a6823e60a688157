"""The policy rules about money: approval above a limit, and refunds within what was paid. Pure.

Neither knows a domain: each reads the tools and fields its rule names (contracts/policy.py)."""

from __future__ import annotations

from typing import Any

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.keys import ACCOUNT_ARG
from crashsafe.contracts.policy import ApprovalAbove, Approver, RefundWithinPaid
from crashsafe.contracts.run_events import ApprovalRequested, Origin
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.guest_scope import owns
from crashsafe.domain.policy_verdicts import LIVE, Allow, Deny, Hold, Verdict, money, rule_name
from crashsafe.domain.run_state import RunState


def approved(state: RunState, tool: str, input_hash: str, approver: str, key: str = "") -> bool:
    """Whether exactly this action (tool and input hash), at this attempt (`key`, its business key), was
    approved by `approver` (or by a manager, who may approve what a guest may). A changed action has another
    hash, and a new attempt at the same action (after a refund, `:a2`) another key: each needs its own yes."""
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
            and _covers(state, request, key)
        ):
            return True
    return False


def _covers(state: RunState, request: ApprovalRequested, key: str) -> bool:
    """An approval covers the attempt it was asked for: the first request of its tool and hash after it, by that
    request's key. Asked again under the same business key, the executor answers with the same receipt; once
    refunded (or released) the next attempt takes another key (`:a2`), and a step-keyed action a new step key,
    so the old yes pays nothing again. Read from the journal alone: no key is recorded on the approval."""
    spent = next(
        (
            r.key
            for r in sorted((*state.pending, *(req for req, _ in state.completed)), key=lambda r: r.step_no)
            if r.tool == request.tool
            and r.input_hash == request.input_hash
            and r.step_no > request.step_no
            and r.origin != Origin.COMPENSATION
        ),
        None,
    )
    return spent is None or (bool(key) and spent == key)


def approval_above(
    state: RunState,
    rule: ApprovalAbove,
    contract: ToolContract,
    args: dict[str, Any],
    input_hash: str,
    key: str = "",
) -> Verdict:
    amount = args.get(rule.amount_field)
    if isinstance(amount, bool) or not isinstance(amount, int):
        # A float from a provider's quote, a string, or no amount: the limit cannot be judged in cents, and a
        # rule that cannot judge a charge never lets it through unasked.
        return Deny(
            rule_name(rule),
            f"{contract.name} names {rule.amount_field} {amount!r}, not a whole number of cents; the limit "
            f"{rule.limit_cents} cents cannot be checked: the provider's amount must be an integer in cents",
        )
    currency = str(args.get(rule.currency_field, ""))
    # What the run charges in all counts, not this charge alone: charges split under the limit (twelve nights,
    # then the next twelve) would otherwise never be confirmed by anyone.
    earlier = _charged(state, rule, contract.name, currency, args, input_hash)
    if amount + earlier <= rule.limit_cents:
        return Allow()
    profile = state.started.profile
    if rule.corporate_only and not (profile is not None and profile.corporate):
        return Allow()
    if approved(state, contract.name, input_hash, rule.approver, key):
        return Allow()
    what = money(amount, currency)
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
        total_cents=amount + earlier,
    )


def _charged(
    state: RunState, rule: ApprovalAbove, tool: str, currency: str, args: dict[str, Any], input_hash: str
) -> int:
    """Cents this run has charged with `tool` in `currency`, pending, done or maybe done, except what this charge
    pays again: the same `for_field` value, or (with no `for_field`) the very same action asked again."""
    asked = [p for p in state.pending if p.tool == tool]
    asked += [req for req, done in state.completed if req.tool == tool and done.status in LIVE]
    if rule.for_field:
        paid_for = str(args.get(rule.for_field, ""))
        asked = [r for r in asked if str(r.args.get(rule.for_field, "")) != paid_for]
    else:
        asked = [r for r in asked if r.input_hash != input_hash]
    return sum(
        int(r.args.get(rule.amount_field) or 0)
        for r in asked
        if str(r.args.get(rule.currency_field, "")) == currency
    )


def payment_seen(
    state: RunState, rule: RefundWithinPaid, payment_id: str
) -> tuple[dict[str, Any], int] | None:
    """A payment this run has seen, and the place in `state.completed` after which its refunds are not in it: as
    the latest `listing_tool` answer lists it (an older answer may miss refunds made since), or as the run made
    it with `charge_tool` (-1: none of the run's refunds are in it). A refund answered after the listing, or
    still in flight, is not in the listing whatever its step: the model may list again while one is on its way."""
    field = rule.payment_field
    found = [
        (index, done.result)
        for index, (req, done) in enumerate(state.completed)
        if rule.listing_tool and req.tool == rule.listing_tool and done.status == OutcomeStatus.SUCCEEDED
    ]
    if found:
        at, result = found[-1]
        payments = result.get(rule.listing_field, [])
        for payment in payments if isinstance(payments, list) else []:
            if isinstance(payment, dict) and payment.get(field) == payment_id:
                return payment, at
    for req, done in state.completed:
        if (
            rule.charge_tool
            and req.tool == rule.charge_tool
            and done.status == OutcomeStatus.SUCCEEDED
            and done.result.get(field) == payment_id
        ):
            made = {
                field: payment_id,
                "guest_id": req.args.get("guest_id"),
                ACCOUNT_ARG: req.args.get(ACCOUNT_ARG, ""),
                "amount_cents": req.args.get(rule.amount_field),
                "currency": req.args.get("currency", ""),
            }
            return made, -1
    return None


def _refunded_since(state: RunState, rule: RefundWithinPaid, payment_id: str, since: int) -> int:
    """Cents this run asked to refund of the payment that the listing at `state.completed[since]` cannot show:
    in flight, or answered (done, or maybe done) after it."""
    asked = [p for p in state.pending if p.tool == rule.tool]
    asked += [
        req
        for index, (req, done) in enumerate(state.completed)
        if index > since and req.tool == rule.tool and done.status in LIVE
    ]
    return sum(
        int(r.args.get(rule.amount_field) or 0) for r in asked if r.args.get(rule.payment_field) == payment_id
    )


def refund_within_paid(
    state: RunState, rule: RefundWithinPaid, args: dict[str, Any], input_hash: str, key: str = ""
) -> Verdict:
    name = rule_name(rule)
    payment_id = str(args.get(rule.payment_field, ""))
    amount = args.get(rule.amount_field)
    seen = payment_seen(state, rule, payment_id)
    if seen is None or not owns(state, seen[0]):  # (tenant, guest): another tenant's "alice" is not ours
        return Deny(name, f"payment {payment_id} is not one of this guest's payments found in this run")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return Deny(name, "a refund names a positive amount in cents")
    payment, since = seen
    paid = int(payment.get("amount_cents") or 0)
    refunded = int(payment.get("refunded_cents") or 0) + _refunded_since(state, rule, payment_id, since)
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
        state, rule.tool, input_hash, Approver.MANAGER, key
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
            total_cents=refunded + amount,
        )
    return Allow()
