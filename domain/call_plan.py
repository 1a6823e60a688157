"""`plan_calls`: tool calls become durable intents, typed rejections, policy denials or approval requests. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import AgentFault, ErrorCode, ErrorInfo
from crashsafe.contracts.keys import action_key, tool_input_hash
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalRequested,
    ArgumentLimits,
    HandOffReason,
    Origin,
    PolicyDenied,
    RunEvent,
    ToolCall,
    ToolRejected,
)
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import Agent, hook_misanswered, hook_raised
from crashsafe.domain.argument_checks import check_arguments, check_schema
from crashsafe.domain.fold import fold_run
from crashsafe.domain.handoff import handed_off
from crashsafe.domain.identity import choose_key
from crashsafe.domain.model_calls import times_asked
from crashsafe.domain.policy_engine import check_asked, check_policy
from crashsafe.domain.policy_verdicts import Deny, Hold
from crashsafe.domain.run_state import RunState


def argument_types(agent: Agent) -> Mapping[str, type[msgspec.Struct]]:
    """The agent's argument structs by tool name. A value that is not a mapping of Struct types is the agent's
    mistake, an `AgentFault` (the run is handed off naming it), never a tool left unchecked in silence."""
    try:
        types: object = agent.argument_types
    except Exception as exc:  # noqa: BLE001 -- foreign code: a missing member or a property that raises
        raise hook_raised(agent, "argument_types", exc) from exc
    if not isinstance(types, Mapping):
        raise hook_misanswered(
            agent, "argument_types", types, "a mapping of tool name to msgspec Struct type"
        )
    for tool, struct in types.items():
        if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
            raise AgentFault(
                agent=agent.name,
                hook="argument_types",
                problem=f"names {type(struct).__name__} {str(struct)[:100]!r} for {str(tool)[:100]!r}, "
                "not a msgspec Struct type",
            )
    return types


def argument_limits(agent: Agent) -> ArgumentLimits:
    """The agent's own `argument_limits` (`AgentBase`: the contract's defaults, 16 KiB, 32 deep)."""
    try:
        limits: object = agent.argument_limits
    except Exception as exc:  # noqa: BLE001 -- foreign code: a missing member or a property that raises
        raise hook_raised(agent, "argument_limits", exc) from exc
    if not isinstance(limits, ArgumentLimits):
        raise hook_misanswered(agent, "argument_limits", limits, "an ArgumentLimits")
    return limits


def plan_calls(
    state: RunState,
    agent: Agent,
    calls: tuple[ToolCall, ...],
    now: datetime,
    origin: Origin = Origin.MODEL,
    config: AgentConfig | None = None,
) -> tuple[RunEvent, ...]:
    """Turn tool calls into durable intents, typed rejections, policy denials or approval requests; each gets
    its own step number.

    Each planned event is folded before the next call is planned, so a rule like "one payment per order"
    sees the calls before it in the same model answer. Calls after one held for approval are not run."""
    config = config or agent.config
    events: list[RunEvent] = []
    planned = state
    for index, call in enumerate(calls):
        if planned.awaiting is not None:
            held = planned.awaiting.tool
            for skipped in calls[index:]:
                if planned.next_step + planned.lost_asks > state.budget.max_steps:
                    # Each skipped call is a step too: a flood of them after a held call is stopped by the
                    # budget like any other call, not journaled one rejection at a time.
                    detail = (
                        f"{len(calls) - index} tool calls came after {held[:200]} in one answer, past the "
                        f"{state.budget.max_steps} steps"
                    )
                    events.append(handed_off(state, now, HandOffReason.BUDGET_STEPS, detail))
                    break
                event: RunEvent = ToolRejected(
                    run_id=state.run_id,
                    at=now,
                    step_no=planned.next_step,
                    call_id=skipped.call_id,
                    tool=skipped.name,
                    error=ErrorInfo(
                        code=ErrorCode.NOT_RUN,
                        message=f"not run: {held} in the same answer waits for approval; ask again after it",
                        details={"tool": skipped.name[:200]},
                    ),
                    origin=origin,
                )
                events.append(event)
                planned = fold_run(planned, event)
            break
        step = planned.next_step
        stop: tuple[HandOffReason, str] | None = None
        if step + planned.lost_asks > state.budget.max_steps:
            stop = (
                HandOffReason.BUDGET_STEPS,
                f"tool call {call.name[:200]} would be step {step + planned.lost_asks} of {state.budget.max_steps}",
            )
        elif now >= state.deadline_at:
            stop = (
                HandOffReason.DEADLINE,
                f"tool call {call.name[:200]} came after the deadline {state.deadline_at.isoformat()}",
            )
        elif origin == Origin.MODEL and (asked := times_asked(planned, call)) > config.max_repeats:
            # The same call again and again is a model going round in circles: stop before the step budget.
            stop = (
                HandOffReason.LOOP,
                f"the model asked for {call.name[:200]} with the same arguments {asked} times "
                f"(at most {config.max_repeats})",
            )
        if stop:
            events.append(handed_off(state, now, stop[0], stop[1]))
            break
        event = plan_one(
            planned, agent, agent.tools, call, step, now, origin, action_key(state.run_id, step), config
        )
        events.append(event)
        planned = fold_run(planned, event)
    return tuple(events)


def approval_id_for(run_id: str, step_no: int) -> str:
    """An approval's id: the step that asked for it, so deciding the step twice names one approval."""
    return f"apr_{run_id.removeprefix('run_')}_{step_no}"


