"""How a waiting run reads its guest's next message: a "yes" to the exact action it was asked about. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.run_events import ApprovalRequested
from services.runtime.core.state import RunState


@dataclass(frozen=True, slots=True)
class GuestAnswer:
    """The guest's message `turn_event_id` decides the approval: approved or rejected (`reason`: what they said)."""

    decision: str  # ApprovalStatus.APPROVED or REJECTED
    turn_event_id: str
    reason: str = ""


def guest_answer(state: RunState, waiting: ApprovalRequested) -> GuestAnswer | None:
    """None while no message of the session answers a guest approval."""
    return None
