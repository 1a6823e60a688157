"""What a guest is told when their run is handed to a person: one defined reply per hand-off reason. Pure."""

from __future__ import annotations

from datetime import datetime

from crashsafe.contracts.run_events import HandOffReason, RunHandedOff
from crashsafe.domain.run_state import RunState

_REPLIES: dict[str, str] = {
    HandOffReason.BUDGET_STEPS: (
        "This is taking more steps than it should, so a member of our support team will finish it for you."
    ),
    HandOffReason.BUDGET_TOKENS: (
        "This conversation has grown too long for me to finish, so a member of our support team will take over."
    ),
    HandOffReason.DEADLINE: (
        "This is taking longer than it should. A member of our support team will check where it stands and "
        "get back to you; you will not be charged twice."
    ),
    HandOffReason.OUTCOME_UNKNOWN: (
        "We could not confirm whether the last step went through. A member of our support team is checking "
        "with the provider; you will not be charged twice."
    ),
    HandOffReason.COMPENSATION_FAILED: (
        "Something went wrong and we could not undo part of it automatically. A member of our support team "
        "will put it right and contact you."
    ),
    HandOffReason.LOOP: (
        "I kept trying the same thing without getting anywhere, so a member of our support team will take "
        "over from here."
    ),
    HandOffReason.CATALOG_REVISION_GONE: (
        "Our rules changed while your request was open, so a member of our support team will finish it "
        "for you under the rules it started with."
    ),
    HandOffReason.MODEL_UNAVAILABLE: (
        "I can't reach our assistant right now, so a member of our support team will pick this up and get back "
        "to you; nothing was booked or charged twice."
    ),
    HandOffReason.POLICY_UNAVAILABLE: (
        "I can't look up StayHub's policies right now and I won't guess at them, so a member of our support team "
        "will answer your question."
    ),
    HandOffReason.AGENT_FAULT: (
        "Something went wrong on our side, so a member of our support team will take over from here; nothing "
        "was booked or charged twice."
    ),
}
_DEFAULT = "A member of our support team will take over from here and get back to you."


def handoff_reply(reason: str) -> str:
    """The guest's reply for a hand-off (a reason a newer writer added gets the general one)."""
    return _REPLIES.get(reason, _DEFAULT)


def handed_off(state: RunState, now: datetime, reason: HandOffReason, detail: str) -> RunHandedOff:
    """Every hand-off carries what the guest is told (`summarize` answers it as the run's reply)."""
    return RunHandedOff(
        run_id=state.run_id, at=now, reason=reason, detail=detail, reply=handoff_reply(reason)
    )
