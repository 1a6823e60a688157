"""`next_move`: given a run's folded state and the time, what the runtime must do next. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import AgentFault, ErrorCode, ErrorInfo
from crashsafe.contracts.keys import CompensationKind, action_key, compensation_key, tool_input_hash
from crashsafe.contracts.run_events import (
    MAX_EVENT_BYTES,
    ActionRequested,
    ApprovalRequested,
    ArgumentLimits,
    HandOffReason,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    Origin,
    Passage,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunStatus,
    ToolCall,
    ToolRejected,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import Agent, Compensation, ScriptedStep
from crashsafe.domain.approval_flow import guest_answer
from crashsafe.domain.arguments import check_arguments, check_schema
from crashsafe.domain.fold import fold_run
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.identity import choose_key, handed_by_another_run
from crashsafe.domain.policy_engine import Deny, Hold, check_asked, check_policy
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


@dataclass(frozen=True, slots=True)
class Idle:
    fault: str = ""  # as AwaitActions.fault


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


@dataclass(frozen=True, slots=True)
class ModelReply:
    """A model answer as the model adapter parsed it, before it is journaled."""

    model: str
    response_id: str
    tool_calls: tuple[ToolCall, ...]
    reply: str | None
    input_tokens: int
    output_tokens: int
    provider: str = ""  # the route that answered
    failovers: tuple[str, ...] = ()  # routes that failed before it, "name: why"


DEFAULT_ARGUMENT_LIMITS = ArgumentLimits()


def argument_types(agent: Agent) -> dict[str, type[msgspec.Struct]]:
    """The agent's argument structs by tool name (`agent.argument_types`), if it declares them."""
    types = getattr(agent, "argument_types", None)
    if not isinstance(types, dict):
        return {}
    # An entry that is not a Struct type is the agent's mistake: its tool is checked as if it declared none.
    return {k: t for k, t in types.items() if isinstance(t, type) and issubclass(t, msgspec.Struct)}


def argument_limits(agent: Agent) -> ArgumentLimits:
    """The agent's own `argument_limits` if it declares them, else the contract's defaults (16 KiB, 32 deep)."""
    limits = getattr(agent, "argument_limits", None)
    return limits if isinstance(limits, ArgumentLimits) else DEFAULT_ARGUMENT_LIMITS


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
        return _agent_failed(state, fault, now)


def _agent_failed(state: RunState, fault: AgentFault, now: datetime) -> Move:
    """A live run is handed to a person; one already ended (with a person already) only waits on what is
    pending, as it would without the agent's further say."""
    if not state.terminal:
        return Append((handed_off(state, now, HandOffReason.AGENT_FAULT, fault.message[:1000]),))
    said = fault.message[:1000]
    return AwaitActions(state.pending, fault=said) if state.pending else Idle(fault=said)


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
        undo = _compensations(state, agent, ending=True)
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
    undo = _compensations(state, agent, ending=False)
    if undo:
        return Append(plan_compensations(state, agent, undo, now))
    unknown = [req.key for req, done in state.completed if done.status == OutcomeStatus.UNKNOWN]
    over = over_budget(state, now)
    if unknown or state.final_reply is not None or over:
        undo = _compensations(state, agent, ending=True)
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
        undo = _compensations(state, agent, ending=True)
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


def handed_off(state: RunState, now: datetime, reason: HandOffReason, detail: str) -> RunHandedOff:
    """Every hand-off carries what the guest is told (`summarize` answers it as the run's reply)."""
    return RunHandedOff(
        run_id=state.run_id, at=now, reason=reason, detail=detail, reply=handoff_reply(reason)
    )


def canonical_call(name: str, arguments: str) -> tuple[str, str]:
    """A tool call as the loop detector compares them: its name and its arguments, key order and spacing aside."""
    try:
        return name, _json.encode(msgspec.json.decode(arguments)).decode() if arguments else "{}"
    except (msgspec.DecodeError, UnicodeError, ValueError, RecursionError):
        return name, arguments


def times_asked(state: RunState, call: ToolCall) -> int:
    """How often the model has asked for this call (name and canonical arguments) in the run, this one included:
    every call the model made is a `function_call` item of the transcript, once."""
    wanted = canonical_call(call.name, call.arguments)
    return sum(
        1
        for item in state.transcript
        if item.get("type") == "function_call"
        and item.get("name") == call.name
        and canonical_call(str(item.get("name")), str(item.get("arguments", ""))) == wanted
    )


