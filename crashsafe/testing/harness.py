"""Play an agent's conversation through the runtime's own fold and decisions, in memory, with the test playing
the outside world (the model, the providers, the approvers), so an adopter's tests assert on the journal the
runtime would write. No broker, no clock, no network: every decision is `next_move`'s, every event `intake`'s."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorCode, ErrorInfo, RetryClass
from crashsafe.contracts.inbound import InboundEvent, InboundMessage
from crashsafe.contracts.keys import inbound_hash, run_id_for
from crashsafe.contracts.memory import GuestProfile, SessionTurn
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalRequested,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    ToolCall,
)
from crashsafe.contracts.tool_messages import ActionOutcome, ExistingEffect, OutcomeStatus
from crashsafe.domain import approval_flow, intake
from crashsafe.domain.agent import Agent, ScriptedStep
from crashsafe.domain.decide import (
    Append,
    AskModel,
    AwaitActions,
    AwaitApproval,
    DecideApproval,
    Idle,
    next_move,
)
from crashsafe.domain.fold import fold_run
from crashsafe.domain.model_calls import ModelReply
from crashsafe.domain.run_state import RunState

# The harness's clock: a fixed start, one second per decided move, so two plays of a script give equal journals.
START = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Failed:
    """A provider's refusal (a declined card): the action definitively did not take effect."""

    code: str
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unknown:
    """No answer to trust (a timeout, a 5xx after the write may have happened): the outcome is unknown."""

    detail: str = "the provider did not answer in time"


@dataclass(frozen=True, slots=True)
class Conflicted:
    """The action's business key was first asked with other arguments (another slot for the same pet, vet and
    day): `idempotency_conflict`, nothing new was made. `existing`: what the key already holds, as the executor
    tells it to the effect's own account and guest (None: nothing to tell)."""

    existing: Mapping[str, Any] | None = None
    provider_ref: str | None = None


# A provider's answer to one action: its result (succeeded), a refusal, no answer to trust, or the executor's
# conflict over a key asked with other arguments.
ToolAnswer = dict[str, Any] | Failed | Unknown | Conflicted
# By tool name: an answer, or a function of the prepared arguments giving one; or one function of (tool, args).
ToolAnswers = (
    Mapping[str, ToolAnswer | Callable[[dict[str, Any]], ToolAnswer]]
    | Callable[[str, dict[str, Any]], ToolAnswer]
)
# What the model answers each time the run asks it: in order from a list, or a function of the folded run. A
# `ModelReply` is an answer as the runtime read it off the wire (`read_responses`: a recorded model), journaled with
# its own model, response id and token counts.
ModelScript = Sequence[ScriptedStep | ModelReply] | Callable[[RunState], ScriptedStep | ModelReply]
# A manager's decision on a held action: True approves, False rejects, None leaves it pending (the run waits).
Approve = Callable[[ApprovalRequested], bool | None]


def ask(tool: str, /, **args: Any) -> ScriptedStep:
    """A model answer that calls one tool with these arguments."""
    return ScriptedStep(calls=(tool_call(tool, **args),))


def tool_call(tool: str, /, **args: Any) -> ToolCall:
    """One tool call for a model answer of several (`ScriptedStep(calls=(tool_call(...), tool_call(...)))`); its
    call id is given by the harness, from the step."""
    return ToolCall(call_id="", name=tool, arguments=json.dumps(args))


def reply(text: str) -> ScriptedStep:
    """A model answer that is the final reply to the guest."""
    return ScriptedStep(reply=text)


@dataclass(frozen=True, slots=True)
class Played:
    """The journal so far (every event the runtime would have appended, in order) and the run folded from it."""

    events: tuple[RunEvent, ...]
    state: RunState
    # The agent's code faulted deciding for an ended run (nothing is journaled then; the runtime logs it).
    fault: str = ""

    @property
    def status(self) -> str:
        return self.state.status

    @property
    def reply(self) -> str | None:
        """What the guest was told at the end (the reply, or the hand-off's words); None while the run goes on."""
        for event in reversed(self.events):
            if isinstance(event, RunCompleted | RunHandedOff):
                return event.reply
        return None

    def of(self, kind: type[RunEvent]) -> list[Any]:
        """The journaled events of one type, in order (`played.of(PolicyDenied)`)."""
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def requested(self) -> list[tuple[str, dict[str, Any]]]:
        """Every action the run journaled as requested: (tool, prepared arguments), in step order."""
        return [(e.tool, e.args) for e in self.events if isinstance(e, ActionRequested)]


