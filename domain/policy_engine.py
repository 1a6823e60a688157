"""The policy engine: an agent's rules (data, from the pinned catalog, then its own rule types, code) checked against
an action before it is journaled as requested, purely from the run's journal. Pure.

Two checks, both before anything is journaled as requested: `check_asked` reads the call as the model wrote
it (which tool, which fields it dared to name), `check_policy` the action the agent prepared from it (the
server's amount, the dates, the run's live effects and payments). Compensations are never held back."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.policy import (
    ApprovalAbove,
    Approver,
    DateWindow,
    OneActiveHold,
    RefundWithinPaid,
    ToolsAllowed,
    VerifiedRecipient,
)
from crashsafe.contracts.run_events import Origin
from crashsafe.contracts.tools import Effect, ToolContract
from crashsafe.domain.agent import Agent, hook_misanswered, hook_raised
from crashsafe.domain.catalog_check import MAX_APPROVAL_TTL_S
from crashsafe.domain.guest_scope import owns
from crashsafe.domain.money_rules import approval_above, approved, payment_seen, refund_within_paid
from crashsafe.domain.policy_upgrade import upgraded
from crashsafe.domain.policy_verdicts import (
    Allow,
    Deny,
    Hold,
    PolicyRule,
    PreparedAction,
    Verdict,
    rule_name,
)
from crashsafe.domain.run_state import RunState
from crashsafe.domain.window_rules import date_window, one_active_hold, undone

# Rules that hold for every agent, whatever its catalog entry says: not configurable, so not in `Rule`.
SERVER_COMPUTED_AMOUNT = "server_computed_amount"
UNDONE_EFFECT = "undone_effect"
# Fields a model could use to name a price or where money or a message goes. A tool whose own parameters
# declare one of them (a support refund's amount) may take it; for every other tool, naming one is a denial.
AMOUNT_FIELDS = frozenset(
    {"amount", "amount_cents", "price", "price_cents", "total", "total_cents", "cost", "fee", "currency"}
)
RECIPIENT_FIELDS = frozenset({"to", "email", "recipient", "recipients", "cc", "bcc", "reply_to", "address"})


# The call as asked -------------------------------------------------------------------------------------------


def check_asked(
    state: RunState,
    config: AgentConfig,
    contract: ToolContract,
    asked: dict[str, Any],
    origin: Origin,
    agent: Agent | None = None,
) -> Deny | None:
    """What the rules say about a model's call as it wrote it, before its arguments are validated or prepared:
    a tool outside the agent's list, or a field only the server may fill (an amount, a recipient)."""
    if origin != Origin.MODEL:
        return None
    if config.tools and contract.name not in config.tools:
        return Deny(
            "tools_allowed", f"{contract.name} is not one of this agent's tools: {sorted(config.tools)}"
        )
    rules = upgraded(config.rules, agent.config.rules if agent is not None else ())
    for rule in rules:
        if isinstance(rule, ToolsAllowed) and contract.name not in rule.tools:
            return Deny(
                rule_name(rule), f"{contract.name} is not allowed here; allowed: {sorted(rule.tools)}"
            )
    declared = set(contract.parameters.get("properties", {}))
    named = sorted(k for k in asked if k.lower() in AMOUNT_FIELDS and k not in declared)
    if named:
        return Deny(
            SERVER_COMPUTED_AMOUNT,
            f"{', '.join(named)} may not be named for {contract.name}: the server computes the amount from "
            f"what is paid for; pass only the arguments {contract.name} declares: "
            f"{', '.join(sorted(declared)) or 'none'}",
        )
    for rule in rules:
        if isinstance(rule, RefundWithinPaid) and contract.name == rule.tool and rule.amount_field in asked:
            # An amount the model names for a payment of this guest the run has seen is bounded here, as asked
            # (a payment the run has not seen is the agent's `prepare` to refuse: find it first).
            seen = payment_seen(state, rule, str(asked.get(rule.payment_field, "")))
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
    agent: Agent | None = None,
    key: str = "",
) -> Verdict:
    """What the rules say about one prepared action: the built-in ones, the catalog's, then the agent's own
    (`agent.policies`; one that raises or answers no verdict is an `AgentFault`). Compensations are never held
    back. `key` is the business key the action would take (its attempt; "" for a step-keyed action): an
    approval covers only the attempt it was asked for (`money_rules.approved`).

    Denials win over holds; of several holds, a manager's is asked first (a manager's approval also passes
    the guest's rule, so a corporate guest is not asked twice)."""
    if origin == Origin.COMPENSATION:
        return Allow()
    contracts = {**agent.tools, **agent.compensation_tools} if agent is not None else {}
    built_in = _built_in(state, contracts | {contract.name: contract}, contract, args)
    if built_in is not None:
        return built_in
    holds: list[Hold] = []
    for rule in upgraded(config.rules, agent.config.rules if agent is not None else ()):
        verdict: Verdict = Allow()
        match rule:
            case DateWindow() if contract.name in rule.tools:
                verdict = date_window(rule, args, now)
            case ApprovalAbove() if contract.name == rule.tool:
                verdict = approval_above(state, rule, contract, args, input_hash, key)
            case VerifiedRecipient() if contract.name in rule.tools:
                verdict = _verified_recipient(state, rule, args)
            case OneActiveHold() if contract.name == rule.tool:
                verdict = one_active_hold(state, rule, args, contracts | {contract.name: contract})
            case RefundWithinPaid() if contract.name == rule.tool:
                verdict = refund_within_paid(state, rule, args, input_hash, key)
        if isinstance(verdict, Deny):
            return verdict
        if isinstance(verdict, Hold):
            holds.append(verdict)
    if agent is not None:
        action = PreparedAction(tool=contract, args=args, input_hash=input_hash, origin=origin, now=now)
        for policy in _policies(agent):
            verdict = _checked(agent, policy, action, state)
            if isinstance(verdict, Deny):
                return verdict
            # Approved is the engine's to know, not the rule's: exactly this action (its input hash), by the
            # hold's approver or a manager. A rule that holds again after its approval would ask for ever, and
            # one that read `state.approvals` itself could approve another action than the one asked about.
            if isinstance(verdict, Hold) and not approved(
                state, contract.name, input_hash, verdict.approver, key
            ):
                holds.append(verdict)
    if holds:
        return next((h for h in holds if h.approver == Approver.MANAGER), holds[0])
    return Allow()


