"""Pure builders for the runtime core: hand-made journals, a run driven like the runtime drives it, replay.

Nothing here does I/O; the unit tests of fold, decide and the booking rules build their journals with these, and
the end-to-end tests replay real journals with `assert_replays`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.workloads import registry as bench_registry
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.inbound import InboundEvent, InboundMessage
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    ModelAnswered,
    RunEvent,
    RunStarted,
    ToolCall,
)
from crashsafe.domain.agent import Agent
from crashsafe.domain.decide import Append, AskModel, AwaitActions, Idle, next_move
from crashsafe.domain.fold import fold_run
from crashsafe.domain.model_calls import ModelReply, ask_at_risk, model_answered, model_asked
from crashsafe.domain.run_state import RunState
from crashsafe.replay_check import divergences

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUN = "run_0123456789abcdef01234567"
agent_named = bench_registry().agent
BOOKING = agent_named("booking")
STEPS5 = agent_named("steps5")
NIGHTLY = 12_000


# Builders -----------------------------------------------------------------------------------------------------


DEFAULT_BUDGET = Budget()


def started(
    agent: str = "booking",
    budget: Budget = DEFAULT_BUDGET,
    text: str = "Book a room in Lisbon",
    at: datetime = T0,
) -> RunStarted:
    return RunStarted(
        run_id=RUN,
        at=at,
        agent=agent,
        session_id="sess-1",
        guest_id="guest-1",
        event_id="evt-1",
        idempotency_key="evt-1",
        input_hash="0" * 64,
        text=text,
        budget=budget,
        deadline_at=at + timedelta(seconds=budget.deadline_s),
    )


def call(name: str, args: dict[str, Any] | str, call_id: str | None = None) -> ToolCall:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(
        call_id=call_id or f"call_{name}_{hashlib.sha256(arguments.encode()).hexdigest()[:6]}",
        name=name,
        arguments=arguments,
    )


def reply_of(
    calls: tuple[ToolCall, ...] = (), text: str | None = None, tokens: tuple[int, int] = (10, 5)
) -> ModelReply:
    return ModelReply(
        model="test-model",
        response_id=f"resp_{len(calls)}_{text!r:.8}",
        tool_calls=calls,
        reply=text,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
    )


def reply_from(event: ModelAnswered) -> ModelReply:
    """The model's answer as the shell got it, rebuilt from the journal: a replay never asks the model again."""
    return ModelReply(
        model=event.model,
        response_id=event.response_id,
        tool_calls=tuple(event.tool_calls),
        reply=event.reply,
        input_tokens=event.input_tokens,
        output_tokens=event.output_tokens,
        provider=event.provider,
        failovers=tuple(event.failovers),
    )


def receipt(
    request: ActionRequested, at: datetime, status: str = "succeeded", result: dict[str, Any] | None = None
) -> ActionCompleted:
    error = None if status == "succeeded" else ErrorInfo(code=f"sim_{status}", message=f"simulated {status}")
    return ActionCompleted(
        run_id=request.run_id,
        at=at,
        step_no=request.step_no,
        key=request.key,
        status=status,  # type: ignore[arg-type]
        result=result if result is not None else (provider_result(request) if status == "succeeded" else {}),
        error=error,
        provider_ref=f"ref:{request.key}",
    )


def provider_result(request: ActionRequested) -> dict[str, Any]:
    """What the sandbox providers answer, shaped like the real records (ids derived from the key)."""
    ref = hashlib.sha256(request.key.encode()).hexdigest()[:12]
    args = request.args
    match request.tool:
        case "search_hotels":
            return {
                "hotels": [
                    {
                        "hotel_id": "lis-1",
                        "name": "Casa do Alfama",
                        "city": "Lisbon",
                        "nightly_rate_cents": NIGHTLY,
                        "currency": "EUR",
                        "available": True,
                    }
                ]
            }
        case "create_booking":
            nights = (
                datetime.fromisoformat(args["check_out"]) - datetime.fromisoformat(args["check_in"])
            ).days
            return {
                "booking_id": f"bk_{ref}",
                "hotel_id": args["hotel_id"],
                "guest_id": args["guest_id"],
                "nights": nights,
                "total_cents": nights * NIGHTLY,
                "currency": "EUR",
                "status": "held",
            }
        case "create_payment":
            return {
                "payment_id": f"pay_{ref}",
                "booking_id": args["booking_id"],
                "amount_cents": args["amount_cents"],
                "currency": "EUR",
                "status": "captured",
            }
        case "release_booking":
            return {"booking_id": args["booking_id"], "status": "released"}
        case "refund_payment":
            return {"refund_id": f"re_{ref}", "payment_id": args["payment_id"], "status": "succeeded"}
        case "send_confirmation_email":
            return {"email_id": f"em_{ref}", "status": "sent"}
        case "update_crm":
            return {"crm_update_id": f"crm_{ref}", "status": "applied"}
        case _:
            return {"done": True, **args}


