"""What the policy engine's rules answer (allow, deny, hold) and share: rule names, amounts as shown, live outcomes. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from crashsafe.contracts.policy import Rule
from crashsafe.contracts.tool_messages import OutcomeStatus


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


# What a held (not yet released) booking or a charge may be in: succeeded, or not known to have failed.
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
