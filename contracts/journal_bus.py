"""The journal as the bus (issue 33): an intent as its executor's request, a receipt as only its family writes it."""

from __future__ import annotations

from datetime import datetime

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    UnknownEvent,
    decode_event,
)
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest


def request_for(intent: ActionRequested) -> ActionRequest:
    """The executor's request for a journaled intent: the same key, input and deadline, however often it is sent."""
    return ActionRequest(
        run_id=intent.run_id,
        step_no=intent.step_no,
        tool=intent.tool,
        family=intent.family,
        args=intent.args,
        key=intent.key,
        input_hash=intent.input_hash,
        timeout_s=intent.timeout_s,
        deadline_at=intent.deadline_at,
        requested_at=intent.at,
    )


def read_event(data: bytes, receipt_of: str | None = None) -> JournalEvent:
    """One journal event as read from its subject. `receipt_of`: the family a receipt's subject names
    (`Namespace.receipt_writer`; None for every other subject). A receipt stands only as an `ActionCompleted`
    that says that family wrote it: anything else there (another family's claim, another event, a foreign run's)
    comes back as an `UnknownEvent` the fold skips, so a family can only ever speak for its own requests."""
    event = decode_event(data)
    if receipt_of is None or (isinstance(event, ActionCompleted) and event.family == receipt_of):
        return event
    return UnknownEvent(type=f"refused:{receipt_of}", run_id=event.run_id, at=event.at, data=data)


def receipt_of(outcome: ActionOutcome, at: datetime, *, tool: str, family: str = "") -> ActionCompleted:
    """An executor's outcome as its run journals it: by the runtime, which checked it first (`family` ""), or
    appended by the executor itself, saying which family wrote it (the fold checks it against the intent)."""
    return ActionCompleted(
        run_id=outcome.run_id,
        at=at,
        step_no=outcome.step_no,
        tool=tool,
        key=outcome.key,
        status=outcome.status,
        result=outcome.result,
        error=outcome.error,
        provider_ref=outcome.provider_ref,
        via=outcome.via,
        attempts=outcome.attempts,
        deliveries=outcome.deliveries,
        evidence=outcome.evidence,
        existing=outcome.existing,
        family=family,
    )
