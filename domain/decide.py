"""`next_move`: given a run's folded state and the time, what the runtime must do next. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import AgentFault
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalRequested,
    HandOffReason,
    Origin,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunStatus,
    ToolCall,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.agent import Agent, ScriptedStep, hook_misanswered, hook_raised
from crashsafe.domain.approval_flow import guest_answer
from crashsafe.domain.call_plan import plan_calls
from crashsafe.domain.compensation_plan import agent_compensations, left_to_undo, plan_compensations
from crashsafe.domain.handoff import handed_off
from crashsafe.domain.model_calls import over_budget
from crashsafe.domain.retrieval import policy_question
from crashsafe.domain.run_state import RunState


@dataclass(frozen=True, slots=True)
class AskModel:
    step_no: int
    input: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Append:
    events: tuple[RunEvent, ...]


@dataclass(frozen=True, slots=True)
class AwaitActions:
    """Actions are in flight; the shell makes sure each request was published (idempotently) and waits."""

    pending: tuple[ActionRequested, ...]
    # An ended run's agent faulted deciding what it must still undo: nothing is journaled (the run is with a person
    # already), so the shell reports it; what the agent would have undone is left for that person.
    fault: str = ""
    # With a fault: the keys of the effects the run left that a person must check, since the agent could not say
    # whether to undo them (`left_to_undo`). Empty: the fault left nothing undone, and no person need check.
    undo_left: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Idle:
    fault: str = ""  # as AwaitActions.fault
    undo_left: tuple[str, ...] = ()  # as AwaitActions.undo_left


@dataclass(frozen=True, slots=True)
class AwaitApproval:
    """The run waits for an approval, holding no worker: the shell makes sure the approval's record and its
    expiry timer exist, journals the decision if the record already has one, else lets the run go."""

    approval: ApprovalRequested


@dataclass(frozen=True, slots=True)
class DecideApproval:
    """The guest's message answers a guest approval: the shell decides the record (compare-and-set, once) and
    journals what the record then says (a manager or the expiry may have decided it first)."""

    approval: ApprovalRequested
    decision: str  # ApprovalStatus.APPROVED or REJECTED
    decided_by: str
    reason: str
    turn_event_id: str


Move = AskModel | Append | AwaitActions | Idle | AwaitApproval | DecideApproval


def next_move(state: RunState, agent: Agent, now: datetime, config: AgentConfig | None = None) -> Move:
    """`config`: the agent's configuration at the run's pinned catalog revision (None: the agent's built-in).

    Nothing an agent's code returns may wedge the run or the runtime: a hook that raises or answers the wrong
    type, or a move that makes no progress, is an `AgentFault`, and the run is handed off with its reason."""
    try:
        move = _next_move(state, agent, now, config)
        if isinstance(move, Append) and not move.events:
            raise AgentFault(agent=agent.name, hook="next move", problem="journals nothing (no progress)")
        return move
    except AgentFault as fault:
        return agent_failed(state, agent, fault, now)


def agent_failed(state: RunState, agent: Agent, fault: AgentFault, now: datetime) -> Move:
    """What a run does once its agent's code failed (here, or stopped by the shell's time limit): a live run is
    handed to a person; one already ended (with a person already) only waits on what is pending, as it would
    without the agent's further say, and names what it left that the agent may have wanted undone."""
    if not state.terminal:
        return Append((handed_off(state, now, HandOffReason.AGENT_FAULT, fault.message[:1000]),))
    said, left = fault.message[:1000], left_to_undo(state, agent.tools)
    if state.pending:
        return AwaitActions(state.pending, fault=said, undo_left=left)
    return Idle(fault=said, undo_left=left)


