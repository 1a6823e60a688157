"""A run's journal as a person reads it: one line per event (`describe`, shared with the CLI's timeline) and, for
the console, the facts of each event (its key, intent, receipt and evidence trail). Pure: no I/O, no clock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    JournalEvent,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    Origin,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    ToolRejected,
    TurnReceived,
    UnknownEvent,
)
from crashsafe.contracts.tool_messages import Evidence, Via


def _short(value: Any, limit: int = 70) -> str:
    text = (
        value
        if isinstance(value, str)
        else ", ".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, dict)
        else str(value)
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(event: RunEvent) -> tuple[str, str, str]:
    """(step, what, detail) for one event."""
    match event:
        case RunStarted():
            return "", "started", f"guest {event.guest_id}: {_short(event.text)}"
        case ModelAnswered():
            if event.tool_calls:
                calls = "; ".join(f"{c.name}({_short(c.arguments, 50)})" for c in event.tool_calls)
                return str(event.step_no), "model", f"asks {calls}"
            return str(event.step_no), "model", f"replies: {_short(event.reply or '')}"
        case ActionRequested():
            return str(event.step_no), "intent", f"{event.tool} key={event.key} {_short(event.args, 60)}"
        case ToolRejected():
            return (
                str(event.step_no),
                "rejected",
                f"{event.tool}: {event.error.code}: {_short(event.error.message)}",
            )
        case ActionCompleted():
            how: str = {
                Via.CALL.value: "",
                Via.REPLAY.value: " (stored receipt)",
                Via.PROVIDER_LOOKUP.value: " (RECOVERED by provider lookup)",
            }.get(event.via, f" ({event.via})")
            ref = f" ref={event.provider_ref}" if event.provider_ref else ""
            extra = f" after {event.deliveries} deliveries" if event.deliveries > 1 else ""
            err = f" {event.error.code}" if event.error else ""
            return str(event.step_no), "receipt", f"{event.status}{err}{ref}{how}{extra}"
        case RunResumed():
            return str(event.next_step), "RESUMED", f"by {event.worker}: {event.reason}"
        case RunCompleted():
            return "", "completed", _short(event.reply, 90)
        case RunHandedOff():
            return "", "handed off", f"{event.reason}: {event.detail}"
    return "", type(event).__name__, ""


# The console's view ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One journal event as the run page shows it. Every string is plain text: the template escapes it."""

    seq: int
    at: datetime
    offset_s: float  # since the run's first event
    step: str
    kind: str  # a CSS class and a label: started, model, intent, receipt, recovered, compensation, ...
    label: str
    summary: str
    facts: list[tuple[str, str]] = field(default_factory=list)  # shown as monospace values
    blocks: list[tuple[str, str]] = field(default_factory=list)  # longer text or JSON, shown preformatted
    evidence: list[Evidence] = field(default_factory=list)
    trace_id: str = ""


