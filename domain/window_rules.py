"""The policy rules about dates and live effects: a date window, one live effect per holder and dates, and what
this run has undone (an effect whose compensation is done or on its way). Pure; they read only the tools and
fields their rules name, and the tool contracts' `compensation`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from crashsafe.contracts.keys import ACCOUNT_ARG, undone_by
from crashsafe.contracts.policy import DateWindow, OneActiveHold
from crashsafe.contracts.run_events import ActionRequested
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.policy_verdicts import LIVE, Allow, Deny, Verdict, rule_name
from crashsafe.domain.run_state import RunState


def undone(state: RunState, contracts: Mapping[str, ToolContract]) -> dict[tuple[str, str], str]:
    """What this run has undone or is undoing, as the (field, value) pairs that name it: each field an undoing
    action names whose value the effect's provider made (in its answer, not in what was asked), like the id of a
    hold its release names. An undoing action is one of the effect's `compensation` tool keyed from the effect's
    key, pending or (maybe) done. Maps each pair to the compensation's tool."""
    undoing: list[ActionRequested] = [*state.pending]
    undoing += [req for req, done in state.completed if done.status in LIVE]
    named: dict[tuple[str, str], str] = {}
    for req, done in state.completed:
        contract = contracts.get(req.tool)
        if contract is None or contract.compensation is None or done.status not in LIVE:
            continue
        for undo in undoing:
            if undo.tool != contract.compensation or undone_by(undo.key) != req.key:
                continue
            for field, value in undo.args.items():
                made = done.result.get(field)
                if field != ACCOUNT_ARG and made is not None and made == value and field not in req.args:
                    named[(field, str(value))] = undo.tool
    return named


def date_of(args: dict[str, Any], field: str) -> date | None:
    try:
        return date.fromisoformat(str(args[field]))
    except (KeyError, ValueError):
        return None


def _span(args: dict[str, Any], start_field: str, end_field: str) -> tuple[date, date] | None:
    start, end = date_of(args, start_field), date_of(args, end_field)
    return None if start is None or end is None else (start, end)


def date_window(rule: DateWindow, args: dict[str, Any], now: datetime) -> Verdict:
    start = date_of(args, rule.start_field) if rule.start_field else None
    if start is None:
        return Allow()  # nothing dated in this action (the agent's argument rules refuse bad dates)
    today = now.date()
    label = rule.start_label or rule.start_field
    if rule.not_in_past and start < today:
        return Deny(
            rule_name(rule), f"{label} {start.isoformat()} is in the past (today is {today.isoformat()})"
        )
    ahead = (start - today).days
    if rule.max_days_ahead is not None and ahead > rule.max_days_ahead:
        return Deny(
            rule_name(rule),
            f"{label} {start.isoformat()} is {ahead} days ahead, more than the {rule.max_days_ahead} days "
            f"allowed (today is {today.isoformat()})",
        )
    end = date_of(args, rule.end_field) if rule.end_field else None
    if end is None:
        return Allow()
    days = (end - start).days
    if days > rule.max_nights:
        return Deny(
            rule_name(rule),
            f"{days} nights from {start.isoformat()} to {end.isoformat()} is more than the {rule.max_nights} "
            "allowed; ask for shorter dates",
        )
    return Allow()


def _overlap(a: tuple[date, date], b: tuple[date, date]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def one_active_hold(
    state: RunState, rule: OneActiveHold, args: dict[str, Any], contracts: Mapping[str, ToolContract]
) -> Verdict:
    if not rule.start_field:
        return Allow()
    span = _span(args, rule.start_field, rule.end_field or rule.start_field)
    if span is None:
        return Allow()
    gone = undone(state, contracts)
    holds: list[tuple[dict[str, Any], str]] = [(p.args, "") for p in state.pending if p.tool == rule.tool]
    for req, done in state.completed:
        if req.tool == rule.tool and done.status in LIVE:
            made = str(done.result.get(rule.result_field, "")) if rule.result_field else ""
            if not (made and (rule.result_field, made) in gone):
                holds.append((req.args, made))
    for held, made in holds:
        other = _span(held, rule.start_field, rule.end_field or rule.start_field)
        if (
            other is None
            or any(held.get(f) != args.get(f) for f in rule.holder_fields)
            or not _overlap(span, other)
            and span != other
        ):
            continue
        if all(held.get(f) == args.get(f) for f in rule.same_fields) and other == span:
            continue  # the same one asked again: the same action, answered from its receipt
        what = ", ".join(str(held.get(f, "")) for f in rule.same_fields)
        return Deny(
            rule_name(rule),
            f"this run already holds {what} from {other[0].isoformat()} to "
            f"{other[1].isoformat()}{f' ({rule.result_field} {made})' if made else ''}; complete or let go "
            "of that hold before holding another for overlapping dates",
        )
    return Allow()
