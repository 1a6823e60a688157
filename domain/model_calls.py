"""The events a model call journals (asked, answered, rejected) and the budgets that stop the asking. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import msgspec

from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.run_events import (
    MAX_EVENT_BYTES,
    HandOffReason,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    Passage,
    ToolCall,
)
from crashsafe.domain.run_state import RunState

_json = msgspec.json.Encoder(order="sorted")


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