class Conversation:
    """One run of `agent`, played move by move as the runtime's drive loop would, until it waits on the guest or a
    person, or ends. `say` starts it with the guest's first message; each later `say` is the guest's next turn."""

    def __init__(
        self,
        agent: Agent,
        *,
        model: ModelScript,
        tools: ToolAnswers,
        approve: Approve | None = None,
        config: AgentConfig | None = None,
        guest_id: str = "guest_1",
        session_id: str = "session_1",
        tenant: str = "",
        profile: GuestProfile | None = None,
        history: Sequence[SessionTurn] = (),
        start: datetime = START,
        max_moves: int = 200,
    ) -> None:
        self.agent = agent
        self.config = config or agent.config
        self._model = model
        self._asked = 0
        self._tools = tools
        self._approve = approve
        self._guest = (guest_id, session_id, tenant)
        self._profile = profile
        self._history = list(history)
        self._now = start
        self._max_moves = max_moves
        self._events: list[RunEvent] = []
        self._state: RunState | None = None
        self._fault = ""
        self._said = 0

    @property
    def played(self) -> Played:
        assert self._state is not None, "the conversation has not started: say something first"
        return Played(tuple(self._events), self._state, self._fault)

    def say(self, text: str) -> Played:
        """The guest's message (the run's first, or its next turn), then the run played until it waits or ends."""
        if self._state is not None and self._state.terminal:
            raise AssertionError(
                f"the run ended ({self._state.status}): a further message starts a run of its own (a new "
                "Conversation, given the ended one's turn as `history`)"
            )
        guest_id, session_id, tenant = self._guest
        self._said += 1
        event_id = f"evt_{self._said}"
        message = InboundMessage(event_id=event_id, session_id=session_id, guest_id=guest_id, text=text)
        first = self._state is None
        inbound = InboundEvent(
            key=event_id,
            run_id=run_id_for(tenant, "evt_1"),
            input_hash=inbound_hash(message, self.agent.name),
            message=message,
            agent=self.agent.name,
            received_at=self._tick(),
            tenant=tenant,
            turn_of="" if first else run_id_for(tenant, "evt_1"),
        )
        if self._state is None:
            started = intake.run_started(
                inbound,
                self._now,
                revision=0,
                config=self.config,
                profile=self._profile,
                history=self._history,
            )
            self._add(started)
        else:
            self._add(*intake.turn(self._state, inbound, self._now))
        return self._drive()

    def expire(self) -> Played:
        """The approval the run waits for runs out (its timer fires past `expires_at`), then the run plays on."""
        state = self._state
        assert state is not None and state.awaiting is not None, "the run waits for no approval"
        waiting = state.awaiting
        self._now = max(self._now, waiting.expires_at)
        record = approval_flow.new_record(state, waiting)
        ran_out = approval_flow.expired(record, self._tick())
        assert ran_out is not None
        self._add(*_decided(ran_out, waiting, self._now))
        return self._drive()

    def _tick(self) -> datetime:
        self._now += timedelta(seconds=1)
        return self._now

    def _add(self, *events: RunEvent) -> None:
        for event in events:
            self._events.append(event)
            self._state = fold_run(self._state, event)

    def _drive(self) -> Played:
        for _ in range(self._max_moves):
            state = self._state
            assert state is not None
            now = self._tick()
            move = next_move(state, self.agent, now, self.config)
            if next_move(state, self.agent, now, self.config) != move:
                # What a replay would see: the same journal deciding otherwise (a clock, a random id, I/O).
                raise AssertionError(
                    f"agent {self.agent.name} decided two different moves from the same journal at step "
                    f"{state.next_step}: its hooks must be pure (no clock, no randomness, no I/O)"
                )
            match move:
                case Append(events=events):
                    self._add(*events)
                case AskModel():
                    self._add(intake.answer(state, self._model_reply(state), now))
                case AwaitActions(pending=pending, fault=fault):
                    self._fault = fault or self._fault
                    if not pending:
                        return self.played
                    for request in sorted(pending, key=lambda r: r.step_no):
                        assert self._state is not None
                        self._add(*intake.completed(self._state, self._outcome(request), now))
                case AwaitApproval(approval=approval):
                    decision = self._manager(approval)
                    if decision is None:
                        return self.played  # waits: on the guest's next message, or a manager
                    record = approval_flow.new_record(state, approval)
                    decided = approval_flow.decide(record, decision, "manager:test", "", now)
                    assert decided is not None
                    self._add(*_decided(decided, approval, now))
                case DecideApproval(approval=approval):
                    record = approval_flow.new_record(state, approval)
                    decided = approval_flow.decide(record, move.decision, move.decided_by, move.reason, now)
                    assert decided is not None
                    self._add(*_decided(decided, approval, now, move.turn_event_id))
                case Idle(fault=fault):
                    self._fault = fault or self._fault
                    return self.played
        raise AssertionError(f"the run made no end in {self._max_moves} moves: {self.played.status}")

    def _model_reply(self, state: RunState) -> ModelReply:
        """The script's next answer, with call ids from the step (`call_<step>_<n>`) where the script gave none."""
        if callable(self._model):
            step = self._model(state)
        else:
            if self._asked >= len(self._model):
                raise AssertionError(
                    f"the run asked the model a {self._asked + 1}th time, but the script has {len(self._model)}"
                    f" answers (the transcript ends with {json.dumps(state.transcript[-1])[:300]})"
                )
            step = self._model[self._asked]
        self._asked += 1
        given = step.tool_calls if isinstance(step, ModelReply) else step.calls
        calls = tuple(
            ToolCall(call_id=c.call_id or f"call_{state.next_step}_{i}", name=c.name, arguments=c.arguments)
            for i, c in enumerate(given, 1)
        )
        if isinstance(step, ModelReply):
            return replace(step, tool_calls=calls)
        return ModelReply(
            model="scripted",
            response_id=f"resp_{state.next_step}",
            tool_calls=calls,
            reply=None if calls else step.reply or "",
            input_tokens=10,
            output_tokens=5,
        )

    def _outcome(self, request: ActionRequested) -> ActionOutcome:
        """The executor's receipt for the test's answer, as the executor shapes it (`domain/execution.py`)."""
        answer = self._answer(request.tool, dict(request.args))
        status, result, error = OutcomeStatus.SUCCEEDED, {}, None
        existing: ExistingEffect | None = None
        match answer:
            case Failed(code=code, message=message, details=details):
                status = OutcomeStatus.FAILED
                error = ErrorInfo(code=code, message=message or code, details=dict(details))
            case Unknown(detail=detail):
                status = OutcomeStatus.UNKNOWN
                error = ErrorInfo(
                    code=ErrorCode.OUTCOME_UNKNOWN,
                    message=f"could not tell whether {request.tool} with key {request.key} took effect: "
                    f"{detail}; reconcile by key",
                    retry=RetryClass.UNKNOWN_OUTCOME,
                    details={"key": request.key},
                )
            case Conflicted(existing=held, provider_ref=ref):
                status = OutcomeStatus.CONFLICT
                error = ErrorInfo(
                    code=ErrorCode.IDEMPOTENCY_CONFLICT,
                    message=f"key {request.key} was first used with different input; nothing was sent to the "
                    "provider",
                    details={"key": request.key},
                )
                existing = ExistingEffect(result=dict(held), provider_ref=ref) if held is not None else None
            case _:
                result = answer
        return ActionOutcome(
            run_id=request.run_id,
            step_no=request.step_no,
            tool=request.tool,
            key=request.key,
            status=status,
            result=result,
            error=error,
            existing=existing,
        )

    def _answer(self, tool: str, args: dict[str, Any]) -> ToolAnswer:
        if callable(self._tools):
            return self._tools(tool, args)
        if tool not in self._tools:
            raise AssertionError(
                f"the run called {tool} with {args}, but the test gives no answer for {tool}"
            )
        given = self._tools[tool]
        return given(args) if callable(given) else given

    def _manager(self, approval: ApprovalRequested) -> str | None:
        if approval.approver == Approver.GUEST or self._approve is None:
            return None
        decision = self._approve(approval)
        if decision is None:
            return None
        return (ApprovalStatus.APPROVED if decision else ApprovalStatus.REJECTED).value


def _decided(
    record: ApprovalRecord, approval: ApprovalRequested, now: datetime, turn_event_id: str = ""
) -> tuple[RunEvent, ...]:
    event = approval_flow.decided_event(record, approval, now, turn_event_id)
    return (event,) if event is not None else ()


def play(
    agent: Agent,
    text: str,
    *,
    model: ModelScript,
    tools: ToolAnswers,
    approve: Approve | None = None,
    config: AgentConfig | None = None,
    guest_id: str = "guest_1",
    profile: GuestProfile | None = None,
) -> Played:
    """One guest message played to the end (or to where the run waits): the journal and the folded run."""
    conversation = Conversation(
        agent, model=model, tools=tools, approve=approve, config=config, guest_id=guest_id, profile=profile
    )
    return conversation.say(text)