# Model calls in a row that failed on every route before the run is handed off (`model_unavailable`): with the
# redelivery's backoff (0.4 s doubling to 5 s) about 11 s of a provider outage, well inside a run's deadline.
MAX_FAILED_ASKS = 5


def over_budget(state: RunState, now: datetime) -> tuple[HandOffReason, str] | None:
    budget = state.budget
    if state.failed_asks_in_row >= MAX_FAILED_ASKS:
        return (
            HandOffReason.MODEL_UNAVAILABLE,
            f"{state.failed_asks_in_row} model calls in a row failed on every route",
        )
    if state.steps_used >= budget.max_steps:
        lost = f" ({state.lost_asks} model call(s) never answered)" if state.lost_asks else ""
        return HandOffReason.BUDGET_STEPS, f"used {state.steps_used} of {budget.max_steps} steps{lost}"
    if state.tokens_charged >= budget.max_tokens:
        return HandOffReason.BUDGET_TOKENS, f"used {state.tokens_charged} of {budget.max_tokens} tokens"
    if now >= state.deadline_at:
        return HandOffReason.DEADLINE, f"deadline {state.deadline_at.isoformat()} passed"
    return None


def model_asked(state: RunState, model: str, input_bytes: int, now: datetime, failed: str = "") -> ModelAsked:
    """A model call that counts against the budgets whether or not its answer is journaled."""
    return ModelAsked(
        run_id=state.run_id,
        at=now,
        step_no=state.next_step,
        model=model,
        input_bytes=input_bytes,
        failed=failed,
    )


def ask_at_risk(state: RunState) -> bool:
    """Whether to journal an ask before the call: the run has been resumed (a worker died under it once) or has
    lost an ask already. A run on the happy path journals no ask; a failed call is journaled after the fact."""
    return state.resumes > 0 or state.lost_asks > 0


def model_rejected(state: RunState, reply: ModelReply, answer_bytes: int, now: datetime) -> ModelRejected:
    """The answer's event would be over the journal's limit: refuse it as a step, tell the model, act on nothing."""
    return ModelRejected(
        run_id=state.run_id,
        at=now,
        step_no=state.next_step,
        model=reply.model,
        response_id=reply.response_id,
        error=ErrorInfo(
            code=ErrorCode.MODEL_ANSWER_TOO_LARGE,
            message=f"the answer is {answer_bytes} bytes, over the journal's limit of {MAX_EVENT_BYTES}",
            details={"bytes": answer_bytes, "limit": MAX_EVENT_BYTES},
        ),
        answer_bytes=answer_bytes,
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
    )


def model_answered(
    state: RunState, reply: ModelReply, now: datetime, passages: tuple[Passage, ...] = ()
) -> ModelAnswered:
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
        provider=reply.provider,
        failovers=list(reply.failovers),
        passages=list(passages),
    )


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

    Each planned event is folded before the next call is planned, so a rule like "one payment per booking"
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
        event = _plan_one(
            planned, agent, agent.tools, call, step, now, origin, action_key(state.run_id, step), config
        )
        events.append(event)
        planned = fold_run(planned, event)
    return tuple(events)


def _raised(agent: Agent, hook: str, exc: Exception) -> AgentFault:
    return AgentFault(agent=agent.name, hook=hook, problem=f"raised {type(exc).__name__}: {str(exc)[:300]}")


def _wrong(agent: Agent, hook: str, answer: object, expected: str) -> AgentFault:
    return AgentFault(
        agent=agent.name, hook=hook, problem=f"returned {type(answer).__name__}, not {expected}"
    )


def _scripted(state: RunState, agent: Agent) -> ScriptedStep | None:
    """`agent.script(state)`, checked: a ScriptedStep of ToolCalls (or None)."""
    try:
        step = agent.script(state)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise _raised(agent, "script", exc) from exc
    if step is None:
        return None
    if (
        not isinstance(step, ScriptedStep)
        or not isinstance(step.calls, tuple)
        or not all(isinstance(c, ToolCall) for c in step.calls)
        or not (step.reply is None or isinstance(step.reply, str))
    ):
        raise _wrong(agent, "script", step, "None or a ScriptedStep of ToolCalls")
    return step


