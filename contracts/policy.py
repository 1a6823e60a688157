"""Policy rules as data: what an agent's actions must satisfy before the runtime journals them (the catalog holds them)."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeAlias

import msgspec


class Approver(StrEnum):
    """Who may approve an action a rule holds back (`ApprovalRequested.approver`; `str` on the wire: open)."""

    GUEST = "guest"  # a confirmation message in the same session
    MANAGER = "manager"  # `POST /v1/approvals/{id}` or `crashsafe approvals approve`


class RuleBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of the rule family (the union is `Rule`). `name` is what a denial names (`run.policy_denied.rule`)."""

    name: str = ""


class ToolsAllowed(RuleBase, frozen=True, kw_only=True, tag="rule.tools_allowed"):
    """Only these tools may be requested by the model in a run of this agent (the model only sees these)."""

    tools: list[str]


class StayWindow(RuleBase, frozen=True, kw_only=True, tag="rule.stay_window"):
    """A stay's check-in is not in the past and it lasts at most `max_nights`."""

    tools: list[str] = msgspec.field(default_factory=lambda: ["search_hotels", "create_booking"])
    max_nights: int = 30
    not_in_past: bool = True


class ApprovalAbove(RuleBase, frozen=True, kw_only=True, tag="rule.approval_above"):
    """An amount (computed by the server) above `limit_cents` waits for `approver`'s approval, at most `ttl_s`."""

    tool: str
    limit_cents: int
    approver: str = Approver.GUEST.value
    ttl_s: float = 24 * 3600.0
    # Only for guests whose profile says they book for a company (the traveller's manager approves).
    corporate_only: bool = False


class VerifiedRecipient(RuleBase, frozen=True, kw_only=True, tag="rule.verified_recipient"):
    """A message goes only to the guest's verified address from their profile, never to one the model names.

    For a model tool that sends a message. The booking agent's confirmation email is a projection (no model call
    to check): its `to` is built from the profile alone, so the agent's default rules no longer carry this one."""

    tools: list[str] = msgspec.field(default_factory=lambda: ["send_confirmation_email"])


class OneActiveHold(RuleBase, frozen=True, kw_only=True, tag="rule.one_active_hold"):
    """At most one active hold per guest and stay (dates); the same hold asked again is the same action."""

    tool: str = "create_booking"


class RefundWithinPaid(RuleBase, frozen=True, kw_only=True, tag="rule.refund_within_paid"):
    """A refund only of the guest's own payment, never above what was paid; above `manager_above_cents` only
    with a manager's approval."""

    tool: str = "refund_payment"
    manager_above_cents: int = 15_000
    ttl_s: float = 24 * 3600.0


Rule: TypeAlias = (
    ToolsAllowed | StayWindow | ApprovalAbove | VerifiedRecipient | OneActiveHold | RefundWithinPaid
)

rule_encoder = msgspec.json.Encoder()
rule_decoder = msgspec.json.Decoder(Rule)