class Run:
    """A journal under construction: each event is folded as it is appended, like the runtime's in-memory run."""

    def __init__(self, first: RunStarted) -> None:
        self.events: list[RunEvent] = [first]
        self.state: RunState = fold_run(None, first)
        self.now = first.at

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def add(self, *events: RunEvent) -> RunState:
        for event in events:
            self.events.append(event)
            self.state = fold_run(self.state, event)
        return self.state

    def answer(
        self, *calls: ToolCall, text: str | None = None, tokens: tuple[int, int] = (10, 5)
    ) -> ModelAnswered:
        move = next_move(self.state, agent_named(self.state.agent), self.tick())
        assert isinstance(move, AskModel), move
        event = model_answered(self.state, reply_of(tuple(calls), text, tokens), self.now)
        self.add(event)
        return event

    def decide(self, agent: Agent = BOOKING) -> tuple[RunEvent, ...]:
        move = next_move(self.state, agent, self.tick())
        assert isinstance(move, Append), move
        self.add(*move.events)
        return move.events

    def complete(
        self, step_no: int, status: str = "succeeded", result: dict[str, Any] | None = None
    ) -> ActionCompleted:
        request = self.state.pending_step(step_no)
        assert request is not None, f"step {step_no} is not pending"
        done = receipt(request, self.tick(), status, result)
        self.add(done)
        return done


SEARCH = call(
    "search_hotels", {"city": "Lisbon", "check_in": "2031-12-01", "check_out": "2031-12-03"}, "call_search"
)
BOOK = call(
    "create_booking", {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}, "call_book"
)


def booked_run() -> tuple[Run, str]:
    """A run that searched and holds a booking: the point where payment rules matter."""
    run = Run(started())
    run.answer(SEARCH)
    run.decide()
    run.complete(2)
    run.answer(BOOK)
    (request,) = run.decide()
    assert isinstance(request, ActionRequested)
    done = run.complete(request.step_no)
    return run, done.result["booking_id"]


# Replay: the same journal gives the same decisions ------------------------------------------------------------


def assert_replays(journal: list[RunEvent]) -> None:
    """Temporal-style replay: fold each prefix, decide with the clock at the next event, and get the journal back.

    The replayer is `crashsafe.replay.divergences`, the one the recorded-journal corpus and `crashsafe replay`
    use: a decision that journals several events at one `now` is compared as one batch; receipts, model answers,
    turns, decided approvals and resume/nudge markers are inputs from outside (a receipt must answer a pending
    step or repeat a settled one; a model answer must be asked for, at its step, with the transcript the model saw).
    """
    found = divergences(journal, agent_named(journal[0].agent), None)  # type: ignore[union-attr]
    assert not found, "the journal differs on replay:\n" + "\n".join(str(d) for d in found)


# A run driven the way the runtime drives it -------------------------------------------------------------------


def booking_model(state: RunState) -> ModelReply:
    """A well-behaved model: search, book, pay, then a confirmation (the email and CRM record are projections)."""
    done = {req.tool: d for req, d in state.completed if req.origin == "model"}
    if any(d.status != "succeeded" for d in done.values()):
        return reply_of(text="Sorry, something failed.")
    booking_id = done["create_booking"].result["booking_id"] if "create_booking" in done else None
    for tool, args in (
        ("search_hotels", SEARCH.arguments),
        ("create_booking", BOOK.arguments),
        ("create_payment", json.dumps({"booking_id": booking_id})),
    ):
        if tool not in done:
            return reply_of((ToolCall(call_id=f"call_{tool}", name=tool, arguments=args),))
    return reply_of(text="Booked and paid.")


Model = Callable[[RunState], ModelReply]
Outcome = Callable[[ActionRequested], str]


def drive(
    first: RunStarted,
    model: Model,
    outcome: Outcome,
    pick: Callable[[int], int] = lambda n: 0,
    gap: Callable[[], float] = lambda: 1.0,
    extra: Callable[[Run], None] = lambda run: None,
    limit: int = 300,
) -> Run:
    """Run the pure core the way the runtime does, with a simulated model and simulated executors."""
    run = Run(first)
    agent = agent_named(first.agent)
    for _ in range(limit):
        move = next_move(run.state, agent, run.tick(gap()))
        match move:
            case Idle():
                return run
            case Append(events=events):
                run.add(*events)
            case AskModel(input=items):
                # As the runtime does: a run at risk journals its ask before the call, the answer after it.
                if ask_at_risk(run.state):
                    run.add(model_asked(run.state, "test-model", len(json.dumps(items)), run.now))
                run.add(model_answered(run.state, model(run.state), run.now))
            case AwaitActions(pending=pending):
                request = pending[pick(len(pending))]
                run.add(receipt(request, run.now, outcome(request)))
        extra(run)
    raise AssertionError(
        f"run did not end within {limit} moves: {[type(e).__name__ for e in run.events[-8:]]}"
    )


def inbound_of(started: RunStarted) -> InboundEvent:
    """The inbound message a run was started from, as the gateway published it when it accepted the run."""
    return InboundEvent(
        key=started.idempotency_key,
        run_id=started.run_id,
        input_hash=started.input_hash,
        message=InboundMessage(started.event_id, started.session_id, started.guest_id, started.text),
        agent=started.agent,
        received_at=started.at,
    )
