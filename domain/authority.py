"""What the runtime vouches for: the terms of each capability it signs, and which outcomes it accepts. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from crashsafe.contracts.capabilities import GRACE_S, CapabilityOrigin, OutcomeRefusal
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, JournalEvent, Origin
from crashsafe.contracts.subjects import WAKE_TOKEN
from crashsafe.contracts.tool_messages import ActionOutcome
from crashsafe.domain.run_state import RunState


@dataclass(frozen=True, slots=True)
class Terms:
    """The origin and expiry of one capability."""

    origin: CapabilityOrigin
    expires_at: datetime


def _origin_of(intent: ActionRequested) -> CapabilityOrigin:
    return CapabilityOrigin.COMPENSATION if intent.origin == Origin.COMPENSATION else CapabilityOrigin.PLAN


def terms_for(intent: ActionRequested, now: datetime) -> Terms:
    """A journaled request as the run's loop publishes it: its own origin until its deadline plus the grace. Past
    that (a runtime resuming a run long after the request was made), it is sent as a re-send is."""
    expires_at = intent.deadline_at + timedelta(seconds=GRACE_S)
    if now >= expires_at:
        return resend_terms(intent, now)
    return Terms(_origin_of(intent), expires_at)


def resend_terms(intent: ActionRequested, now: datetime) -> Terms:
    """A journaled request sent again to be resolved by key (a wake naming it): a fresh expiry, and the origin
    it was journaled with, never a broader one: a re-send must not turn a plan's request for a
    compensation-only tool into one the executor accepts."""
    return Terms(_origin_of(intent), now + timedelta(seconds=GRACE_S))


def to_resolve(state: RunState, keys: list[str]) -> tuple[ActionRequested, ...]:
    """The journaled requests a wake names that still need an answer: pending, or completed as unknown."""
    wanted = set(keys)
    pending = [p for p in state.pending if p.key in wanted]
    unknown = [r for r, _ in state.completed if r.key in wanted and state.unknown_step(r.step_no) is not None]
    return tuple(pending + unknown)


def requested(state: RunState, key: str, step_no: int | None = None) -> ActionRequested | None:
    """The journaled request with this key (at this step, if given), pending or completed. A business key may be
    journaled by two steps of one run (the same hold asked in two answers): each outcome binds to its own step."""
    for request in (*state.pending, *(r for r, _ in state.completed)):
        if request.key == key and (step_no is None or request.step_no == step_no):
            return request
    return None


def outcome_refusal(state: RunState, outcome: ActionOutcome, source: str) -> OutcomeRefusal | None:
    """None if the run asked for this outcome's key, for this tool and step, and it came on the subject of the
    family the request went to (`source`, the subject's family token); else why it must not be journaled."""
    if source == WAKE_TOKEN or outcome.run_id != state.run_id:
        return OutcomeRefusal.WRONG_SUBJECT
    request = requested(state, outcome.key, outcome.step_no)
    if request is None:
        # Not this key at this step: say which part is wrong, as before business keys could repeat.
        request = requested(state, outcome.key)
    if request is None:
        return OutcomeRefusal.UNREQUESTED
    if request.tool != outcome.tool:
        return OutcomeRefusal.WRONG_TOOL
    if request.step_no != outcome.step_no:
        return OutcomeRefusal.WRONG_STEP
    if request.family != source:
        return OutcomeRefusal.WRONG_FAMILY
    return None


def receipt_refusal(state: RunState, receipt: JournalEvent, family: str) -> OutcomeRefusal | None:
    """Why a receipt an executor of `family` appended to this run's journal does not answer any request the run
    journaled (None: it does; the fold takes it, or took it already from another path). What `read_event` did
    not take as that family's receipt is the wrong family's."""
    if not isinstance(receipt, ActionCompleted) or receipt.family != family:
        return OutcomeRefusal.WRONG_FAMILY
    outcome = ActionOutcome(
        run_id=receipt.run_id,
        step_no=receipt.step_no,
        tool=receipt.tool,
        key=receipt.key,
        status=receipt.status,
    )
    return outcome_refusal(state, outcome, family)