def _json(value: Any) -> str:
    return json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _when(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


def _facts(*pairs: tuple[str, object]) -> list[tuple[str, str]]:
    """The pairs with a value (an empty string, None or an empty list says nothing and is left out)."""
    return [(k, str(v)) for k, v in pairs if v not in (None, "", [], {})]


def _view(
    event: JournalEvent,
) -> tuple[str, str, list[tuple[str, str]], list[tuple[str, str]], list[Evidence]]:
    """(kind, label, facts, blocks, evidence) of one event."""
    match event:
        case RunStarted():
            return (
                "started",
                "run started",
                _facts(
                    ("agent", event.agent),
                    ("tenant", event.tenant),
                    ("guest", event.guest_id),
                    ("session", event.session_id),
                    ("event id", event.event_id),
                    ("idempotency key", event.idempotency_key),
                    ("deadline", _when(event.deadline_at)),
                    ("catalog revision", event.catalog_revision or None),
                ),
                [("guest message", event.text)],
                [],
            )
        case ModelAnswered():
            calls = "\n".join(f"{c.name}({c.arguments})" for c in event.tool_calls)
            return (
                "model",
                "model answered",
                _facts(
                    ("model", event.model),
                    ("route", event.provider),
                    ("failed over", "; ".join(event.failovers)),
                    ("tokens", f"{event.input_tokens} in, {event.output_tokens} out"),
                    ("response", event.response_id),
                ),
                [b for b in [("tool calls", calls), ("reply", event.reply or "")] if b[1]],
                [],
            )
        case ActionRequested():
            compensation = event.origin == Origin.COMPENSATION.value
            return (
                "compensation" if compensation else "intent",
                "compensation intent" if compensation else "intent",
                _facts(
                    ("tool", event.tool),
                    ("key", event.key),
                    ("origin", event.origin),
                    ("input hash", event.input_hash),
                    ("timeout", f"{event.timeout_s:g} s"),
                ),
                [("args", _json(event.args))],
                [],
            )
        case ActionCompleted():
            recovered = event.via == Via.PROVIDER_LOOKUP.value
            return (
                "recovered" if recovered else "receipt",
                "recovered receipt" if recovered else "receipt",
                _facts(
                    ("key", event.key),
                    ("status", event.status),
                    ("provider ref", event.provider_ref),
                    ("via", event.via),
                    ("attempts", event.attempts),
                    ("deliveries", event.deliveries if event.deliveries > 1 else None),
                    ("error", f"{event.error.code}: {event.error.message}" if event.error else None),
                ),
                [("result", _json(event.result))] if event.result else [],
                list(event.evidence),
            )
        case ToolRejected():
            return (
                "rejected",
                "tool call rejected",
                _facts(("tool", event.tool), ("error", f"{event.error.code}: {event.error.message}")),
                [],
                [],
            )
        case PolicyDenied():
            return (
                "denied",
                "policy denied",
                _facts(("tool", event.tool), ("rule", event.rule), ("reason", event.reason)),
                [],
                [],
            )
        case ApprovalRequested():
            amount = (
                f"{event.amount_cents / 100:.2f} {event.currency}" if event.amount_cents is not None else None
            )
            return (
                "approval",
                "approval requested",
                _facts(
                    ("approval", event.approval_id),
                    ("tool", event.tool),
                    ("amount", amount),
                    ("approver", event.approver),
                    ("rule", event.rule),
                    ("reason", event.reason),
                    ("expires", _when(event.expires_at)),
                    ("input hash", event.input_hash),
                ),
                [b for b in [("question", event.question), ("args", _json(event.args))] if b[1]],
                [],
            )
        case ApprovalDecided():
            return (
                "decided",
                "approval decided",
                _facts(
                    ("approval", event.approval_id),
                    ("decision", event.decision),
                    ("decided by", event.decided_by),
                    ("reason", event.reason),
                ),
                [],
                [],
            )
        case ModelAsked():
            return (
                "asked",
                "model call failed" if event.failed else "model asked",
                _facts(("model", event.model), ("input bytes", event.input_bytes), ("failed", event.failed)),
                [],
                [],
            )
        case ModelRejected():
            return (
                "rejected",
                "model answer refused",
                _facts(
                    ("model", event.model),
                    ("error", f"{event.error.code}: {event.error.message}"),
                    ("answer bytes", event.answer_bytes),
                ),
                [],
                [],
            )
        case RunNudged():
            return (
                "nudged",
                "nudged",
                _facts(("by", event.by), ("reason", event.reason), ("keys", ", ".join(event.keys))),
                [],
                [],
            )
        case RunResumed():
            return (
                "resumed",
                "resumed",
                _facts(("worker", event.worker), ("next step", event.next_step), ("reason", event.reason)),
                [],
                [],
            )
        case TurnReceived():
            return (
                "turn",
                "guest turn",
                _facts(("event id", event.event_id)),
                [("guest message", event.text)],
                [],
            )
        case RunCompleted():
            return "completed", "completed", [], [("reply", event.reply)], []
        case RunHandedOff():
            return (
                "handed_off",
                "handed off",
                _facts(("reason", event.reason), ("detail", event.detail)),
                [("guest told", event.reply)] if event.reply else [],
                [],
            )
        case UnknownEvent():
            return (
                "unknown",
                event.type,
                [],
                [("as journaled (this version does not know it)", event.data.decode(errors="replace"))],
                [],
            )
    return "unknown", type(event).__name__, [], [], []


def _step(event: JournalEvent) -> str:
    if isinstance(event, UnknownEvent):
        return str(event.step_no) if event.step_no is not None else ""
    step, _, _ = describe(event)
    if not step and isinstance(event, ApprovalRequested | PolicyDenied | ModelAsked | ModelRejected):
        return str(event.step_no)
    return step


def entry(seq: int, event: JournalEvent, first_at: datetime, trace_id: str = "") -> Entry:
    """One event of a run whose first event was at `first_at`."""
    kind, label, facts, blocks, evidence = _view(event)
    summary = "" if isinstance(event, UnknownEvent) else describe(event)[2]
    return Entry(
        seq=seq,
        at=event.at,
        offset_s=(event.at - first_at).total_seconds(),
        step=_step(event),
        kind=kind,
        label=label,
        summary=summary,
        facts=facts,
        blocks=blocks,
        evidence=evidence,
        trace_id=trace_id,
    )


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`), or ""."""
    parts = (traceparent or "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and all(c in "0123456789abcdef" for c in parts[1]):
        return parts[1]
    return ""
