"""The intake, pure: what a run's journal receives from outside the model and the agent (an inbound message that
starts a run or is its next turn, an action's outcome, a wake or a fired timer, a worker picking the run up, a
pinned catalog revision gone), given the folded run and what the shell read (the time, ids, the revision).

Every event the runtime journals is built here or in `decide`; the shell only reads, appends and publishes."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from crashsafe.contracts.capabilities import OutcomeRefusal
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import OutcomeRefused, PoisonMessage
from crashsafe.contracts.inbound import InboundEvent
from crashsafe.contracts.journal_bus import receipt_of
from crashsafe.contracts.keys import GuestScope, KeyScheme
from crashsafe.contracts.memory import GuestProfile, SessionTurn
from crashsafe.contracts.run_events import (
    MAX_EVENT_BYTES,
    ActionCompleted,
    HandOffReason,
    ModelAnswered,
    ModelRejected,
    Passage,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    TurnReceived,
    event_encoder,
)
from crashsafe.contracts.subjects import WAKE_TOKEN
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus, RunWake
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.model_calls import ModelReply, model_answered, model_rejected
from crashsafe.domain.run_state import RunState

RESUMED = "worker picked up a run it did not hold in memory"


def addressed(event: InboundEvent, default_agent: str) -> InboundEvent:
    """The event with the agent it is for: one that names none goes to the deployment's default agent."""
    return event if event.agent else msgspec.structs.replace(event, agent=default_agent)


def run_started(
    event: InboundEvent,
    now: datetime,
    *,
    revision: int,
    config: AgentConfig,
    profile: GuestProfile | None,
    history: list[SessionTurn],
) -> RunStarted:
    """The first event of the run an inbound message starts, pinned to the catalog `revision` (whose `config`
    sets its budget), with the guest's profile and earlier turns in the session as the shell read them."""
    budget = config.budget
    message = event.message
    return RunStarted(
        run_id=event.run_id,
        at=now,
        agent=event.agent,
        session_id=message.session_id,
        guest_id=message.guest_id,
        event_id=message.event_id,
        idempotency_key=event.key,
        input_hash=event.input_hash,
        text=message.text,
        budget=budget,
        deadline_at=now + timedelta(seconds=budget.deadline_s),
        tenant=event.tenant,
        catalog_revision=revision,
        profile=profile,
        history=history,
        key_scheme=KeyScheme.BUSINESS,
        guest_scope=GuestScope.TENANT,  # the guest is (tenant, guest) at every provider
        started_by=event.sent_by,
    )


def turn(state: RunState, event: InboundEvent, now: datetime) -> tuple[TurnReceived, ...]:
    """The message as the run's next turn; nothing if it is one already (it came again after a crash)."""
    message = event.message
    if message.event_id in state.turn_ids:
        return ()
    return (TurnReceived(run_id=state.run_id, at=now, event_id=message.event_id, text=message.text),)


def on_its_subject(message: ActionOutcome | RunWake, source: str, subject_run: str) -> None:
    """Refuse a message for one run on another's subject, an outcome posing as a wake-up, or the reverse
    (`source`: the family token of the subject it came on, `subject_run`: the run it names)."""
    is_outcome = isinstance(message, ActionOutcome)
    if subject_run != message.run_id or is_outcome == (source == WAKE_TOKEN):
        key, tool = (message.key, message.tool) if isinstance(message, ActionOutcome) else ("", "")
        raise OutcomeRefused(
            reason=OutcomeRefusal.WRONG_SUBJECT, key=key, tool=tool, run_id=message.run_id, source=source
        )


def outcome_recorded(state: RunState, outcome: ActionOutcome) -> bool:
    """Whether the run has nothing (more) to record of the outcome: its step is not pending, and it does not
    settle an unknown one (a redelivery of what is journaled already)."""
    settles_unknown = (
        state.unknown_step(outcome.step_no) is not None and outcome.status != OutcomeStatus.UNKNOWN
    )
    return state.pending_step(outcome.step_no) is None and not settles_unknown


def completed(state: RunState, outcome: ActionOutcome, now: datetime) -> tuple[ActionCompleted, ...]:
    """The executor's receipt as the run journals it; nothing if it is journaled already. The outcome was
    checked against the run's requests first (`authority.outcome_refusal`)."""
    if outcome_recorded(state, outcome):
        return ()
    # The step's own request names the tool (an unknown one too, settled late); the outcome's was checked against it.
    request = state.pending_step(outcome.step_no) or state.unknown_step(outcome.step_no)
    return (receipt_of(outcome, now, tool=request.tool if request is not None else outcome.tool),)


def heeds(state: RunState, wake: RunWake) -> bool:
    """Whether the run takes the wake: an active run always; an ended run only about its unknown outcomes and
    what it left pending at hand-off."""
    if not state.terminal:
        return True
    return any(state.unknown_step(r.step_no) for r, _ in state.completed if r.key in wake.keys) or any(
        p.key in wake.keys for p in state.pending
    )


def nudged(state: RunState, wake: RunWake, now: datetime) -> tuple[RunNudged, ...]:
    """The wake as the run journals it (nothing if the run does not heed it)."""
    if not heeds(state, wake):
        return ()
    return (RunNudged(run_id=wake.run_id, at=now, by=wake.by, reason=wake.reason, keys=wake.keys),)


def fired(message: ActionOutcome | RunWake, subject: str, run_id: str | None) -> RunWake:
    """A fired durable timer (an approval's expiry) is a wake of the run its subject names, or poison."""
    if not isinstance(message, RunWake) or run_id is None or message.run_id != run_id:
        raise PoisonMessage(f"a timer on {subject} that is not a wake of its run", run_id=run_id or "")
    return message


def resumed(state: RunState, now: datetime, worker: str) -> tuple[RunResumed, ...]:
    """A worker picked up an active run it did not hold in memory: the journal says so (the model's next ask is
    then journaled before the call, `decide.ask_at_risk`). Nothing for an ended run."""
    if state.terminal:
        return ()
    return (
        RunResumed(run_id=state.run_id, at=now, worker=worker, next_step=state.next_step, reason=RESUMED),
    )


def revision_gone(state: RunState, now: datetime, detail: str) -> tuple[RunHandedOff, ...]:
    """The run's pinned catalog revision is gone: never run on under another revision's rules, and never leave
    the run (and its session) wedged: it is handed to a person."""
    reason = HandOffReason.CATALOG_REVISION_GONE
    return (
        RunHandedOff(run_id=state.run_id, at=now, reason=reason, detail=detail, reply=handoff_reply(reason)),
    )


def answer(
    state: RunState, reply: ModelReply, now: datetime, passages: tuple[Passage, ...] = ()
) -> ModelAnswered | ModelRejected:
    """The model's answer as the run journals it, or refused as a step if its event would be over the journal's
    limit (the model is told, nothing is acted on)."""
    answered = model_answered(state, reply, now, passages)
    size = len(event_encoder.encode(answered))
    return model_rejected(state, reply, size, now) if size > MAX_EVENT_BYTES else answered
