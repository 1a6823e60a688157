"""What the policy engine's rules answer (allow, deny, hold) and share: rule names, amounts as shown, live outcomes,
and the shape of an agent's own rule (`PolicyRule` over a `PreparedAction`). Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crashsafe.contracts.policy import Approver, Rule
from crashsafe.contracts.run_events import Origin
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import ToolContract
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
    question: str = ""  # the rule's own wording; the agent's `approval_question` has the last word
    total_cents: int | None = None  # what the run pays in all with this action, where the rule counts it


Verdict = Allow | Deny | Hold


@dataclass(frozen=True, slots=True)
class PreparedAction:
    """What an agent's own rule sees: one action as the agent prepared it, before anything is journaled."""

    tool: ToolContract
    args: dict[str, Any]  # the prepared arguments (what an approval is bound to, by `input_hash`)
    input_hash: str
    origin: Origin
    now: datetime


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """An agent's own rule type: a name (what a denial or a hold names) and a pure function over the prepared
    action and the folded run. It runs after the built-in rules; raising, or answering anything but a verdict,
    is the agent's fault (the run hands off with the reason). Compensations are never held back."""

    name: str
    check: Callable[[PreparedAction, RunState], Verdict]


# What a held (not yet undone) effect or a charge may be in: succeeded, or not known to have failed.
LIVE = (OutcomeStatus.SUCCEEDED, OutcomeStatus.UNKNOWN)


def rule_name(rule: Rule) -> str:
    """What a denial names: the rule's own `name`, else its kind (`stay_window`)."""
    tag = type(rule).__struct_config__.tag
    return rule.name or str(tag).removeprefix("rule.")


def money(cents: int, currency: str) -> str:
    """1,840.00 EUR: how an amount is shown to the person asked to approve it."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100:,}.{cents % 100:02d} {currency}".strip()


def default_question(state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
    """The approval question of an agent that words none of its own: the rule's, else one naming the tool and
    the amount."""
    if hold.question:
        return hold.question
    what = tool.name
    if hold.amount_cents is not None:
        what += f" for {money(hold.amount_cents, hold.currency)}"
    if hold.approver == Approver.MANAGER:
        return f"Approve {what} for {state.guest_id}? ({hold.reason})"
    return f"Reply yes to approve {what} ({hold.reason})"
