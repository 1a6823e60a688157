"""Approvals, purely: the record a held-back action gets, how it moves (once, from pending), what the run journals
from it, and how a waiting run reads its guest's next message (a "yes" to the exact action it was asked about)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import msgspec

from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import ApprovalDecided, ApprovalRequested
from crashsafe.domain.run_state import RunState

# A guest's message that approves: a clear yes and nothing else ("yes, but for 3 nights" is not one: it is a
# change of the action, so it goes to the model, which asks again with the new action).
_YES = re.compile(
    r"^\s*(yes|yes please|yes,? please|yep|yeah|sure|ok|okay|confirm|confirmed|i confirm|go ahead|do it|"
    r"book it|ok,? book it|okay,? book it|yes,? book it|please book it|approve|approved)\s*[.!]*\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class GuestAnswer:
    """The guest's message `turn_event_id` decides the approval: approved or rejected (`reason`: what they said)."""

    decision: str  # ApprovalStatus.APPROVED or REJECTED
    turn_event_id: str
    reason: str = ""


def is_clear_yes(text: str) -> bool:
    return bool(_YES.match(text))


def guest_answer(state: RunState, waiting: ApprovalRequested) -> GuestAnswer | None:
    """None while no message of the session answers a guest approval (or the approval is a manager's: a guest's
    "yes" never approves what their manager must).

    The first message after the question decides: a clear yes approves and is used up (`turn_event_id` names it,
    the fold takes it out of the inbox); anything else rejects, with the guest's words as the reason, and stays in
    the inbox (`turn_event_id=""`) so the model reads it next."""
    if waiting.approver != Approver.GUEST or not state.inbox:
        return None
    turn = state.inbox[0]
    if is_clear_yes(turn.text):
        return GuestAnswer(ApprovalStatus.APPROVED.value, turn.event_id)
    return GuestAnswer(ApprovalStatus.REJECTED.value, "", turn.text[:1000])


def new_record(state: RunState, waiting: ApprovalRequested) -> ApprovalRecord:
    """The record the runtime creates (once: create-if-absent) for an approval the run journaled."""
    return ApprovalRecord(
        approval_id=waiting.approval_id,
        run_id=state.run_id,
        tenant=state.started.tenant,
        guest_id=state.guest_id,
        session_id=state.session_id,
        tool=waiting.tool,
        args=waiting.args,
        input_hash=waiting.input_hash,
        amount_cents=waiting.amount_cents,
        currency=waiting.currency,
        approver=waiting.approver,
        rule=waiting.rule,
        reason=waiting.reason,
        requested_at=waiting.at,
        expires_at=waiting.expires_at,
    )


def current_status(record: ApprovalRecord, now: datetime) -> str:
    """What the record means now: a pending record past its expiry is expired, whoever looks first."""
    if record.status == ApprovalStatus.PENDING and now >= record.expires_at:
        return ApprovalStatus.EXPIRED.value
    return record.status


def decide(
    record: ApprovalRecord, decision: str, decided_by: str, reason: str, now: datetime
) -> ApprovalRecord | None:
    """The record after `decision` (approved, rejected or expired), or None if it may not move: only a pending
    record moves, once, and a pending one past its expiry only to expired."""
    if record.status != ApprovalStatus.PENDING:
        return None
    if decision != ApprovalStatus.EXPIRED and now >= record.expires_at:
        return None
    return msgspec.structs.replace(
        record, status=decision, decided_by=decided_by, decided_at=now, decision_reason=reason[:1000]
    )


def expired(record: ApprovalRecord, now: datetime) -> ApprovalRecord | None:
    """The record moved to expired, if it is pending past its expiry."""
    if current_status(record, now) != ApprovalStatus.EXPIRED or record.status != ApprovalStatus.PENDING:
        return None
    return decide(record, ApprovalStatus.EXPIRED.value, "timer", "", now)


def decided_event(
    record: ApprovalRecord, waiting: ApprovalRequested, now: datetime, turn_event_id: str = ""
) -> ApprovalDecided | None:
    """What the run journals from a decided record (None while it is pending). The record is the authority: a
    guest's "yes" that lost to a manager's "no" is journaled as the manager's no, and its turn stays unread."""
    if record.status == ApprovalStatus.PENDING:
        return None
    ours = turn_event_id if record.status == ApprovalStatus.APPROVED else ""
    return ApprovalDecided(
        run_id=waiting.run_id,
        at=now,
        approval_id=record.approval_id,
        decision=record.status,
        decided_by=record.decided_by,
        reason=record.decision_reason,
        input_hash=record.input_hash,
        turn_event_id=ours if record.decided_by.startswith("guest:") else "",
    )


def journaled_decision(state: RunState, approval_id: str) -> ApprovalDecided | None:
    return next((d for d in state.approvals if d.approval_id == approval_id), None)
