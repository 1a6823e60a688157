"""A catalog rule written before its parameters existed reads them from the agent's built-in rule of its kind. Pure.

The built-in rules once read fixed field and tool names; they now name them as parameters. A catalog published
before that (every stored revision, every recorded run's pinned configuration) holds the rule without them: its
empty parameters are taken from the agent's own configuration's rule of the same kind (and tool), so it keeps the
meaning it was published with. A rule with nothing to take them from checks what it names (empty: nothing), and
`crashsafe config validate` refuses publishing one that names no fields."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from crashsafe.contracts.policy import ApprovalAbove, DateWindow, OneActiveHold, RefundWithinPaid, Rule


def upgraded(rules: Sequence[Rule], built_in: Sequence[Rule]) -> list[Rule]:
    """`rules` with each empty parameter filled from `built_in` (the agent's own configuration's rules)."""
    return [_upgraded(rule, built_in) for rule in rules]


def _upgraded(rule: Rule, built_in: Sequence[Rule]) -> Rule:
    replace = msgspec.structs.replace
    match rule:
        case DateWindow() if not (rule.tools and rule.start_field):
            window = next(
                (b for b in built_in if isinstance(b, DateWindow) and b.tools and b.start_field), None
            )
            if window is None:
                return rule
            if rule.start_field:
                return replace(rule, tools=window.tools)
            return replace(
                rule,
                tools=rule.tools or window.tools,
                start_field=window.start_field,
                end_field=window.end_field,
                start_label=window.start_label,
            )
        case OneActiveHold() if not (rule.tool and rule.start_field):
            hold = next(
                (
                    b
                    for b in built_in
                    if isinstance(b, OneActiveHold)
                    and b.start_field
                    and (not rule.tool or b.tool == rule.tool)
                ),
                None,
            )
            if hold is None:
                return rule
            if rule.start_field:
                return replace(rule, tool=hold.tool)
            return replace(hold, name=rule.name, tool=rule.tool or hold.tool)
        case ApprovalAbove() if not rule.for_field:
            above = next(
                (b for b in built_in if isinstance(b, ApprovalAbove) and b.tool == rule.tool and b.for_field),
                None,
            )
            return rule if above is None else replace(rule, for_field=above.for_field)
        case RefundWithinPaid() if not (rule.tool and rule.payment_field):
            refund = next(
                (
                    b
                    for b in built_in
                    if isinstance(b, RefundWithinPaid)
                    and b.payment_field
                    and (not rule.tool or b.tool == rule.tool)
                ),
                None,
            )
            if refund is None:
                return rule
            if rule.payment_field:
                return replace(rule, tool=refund.tool)
            return replace(
                rule,
                tool=rule.tool or refund.tool,
                payment_field=refund.payment_field,
                listing_tool=refund.listing_tool,
                listing_field=refund.listing_field,
                charge_tool=refund.charge_tool,
            )
    return rule