def _question(agent: Agent, state: RunState, contract: ToolContract, args: dict[str, Any], hold: Hold) -> str:
    """The agent's wording of what a held action asks of its approver (foreign code: checked like every hook)."""
    try:
        question = agent.approval_question(state, contract, args, hold)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise hook_raised(agent, "approval_question", exc) from exc
    if not isinstance(question, str):
        raise hook_misanswered(agent, "approval_question", question, "a str")
    return question[:2000]


def plan_one(
    state: RunState,
    agent: Agent,
    tools: dict[str, ToolContract],
    call: ToolCall,
    step: int,
    now: datetime,
    origin: Origin,
    key: str,
    config: AgentConfig,
) -> ActionRequested | ToolRejected | PolicyDenied | ApprovalRequested:
    def reject(code: ErrorCode, message: str) -> ToolRejected:
        return rejected(ErrorInfo(code=code, message=message, details={"tool": call.name[:200]}))

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
        return reject(
            ErrorCode.UNKNOWN_TOOL, f"no tool named {call.name[:200]!r}; available: {sorted(tools)}"
        )

    def denied(verdict: Deny) -> PolicyDenied:
        return PolicyDenied(
            run_id=state.run_id,
            at=now,
            step_no=step,
            call_id=call.call_id,
            tool=contract.name,
            rule=verdict.rule,
            reason=verdict.reason,
            origin=origin,
        )

    args = check_arguments(call.name, call.arguments, argument_limits(agent))
    if isinstance(args, ErrorInfo):
        return rejected(args)
    # The rules about the call as the model wrote it come first: a field only the server may fill (an amount,
    # a recipient) is a policy denial, not a malformed call.
    refusal = check_asked(state, config, contract, args, origin, agent)
    if refusal is not None:
        return denied(refusal)
    schema = argument_types(agent).get(contract.name) if origin != Origin.COMPENSATION else None
    if schema is not None:
        misfit = check_schema(contract.name, args, schema)
        if misfit is not None:
            return rejected(misfit)
    try:
        prepared = agent.prepare(state, contract, args)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise hook_raised(agent, "prepare", exc) from exc
    if isinstance(prepared, ErrorInfo):
        return rejected(prepared)
    if not isinstance(prepared, dict):
        raise hook_misanswered(agent, "prepare", prepared, "a dict of arguments or an ErrorInfo")
    try:
        hashed = tool_input_hash(contract.name, prepared)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise AgentFault(
            agent=agent.name, hook="prepare", problem=f"returned arguments that are not JSON ({exc})"[:300]
        ) from exc
    # The key names the action's business identity (compensations keep the key of what they undo); a new
    # attempt at a money action that failed is the guest's decision, never the model's. Chosen before the rules
    # are read: an approval covers only the attempt (the key) it was asked for.
    keyed = choose_key(state, contract, prepared, hashed, key) if origin != Origin.COMPENSATION else None
    attempt = keyed.key if keyed is not None and keyed.key != key else ""
    verdict = check_policy(state, config, contract, prepared, hashed, origin, now, agent, attempt)
    if keyed is not None and not isinstance(verdict, (Deny, Hold)):
        key, verdict = keyed.key, keyed.verdict
    if isinstance(verdict, Deny):
        return denied(verdict)
    if isinstance(verdict, Hold):
        return ApprovalRequested(
            run_id=state.run_id,
            at=now,
            step_no=step,
            approval_id=approval_id_for(state.run_id, step),
            call=call,
            tool=contract.name,
            args=prepared,
            input_hash=hashed,
            amount_cents=verdict.amount_cents,
            currency=verdict.currency,
            approver=verdict.approver,
            rule=verdict.rule,
            reason=verdict.reason,
            expires_at=now + timedelta(seconds=verdict.ttl_s),
            question=_question(agent, state, contract, prepared, verdict),
        )
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
        input_hash=hashed,
        timeout_s=timeout,
        deadline_at=now + timedelta(seconds=timeout),
        origin=origin,
    )
