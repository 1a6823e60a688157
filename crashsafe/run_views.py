"""A run's state, events and moves in words for a person: what replay prints and what a divergence names."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    JournalEvent,
    ModelAsked,
    ModelRejected,
    PolicyDenied,
    RunNudged,
    TurnReceived,
    UnknownEvent,
)
from crashsafe.domain.decide import Append, AskModel, AwaitActions, AwaitApproval, DecideApproval, Idle, Move
from crashsafe.domain.fold import summarize
from crashsafe.domain.run_state import RunState
from crashsafe.export_file import event_type
from crashsafe.timeline import describe


def state_view(state: RunState) -> dict[str, Any]:
    """The state's fields a person debugs with, as plain JSON values (the diff compares these)."""
    summary = msgspec.to_builtins(summarize(state))
    return {
        **summary,
        "next_step": state.next_step,
        "events": state.events,
        "resumes": state.resumes,
        "model_steps": state.model_steps,
        "action_steps": state.action_steps,
        "unplanned": [f"{c.name}({c.arguments})" for c in state.unplanned],
        "completed": [f"{req.tool} {req.key}: {done.status}" for req, done in state.completed],
        "awaiting": state.awaiting.approval_id if state.awaiting else None,
        "approvals": [f"{a.approval_id}: {a.decision} by {a.decided_by}" for a in state.approvals],
        "inbox": [t.event_id for t in state.inbox],
        "turns": state.turns,
        "denials": state.denials,
        "tool_errors": state.tool_errors,
        "lost_asks": state.lost_asks,
        "unknown_events": list(state.unknown_events),
        "final_reply": state.final_reply,
    }


def diff_views(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What changed, field by field: `field: old -> new`, list fields as `+ item` / `- item`."""
    out: list[str] = []
    for name, new in after.items():
        old = before.get(name) if before is not None else None
        if old == new:
            continue
        if isinstance(new, list) and isinstance(old, list | None):
            old_items = old or []
            out += [f"{name}: - {item}" for item in old_items if item not in new]
            out += [f"{name}: + {item}" for item in new if item not in old_items]
        else:
            out.append(f"{name}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def summary_of(event: JournalEvent) -> str:
    """One line for one event."""
    match event:
        case UnknownEvent():
            return f"not understood by this version (kept, skipped by the fold): {event.type}"
        case PolicyDenied():
            return f"denied {event.tool} by {event.rule}: {event.reason}"
        case ApprovalRequested():
            return f"approval {event.approval_id} of {event.tool} asked of {event.approver} ({event.rule})"
        case ApprovalDecided():
            return f"approval {event.approval_id} {event.decision} by {event.decided_by}"
        case TurnReceived():
            return f"guest turn {event.event_id}"
        case ModelAsked():
            return f"model asked for step {event.step_no}" + (
                f", failed: {event.failed}" if event.failed else ""
            )
        case ModelRejected():
            return f"model answer refused: {event.error.code}"
        case RunNudged():
            return "nudged"
    _, what, detail = describe(event)
    return f"{what}: {detail}" if detail else what


def move_summary(move: Move) -> str:
    """What the runtime would do, in one line (the corpus test names both sides of a divergence with these)."""
    match move:
        case AskModel(step_no=step_no):
            return f"ask the model for step {step_no}"
        case Append(events=events):
            return "journal " + "; ".join(decision_of(e) for e in events)
        case AwaitActions(pending=pending):
            return "wait for " + ", ".join(f"{p.tool} {p.key}" for p in pending)
        case AwaitApproval(approval=approval):
            return f"wait for approval {approval.approval_id}"
        case DecideApproval(approval=approval, decision=decision, decided_by=by):
            return f"decide approval {approval.approval_id}: {decision} by {by}"
        case Idle():
            return "nothing (idle)"
    return repr(move)


def decision_of(event: JournalEvent) -> str:
    """An event as a decision, whole: its type, and for an action its tool, key and every argument (a summary
    cuts long arguments; a divergence must show the one that differs)."""
    if isinstance(event, ActionRequested):
        args = json.dumps(event.args, sort_keys=True, default=str)
        return f"{event_type(event)} {event.tool} key={event.key} args={args} origin={event.origin}"
    return f"{event_type(event)} {summary_of(event)}"
