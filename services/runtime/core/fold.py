"""`fold_run`: the only way run state is made. Pure: no clock, no ids, no I/O; replay and runtime share it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import reduce
from typing import Any

import msgspec

from contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    Origin,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    RunStatus,
    ToolRejected,
    UnknownEvent,
)
from contracts.tool_messages import OutcomeStatus
from services.runtime.core.state import RunState, Summary

_json = msgspec.json.Encoder(order="sorted")


def _output_item(call_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": _json.encode(payload).decode()}


# An ask whose answer never reached the journal is charged this many tokens per byte it sent (about 4 bytes a
# token for English JSON): the provider billed it, even if we never learnt its usage.
BYTES_PER_TOKEN = 4


def fold_run(state: RunState | None, event: RunEvent | UnknownEvent) -> RunState:
    """Apply one journaled event. Events that cannot apply (a duplicate completion) leave the state as it is."""
    if state is None:
        if not isinstance(event, RunStarted):
            raise ValueError(f"a run's journal must open with run.started, not {type(event).__name__}")
        return RunState(
            run_id=event.run_id,
            agent=event.agent,
            guest_id=event.guest_id,
            session_id=event.session_id,
            started=event,
            transcript=({"role": "user", "content": event.text},),
            last_event_at=event.at,
            events=1,
        )
    replace = dataclasses.replace
    base = {"last_event_at": event.at, "events": state.events + 1}
    match event:
        case RunStarted():
            return replace(state, **base)  # a second start is never appended; tolerate it in old journals
        case ModelAsked(input_bytes=sent, failed=failed):
            cost = sent // BYTES_PER_TOKEN
            if failed:
                # A call that failed: it is the open ask if one was journaled for it, else one of its own.
                return replace(
                    state,
                    **base,
                    lost_asks=state.lost_asks + 1,
                    tokens_used=state.tokens_used + (state.asked_tokens if state.asking else cost),
                    asking=False,
                    asked_tokens=0,
                )
            if state.asking:  # the ask before this one never got an answer journaled: it still cost a step
                return replace(
                    state,
                    **base,
                    lost_asks=state.lost_asks + 1,
                    tokens_used=state.tokens_used + state.asked_tokens,
                    asked_tokens=cost,
                )
            return replace(state, **base, asking=True, asked_tokens=cost)
        case ModelRejected(step_no=step, error=error):
            note = (
                f"(runtime) your previous answer was refused and not acted on: {error.message}. "
                "Answer again, shorter."
            )
            return replace(
                state,
                **base,
                asking=False,
                asked_tokens=0,
                next_step=max(state.next_step, step + 1),
                tokens_used=state.tokens_used + event.input_tokens + event.output_tokens,
                transcript=state.transcript + ({"role": "user", "content": note},),
                unplanned=(),
                final_reply=None,
                model_steps=state.model_steps + 1,
            )
        case UnknownEvent(type=tag, step_no=step):
            next_step = state.next_step if step is None else max(state.next_step, step + 1)
            return replace(state, **base, next_step=next_step, unknown_events=state.unknown_events + (tag,))
        case ModelAnswered(step_no=step, tool_calls=calls, reply=reply):
            items = [
                {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
                for c in calls
            ]
            if reply is not None:
                items.append({"role": "assistant", "content": reply})
            return replace(
                state,
                **base,
                next_step=max(state.next_step, step + 1),
                tokens_used=state.tokens_used + event.input_tokens + event.output_tokens,
                transcript=state.transcript + tuple(items),
                unplanned=tuple(calls),
                final_reply=reply if not calls else None,
                model_steps=state.model_steps + 1,
                asking=False,
                asked_tokens=0,
            )
        case ActionRequested(step_no=step, call_id=call_id):
            if state.pending_step(step) or state.is_completed(step):
                return replace(state, **base)
            unplanned = tuple(c for c in state.unplanned if c.call_id != call_id)
            # A plan-driven action has no model call before it; give the model's view a call item anyway.
            # Compensations are the runtime's own business and stay out of the model's view.
            transcript = state.transcript
            if event.origin == Origin.PLAN:
                transcript += (
                    {
                        "type": "function_call",
                        "call_id": call_id,
                        "name": event.tool,
                        "arguments": _json.encode(event.args).decode(),
                    },
                )
            return replace(
                state,
                **base,
                next_step=max(state.next_step, step + 1),
                pending=state.pending + (event,),
                unplanned=unplanned,
                transcript=transcript,
                action_steps=state.action_steps + 1,
            )
        case ToolRejected(step_no=step, call_id=call_id, error=error):
            if event.origin == Origin.COMPENSATION:
                return replace(
                    state,
                    **base,
                    next_step=max(state.next_step, step + 1),
                    rejected_compensations=state.rejected_compensations + (call_id,),
                )
            return replace(
                state,
                **base,
                next_step=max(state.next_step, step + 1),
                unplanned=tuple(c for c in state.unplanned if c.call_id != call_id),
                transcript=state.transcript + (_output_item(call_id, {"error": msgspec.to_builtins(error)}),),
            )
        case ActionCompleted(step_no=step):
            request = state.pending_step(step)
            if request is None:
                settled = state.unknown_step(step)
                if settled is not None and event.status != OutcomeStatus.UNKNOWN:
                    # A late resolution of an unknown outcome: the journal now says what really happened.
                    completed = tuple((r, event if r.step_no == step else d) for r, d in state.completed)
                    return replace(state, **base, completed=completed)
                return replace(state, **base)  # duplicate or stray completion: already folded
            if event.status == OutcomeStatus.SUCCEEDED:
                payload: dict[str, Any] = dict(event.result)
            else:
                failure = (
                    msgspec.to_builtins(event.error) if event.error else {"code": event.status, "message": ""}
                )
                payload = {"error": failure, "status": event.status}
            transcript = state.transcript
            if request.origin != Origin.COMPENSATION:
                transcript += (_output_item(request.call_id, payload),)
            return replace(
                state,
                **base,
                pending=tuple(p for p in state.pending if p.step_no != step),
                completed=state.completed + ((request, event),),
                transcript=transcript,
            )
        case RunNudged():
            return replace(state, **base)
        case RunResumed():
            return replace(state, **base, resumes=state.resumes + 1)
        case RunCompleted(reply=reply):
            return replace(
                state, **base, status=RunStatus.COMPLETED, outcome=RunStatus.COMPLETED, final_reply=reply
            )
        case RunHandedOff(reason=reason):
            return replace(
                state,
                **base,
                status=RunStatus.HANDED_OFF,
                outcome=RunStatus.HANDED_OFF,
                handoff_reason=reason,
            )
    raise TypeError(f"fold_run has no case for {type(event).__name__}")


def replay(events: Iterable[RunEvent | UnknownEvent]) -> RunState | None:
    """The state a journal folds to: the same function the runtime, the CLI and the tests use."""
    return reduce(fold_run, events, None)


def summarize(state: RunState) -> Summary:
    return Summary(
        run_id=state.run_id,
        status=state.status,
        agent=state.agent,
        steps=state.steps_used,
        tokens_used=state.tokens_used,
        outcome=state.outcome,
        reply=state.final_reply,
        handoff_reason=state.handoff_reason,
        pending_actions=[p.key for p in state.pending],
    )