def _fits(comp: object) -> bool:
    return (
        isinstance(comp, Compensation)
        and isinstance(comp.tool, str)
        and isinstance(comp.args, dict)
        and isinstance(comp.undoes, str)
        and comp.kind in set(CompensationKind)
    )


def _compensations(state: RunState, agent: Agent, ending: bool) -> tuple[Compensation, ...]:
    """What the agent would undo, less the effects another run made (a business key's stored receipt handed to
    this run): that run undoes them, if anyone does; this one releasing them would undo another run's booking."""
    try:
        undo = agent.compensations(state, ending=ending)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise _raised(agent, "compensations", exc) from exc
    if not isinstance(undo, (tuple, list)) or not all(_fits(c) for c in undo):
        raise _wrong(agent, "compensations", undo, "a tuple of Compensation")
    return tuple(c for c in undo if not handed_by_another_run(state, c.undoes))


def plan_compensations(
    state: RunState, agent: Agent, undo: tuple[Compensation, ...], now: datetime
) -> tuple[RunEvent, ...]:
    """Compensations always run, whatever the budget: an effect left half-done is worse than an extra step."""
    events: list[RunEvent] = []
    planned = state
    for comp in undo:
        key = compensation_key(comp.undoes, comp.kind)
        # Two steps may hold one business key (the same room asked for twice): it is undone once.
        if any(p.key == key for p in planned.pending) or any(r.key == key for r, _ in planned.completed):
            continue
        call = ToolCall(call_id=f"comp:{key}", name=comp.tool, arguments=_json.encode(comp.args).decode())
        event = _plan_one(
            planned,
            agent,
            agent.compensation_tools,
            call,
            planned.next_step,
            now,
            Origin.COMPENSATION,
            key,
            agent.config,
        )
        events.append(event)
        planned = fold_run(planned, event)
    if undo and not events:
        # Every one is pending or carried out already: planning nothing again and again would spin the runtime.
        keys = ", ".join(sorted({compensation_key(c.undoes, c.kind) for c in undo}))[:300]
        raise AgentFault(
            agent=agent.name, hook="compensations", problem=f"asked again for {keys}, already carried out"
        )
    return tuple(events)


_json = msgspec.json.Encoder(order="sorted")


def approval_id_for(run_id: str, step_no: int) -> str:
    """An approval's id: the step that asked for it, so deciding the step twice names one approval."""
    return f"apr_{run_id.removeprefix('run_')}_{step_no}"


def _plan_one(
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
    refusal = check_asked(state, config, contract, args, origin)
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
        raise _raised(agent, "prepare", exc) from exc
    if isinstance(prepared, ErrorInfo):
        return rejected(prepared)
    if not isinstance(prepared, dict):
        raise _wrong(agent, "prepare", prepared, "a dict of arguments or an ErrorInfo")
    try:
        hashed = tool_input_hash(contract.name, prepared)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise AgentFault(
            agent=agent.name, hook="prepare", problem=f"returned arguments that are not JSON ({exc})"[:300]
        ) from exc
    verdict = check_policy(state, config, contract, prepared, hashed, origin, now)
    if origin != Origin.COMPENSATION and not isinstance(verdict, (Deny, Hold)):
        # The key names the action's business identity (compensations keep the key of what they undo); a new
        # attempt at a money action that failed is the guest's decision, never the model's.
        keyed = choose_key(state, contract, prepared, hashed, key)
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
            question=verdict.question,
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


def policy_unavailable(
    state: RunState, agent: Agent, query: str, problem: str, now: datetime
) -> RunHandedOff | None:
    """The degraded mode of a missing knowledge library: a policy question is handed to a person (never an
    invented policy), if the run has nothing in flight or to undo; anything else goes on to the model, which
    finds no passages and says it does not know (`problem`: why the documents are missing)."""
    if not problem or not policy_question(query) or state.pending or state.unplanned:
        return None
    try:
        if _compensations(state, agent, ending=True):
            return None
    except AgentFault:
        return None  # `next_move` hands the run off for it
    detail = f"policy documents unavailable ({problem[:300]}); the guest asked: {query[:200]}"
    return handed_off(state, now, HandOffReason.POLICY_UNAVAILABLE, detail)
