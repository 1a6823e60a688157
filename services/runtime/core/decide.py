"""`next_move`: given a run's folded state and the time, what the runtime must do next. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from contracts.errors import ErrorCode, ErrorInfo
from contracts.keys import action_key, compensation_key, input_hash
from contracts.run_events import (
    ActionRequested,
    HandOffReason,
    ModelAnswered,
    Origin,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    ToolCall,
    ToolRejected,
)
from contracts.tool_messages import OutcomeStatus
from contracts.tools import ToolContract
from services.runtime.core.agent import Agent, Compensation
from services.runtime.core.fold import fold_run
from services.runtime.core.state import RunState


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


@dataclass(frozen=True, slots=True)
class Idle:
    pass


Move = AskModel | Append | AwaitActions | Idle


@dataclass(frozen=True, slots=True)
class ModelReply:
    """A model answer as the model adapter parsed it, before it is journaled."""

    model: str
    response_id: str
    tool_calls: tuple[ToolCall, ...]
    reply: str | None
    input_tokens: int
    output_tokens: int


def next_move(state: RunState, agent: Agent, now: datetime) -> Move:
    if state.terminal:
        return Idle()
    if state.unplanned:
        return Append(plan_calls(state, agent, state.unplanned, now))
    if state.pending:
        return AwaitActions(state.pending)
    failed = [
        req.key
        for req, done in state.completed
        if req.origin == Origin.COMPENSATION and done.status != OutcomeStatus.SUCCEEDED
    ]
    failed += [call_id.removeprefix("comp:") for call_id in state.rejected_compensations]
    if failed:
        detail = f"compensation {', '.join(failed)} did not succeed; a person must undo the effect"
        return Append(
            (
                RunHandedOff(
                    run_id=state.run_id, at=now, reason=HandOffReason.COMPENSATION_FAILED, detail=detail
                ),
            )
        )
    undo = agent.compensations(state, ending=False)
    if undo:
        return Append(plan_compensations(state, agent, undo, now))
    unknown = [req.key for req, done in state.completed if done.status == OutcomeStatus.UNKNOWN]
    over = over_budget(state, now)
    if unknown or state.final_reply is not None or over:
        undo = agent.compensations(state, ending=True)
        if undo:
            return Append(plan_compensations(state, agent, undo, now))
    if unknown:
        detail = f"outcome of {', '.join(unknown)} is unknown; reconcile by key before anything else"
        return Append(
            (RunHandedOff(run_id=state.run_id, at=now, reason=HandOffReason.OUTCOME_UNKNOWN, detail=detail),)
        )
    if state.final_reply is not None:
        return Append((RunCompleted(run_id=state.run_id, at=now, reply=state.final_reply),))
    if over:
        reason, detail = over
        return Append((RunHandedOff(run_id=state.run_id, at=now, reason=reason, detail=detail),))
    scripted = agent.script(state)
    if scripted is not None:
        if scripted.calls:
            return Append(plan_calls(state, agent, scripted.calls, now, origin=Origin.PLAN))
        return Append((RunCompleted(run_id=state.run_id, at=now, reply=scripted.reply or ""),))
    return AskModel(step_no=state.next_step, input=state.transcript)


def over_budget(state: RunState, now: datetime) -> tuple[HandOffReason, str] | None:
    budget = state.budget
    if state.steps_used >= budget.max_steps:
        return HandOffReason.BUDGET_STEPS, f"used {state.steps_used} of {budget.max_steps} steps"
    if state.tokens_used >= budget.max_tokens:
        return HandOffReason.BUDGET_TOKENS, f"used {state.tokens_used} of {budget.max_tokens} tokens"
    if now >= state.deadline_at:
        return HandOffReason.DEADLINE, f"deadline {state.deadline_at.isoformat()} passed"
    return None


def model_answered(state: RunState, reply: ModelReply, now: datetime) -> ModelAnswered:
    return ModelAnswered(
        run_id=state.run_id,
        at=now,
        step_no=state.next_step,
        model=reply.model,
        response_id=reply.response_id,
        tool_calls=list(reply.tool_calls),
        reply=reply.reply if not reply.tool_calls else None,
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
    )


def plan_calls(
    state: RunState,
    agent: Agent,
    calls: tuple[ToolCall, ...],
    now: datetime,
    origin: Origin = Origin.MODEL,
) -> tuple[RunEvent, ...]:
    """Turn tool calls into durable intents, or typed rejections; each gets its own step number.

    Each planned event is folded before the next call is planned, so a rule like "one payment per booking"
    sees the calls before it in the same model answer."""
    events: list[RunEvent] = []
    planned = state
    for call in calls:
        step = planned.next_step
        stop: tuple[HandOffReason, str] | None = None
        if step > state.budget.max_steps:
            stop = (
                HandOffReason.BUDGET_STEPS,
                f"tool call {call.name} would be step {step} of {state.budget.max_steps}",
            )
        elif now >= state.deadline_at:
            stop = (
                HandOffReason.DEADLINE,
                f"tool call {call.name} came after the deadline {state.deadline_at.isoformat()}",
            )
        if stop:
            events.append(RunHandedOff(run_id=state.run_id, at=now, reason=stop[0], detail=stop[1]))
            break
        event = _plan_one(
            planned, agent, agent.tools, call, step, now, origin, action_key(state.run_id, step)
        )
        events.append(event)
        planned = fold_run(planned, event)
    return tuple(events)


def plan_compensations(
    state: RunState, agent: Agent, undo: tuple[Compensation, ...], now: datetime
) -> tuple[RunEvent, ...]:
    """Compensations always run, whatever the budget: an effect left half-done is worse than an extra step."""
    events: list[RunEvent] = []
    planned = state
    for comp in undo:
        key = compensation_key(comp.undoes, comp.kind)
        call = ToolCall(call_id=f"comp:{key}", name=comp.tool, arguments=_json.encode(comp.args).decode())
        event = _plan_one(
            planned, agent, agent.compensation_tools, call, planned.next_step, now, Origin.COMPENSATION, key
        )
        events.append(event)
        planned = fold_run(planned, event)
    return tuple(events)


_json = msgspec.json.Encoder(order="sorted")


def _plan_one(
    state: RunState,
    agent: Agent,
    tools: dict[str, ToolContract],
    call: ToolCall,
    step: int,
    now: datetime,
    origin: Origin,
    key: str,
) -> ActionRequested | ToolRejected:
    def reject(code: ErrorCode, message: str) -> ToolRejected:
        return rejected(ErrorInfo(code=code, message=message, details={"tool": call.name}))

    def rejected(error: ErrorInfo) -> ToolRejected:
        return ToolRejected(
            run_id=state.run_id,
            at=now,
            step_no=step,
            call_id=call.call_id,
            tool=call.name,
            error=error,
            origin=origin,
        )

    contract = tools.get(call.name)
    if contract is None:
        return reject(ErrorCode.UNKNOWN_TOOL, f"no tool named {call.name!r}; available: {sorted(tools)}")
    try:
        args = msgspec.json.decode(call.arguments) if call.arguments else {}
    except msgspec.DecodeError:
        return reject(ErrorCode.INVALID_TOOL_ARGUMENTS, f"arguments for {call.name} are not JSON")
    if not isinstance(args, dict):
        return reject(ErrorCode.INVALID_TOOL_ARGUMENTS, f"arguments for {call.name} must be a JSON object")
    prepared = agent.prepare(state, contract, args)
    if isinstance(prepared, ErrorInfo):
        return rejected(prepared)
    # The deadline is passed down: a step gets at most the run's remaining time, not its full timeout.
    # Compensations are exempt: undoing an effect must not be starved by the deadline that ended the run.
    remaining = max((state.deadline_at - now).total_seconds(), 0.0)
    timeout = (
        contract.timeout_s
        if origin == Origin.COMPENSATION or remaining <= 0
        else min(contract.timeout_s, remaining)
    )
    return ActionRequested(
        run_id=state.run_id,
        at=now,
        step_no=step,
        call_id=call.call_id,
        tool=contract.name,
        family=contract.family,
        args=prepared,
        key=key,
        input_hash=input_hash({"tool": contract.name, "args": prepared}),
        timeout_s=timeout,
        deadline_at=now + timedelta(seconds=timeout),
        origin=origin,
    )