def _next_move(state: RunState, agent: Agent, now: datetime, config: AgentConfig | None) -> Move:
    config = config or agent.config
    if state.terminal:
        return _after_the_end(state, agent, now)
    if state.awaiting is not None:
        answer = guest_answer(state, state.awaiting)
        if answer is not None:
            return DecideApproval(
                state.awaiting,
                answer.decision,
                f"guest:{state.guest_id}",
                answer.reason,
                answer.turn_event_id,
            )
        return AwaitApproval(state.awaiting)
    if state.unplanned:
        return Append(plan_calls(state, agent, state.unplanned, now, config=config))
    if state.pending:
        # Compensations are exempt from the deadline; anything else pending past it is left to the reconciler,
        # which keeps asking by key, and the run hands off (after undoing what is known to need undoing).
        if now < state.deadline_at or any(p.origin == Origin.COMPENSATION for p in state.pending):
            return AwaitActions(state.pending)
        failed = _failed_compensations(state)
        if failed:
            return _compensation_failed(state, failed, now)
        undo = agent_compensations(state, agent, ending=True)
        if undo:
            return Append(plan_compensations(state, agent, undo, now))
        keys = ", ".join(p.key for p in state.pending)
        detail = (
            f"deadline {state.deadline_at.isoformat()} passed with {keys} pending; "
            "the reconciler keeps asking by key"
        )
        return Append((handed_off(state, now, HandOffReason.DEADLINE, detail),))
    failed = _failed_compensations(state)
    if failed:
        return _compensation_failed(state, failed, now)
    undo = agent_compensations(state, agent, ending=False)
    if undo:
        return Append(plan_compensations(state, agent, undo, now))
    unknown = [req.key for req, done in state.completed if done.status == OutcomeStatus.UNKNOWN]
    over = over_budget(state, now)
    if unknown or state.final_reply is not None or over:
        undo = agent_compensations(state, agent, ending=True)
        if undo:
            return Append(plan_compensations(state, agent, undo, now))
    if unknown:
        detail = f"outcome of {', '.join(unknown)} is unknown; reconcile by key before anything else"
        return Append((handed_off(state, now, HandOffReason.OUTCOME_UNKNOWN, detail),))
    if state.final_reply is not None:
        return Append((RunCompleted(run_id=state.run_id, at=now, reply=state.final_reply),))
    if over:
        reason, detail = over
        return Append((handed_off(state, now, reason, detail),))
    scripted = _scripted(state, agent)
    if scripted is not None:
        if scripted.calls:
            return Append(plan_calls(state, agent, scripted.calls, now, origin=Origin.PLAN, config=config))
        return Append((RunCompleted(run_id=state.run_id, at=now, reply=scripted.reply or ""),))
    return AskModel(step_no=state.next_step, input=state.transcript)


def _after_the_end(state: RunState, agent: Agent, now: datetime) -> Move:
    """An ended run still settles what it left open: a late receipt (a payment that failed after a deadline
    hand-off) gets its compensation, and a pending compensation's request is (re)published."""
    if state.status == RunStatus.HANDED_OFF:
        if any(p.origin == Origin.COMPENSATION for p in state.pending):
            return AwaitActions(state.pending)
        undo = agent_compensations(state, agent, ending=True)
        if undo:
            return Append(plan_compensations(state, agent, undo, now))
    if state.pending:
        return AwaitActions(state.pending)
    return Idle()


def _failed_compensations(state: RunState) -> list[str]:
    failed = [
        req.key
        for req, done in state.completed
        if req.origin == Origin.COMPENSATION and done.status != OutcomeStatus.SUCCEEDED
    ]
    return failed + [call_id.removeprefix("comp:") for call_id in state.rejected_compensations]


def _compensation_failed(state: RunState, failed: list[str], now: datetime) -> Append:
    detail = f"compensation {', '.join(failed)} did not succeed; a person must undo the effect"
    return Append((handed_off(state, now, HandOffReason.COMPENSATION_FAILED, detail),))


def _scripted(state: RunState, agent: Agent) -> ScriptedStep | None:
    """`agent.script(state)`, checked: a ScriptedStep of ToolCalls (or None)."""
    try:
        step = agent.script(state)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise hook_raised(agent, "script", exc) from exc
    if step is None:
        return None
    if (
        not isinstance(step, ScriptedStep)
        or not isinstance(step.calls, tuple)
        or not all(isinstance(c, ToolCall) for c in step.calls)
        or not (step.reply is None or isinstance(step.reply, str))
    ):
        raise hook_misanswered(agent, "script", step, "None or a ScriptedStep of ToolCalls")
    return step


def policy_unavailable(
    state: RunState, agent: Agent, query: str, problem: str, now: datetime
) -> RunHandedOff | None:
    """The degraded mode of a missing knowledge library: a policy question is handed to a person (never an
    invented policy), if the run has nothing in flight or to undo; anything else goes on to the model, which
    finds no passages and says it does not know (`problem`: why the documents are missing)."""
    if not problem or not policy_question(query) or state.pending or state.unplanned:
        return None
    try:
        if agent_compensations(state, agent, ending=True):
            return None
    except AgentFault:
        return None  # `next_move` hands the run off for it
    detail = f"policy documents unavailable ({problem[:300]}); the guest asked: {query[:200]}"
    return handed_off(state, now, HandOffReason.POLICY_UNAVAILABLE, detail)