def _policies(agent: Agent) -> tuple[PolicyRule, ...]:
    try:
        policies = agent.policies
    except Exception as exc:  # noqa: BLE001 -- an agent class written before the member: its fault, not a crash
        raise hook_raised(agent, "policies", exc) from exc
    if not isinstance(policies, tuple) or not all(isinstance(p, PolicyRule) for p in policies):
        raise hook_misanswered(agent, "policies", policies, "a tuple of PolicyRule")
    return policies


def _checked(agent: Agent, policy: PolicyRule, action: PreparedAction, state: RunState) -> Verdict:
    """One of the agent's own rules, run as foreign code: its verdict carries the rule's registered name."""
    hook = f"policy {policy.name[:100]}"
    try:
        verdict = policy.check(action, state)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise hook_raised(agent, hook, exc) from exc
    match verdict:
        case Allow():
            return verdict
        case Deny(reason=str(reason)):
            return Deny(policy.name, reason)
        case Hold(reason=str(), approver=str(), currency=str(), question=str()) if _well_formed(verdict):
            return Hold(
                rule=policy.name,
                reason=verdict.reason,
                approver=verdict.approver,
                ttl_s=float(verdict.ttl_s),
                amount_cents=verdict.amount_cents,
                currency=verdict.currency,
                question=verdict.question,
                total_cents=verdict.total_cents,
            )
    raise hook_misanswered(agent, hook, verdict, "Allow(), Deny(rule, reason) or Hold(...)")


def _cents(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _well_formed(hold: Hold) -> bool:
    """A hold the runtime can journal and expire: a ttl within an approval's longest wait, amounts in cents."""
    ttl = hold.ttl_s
    return (
        isinstance(ttl, (int, float))
        and not isinstance(ttl, bool)
        and math.isfinite(ttl)
        and 0 < ttl <= MAX_APPROVAL_TTL_S
        and _cents(hold.amount_cents)
        and _cents(hold.total_cents)
    )


def _built_in(
    state: RunState, contracts: Mapping[str, ToolContract], contract: ToolContract, args: dict[str, Any]
) -> Deny | None:
    """Money is never paid for an effect this run has undone or is undoing (a released hold: its compensation is
    done or on its way), whether or not the paying tool has a compensation of its own (the undone effect is
    another tool's); a charge (money, with a compensation) needs the provider's currency."""
    if contract.effect != Effect.MONEY:
        return None
    if contract.compensation is not None and "amount_cents" in args and not args.get("currency"):
        return Deny(
            SERVER_COMPUTED_AMOUNT,
            f"the provider gave no currency for {contract.name} ({_ids(args)}); it cannot be charged until "
            "it is priced in a known currency",
        )
    gone = undone(state, contracts)
    for field, value in args.items():
        by = gone.get((field, str(value)))
        if by is not None:
            return Deny(
                UNDONE_EFFECT,
                f"{field} {value} was undone in this run ({by}); make it again before paying for it",
            )
    return None


def _ids(args: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(args.items()) if k.endswith("_id")) or "no id"


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
