"""Policy rules as data: what an agent's actions must satisfy before the runtime journals them (the catalog holds them).

The built-in rules speak no domain: each names the tools and the argument fields it reads. A parameter left empty
(a catalog written before the parameter existed) takes the agent's built-in rule's value: see
domain/policy_upgrade.py. An agent's own rule types are code, not catalog data (`domain.policy_verdicts.PolicyRule`)."""

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


class DateWindow(RuleBase, frozen=True, kw_only=True, tag="rule.stay_window"):
    """The date an action starts on (`start_field`, ISO) is not in the past and at most `max_days_ahead` days from
    today; with an `end_field`, the span lasts at most `max_nights` days. "At most 5 days ahead" is
    `DateWindow(tools=[...], start_field="day", max_days_ahead=5)`. (Its tag is the one it had as a stay's window;
    empty `tools` / `start_field` take the agent's built-in window's.)"""

    tools: list[str] = []
    max_nights: int = 30
    not_in_past: bool = True
    start_field: str = ""
    end_field: str = ""
    max_days_ahead: int | None = None
    start_label: str = ""  # how a denial names the start date; empty: the field's name


StayWindow = DateWindow  # the name it had before it was parameterised


class ApprovalAbove(RuleBase, frozen=True, kw_only=True, tag="rule.approval_above"):
    """An amount (computed by the server, `amount_field` in cents, `currency_field`) above `limit_cents` waits for
    `approver`'s approval, at most `ttl_s`. What the run charged with `tool` in all counts (charges split under
    the limit are confirmed too), except earlier charges for the same `for_field` value (the same thing paid
    again is not a second charge; empty: the agent's built-in rule's for this tool, else only the very same
    action asked again is not counted twice)."""

    tool: str
    limit_cents: int
    approver: str = Approver.GUEST.value
    ttl_s: float = 24 * 3600.0
    # Only for guests whose profile says they act for a company (the company's manager approves).
    corporate_only: bool = False
    amount_field: str = "amount_cents"
    currency_field: str = "currency"
    for_field: str = ""


class VerifiedRecipient(RuleBase, frozen=True, kw_only=True, tag="rule.verified_recipient"):
    """A message goes only to the guest's verified address from their profile, never to one the model names.

    For a model tool that sends a message (a projection builds its recipient from the profile alone)."""

    tools: list[str] = msgspec.field(default_factory=lambda: ["send_confirmation_email"])


class OneActiveHold(RuleBase, frozen=True, kw_only=True, tag="rule.one_active_hold"):
    """At most one live `tool` effect per holder (`holder_fields`) for overlapping dates (`start_field` to
    `end_field`); the same one asked again (equal `same_fields` and dates) is the same action. An effect this run
    has undone, or is undoing, holds nothing. `result_field` names the provider's id of it in a denial. Empty
    `tool` / `start_field`: the agent's built-in rule's parameters."""

    tool: str = ""
    holder_fields: list[str] = []
    same_fields: list[str] = []
    start_field: str = ""
    end_field: str = ""
    result_field: str = ""


class RefundWithinPaid(RuleBase, frozen=True, kw_only=True, tag="rule.refund_within_paid"):
    """A refund (`tool`) only of the guest's own payment, never above what was paid; above `manager_above_cents`
    only with a manager's approval. The payment is the one `payment_field` names, as the latest `listing_tool`
    answer lists it (under `listing_field`), or as this run's `charge_tool` made it. Empty `tool` /
    `payment_field`: the agent's built-in rule's parameters."""

    tool: str = ""
    manager_above_cents: int = 15_000
    ttl_s: float = 24 * 3600.0
    payment_field: str = ""
    amount_field: str = "amount_cents"
    listing_tool: str = ""
    listing_field: str = ""
    charge_tool: str = ""


Rule: TypeAlias = (
    ToolsAllowed | DateWindow | ApprovalAbove | VerifiedRecipient | OneActiveHold | RefundWithinPaid
)

rule_encoder = msgspec.json.Encoder()
rule_decoder = msgspec.json.Decoder(Rule)
