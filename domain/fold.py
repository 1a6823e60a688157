"""`fold_run`: the only way run state is made. Pure: no clock, no ids, no I/O; replay and runtime share it."""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import Any

import msgspec

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    Origin,
    Passage,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    RunStatus,
    ToolRejected,
    TurnReceived,
    UnknownEvent,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.chain import Chain
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.run_state import RunState, Summary, evolve

_json = msgspec.json.Encoder(order="sorted")


def _receipt_for(request: ActionRequested, receipt: ActionCompleted) -> bool:
    """Whether a receipt answers this journaled request. One the runtime journaled (`family` "") it checked
    before appending; one an executor appended itself (the journal as the bus) must name the request's key,
    tool and family: the checks `authority.outcome_refusal` makes of an outcome message, made where it is folded."""
    if not receipt.family:
        return True
    tool_ok = not receipt.tool or receipt.tool == request.tool
    return receipt.key == request.key and receipt.family == request.family and tool_ok


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
            transcript=(*context_items(event), {"role": "user", "content": event.text}),
            last_event_at=event.at,
            events=1,
        )
    replace = evolve  # dataclasses.replace at a fifth of the cost
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
                    failed_asks_in_row=state.failed_asks_in_row + 1,
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
                failed_asks_in_row=0,
            )
        case UnknownEvent(type=tag, step_no=step):
            next_step = state.next_step if step is None else max(state.next_step, step + 1)
            return replace(state, **base, next_step=next_step, unknown_events=state.unknown_events + (tag,))
        case ModelAnswered(step_no=step, tool_calls=calls, reply=reply):
            items = [passages_item(event.passages)] if event.passages else []
            items += [
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
                searched_turns=state.turns - len(state.inbox),
                failed_asks_in_row=0,
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
                tool_errors=state.tool_errors + (event.origin == Origin.MODEL),
            )
        case PolicyDenied(step_no=step, call_id=call_id):
            refusal = {"code": "not_allowed", "rule": event.rule, "message": event.reason}
            return _flushed(
                replace(
                    state,
                    **base,
                    next_step=max(state.next_step, step + 1),
                    unplanned=tuple(c for c in state.unplanned if c.call_id != call_id),
                    transcript=state.transcript + (_output_item(call_id, {"error": refusal}),),
                    denials=state.denials + 1,
                )
            )
        case ApprovalRequested(step_no=step):
            # The call's function_call stays open in the model's view until the action's outcome (or the
            # refusal) answers it; the model is not asked while the run waits.
            return replace(
                state,
                **base,
                next_step=max(state.next_step, step + 1),
                unplanned=tuple(c for c in state.unplanned if c.call_id != event.call.call_id),
                awaiting=event,
                approval_requests=state.approval_requests + (event,),
                final_reply=None,
            )
        case ApprovalDecided(approval_id=approval_id):
            waiting = state.awaiting
            if waiting is None or waiting.approval_id != approval_id:
                return replace(state, **base)  # already decided (a redelivery): folded once
            inbox = (
                Chain(t for t in state.inbox if t.event_id != event.turn_event_id)
                if event.turn_event_id
                else state.inbox
            )
            waited = max((event.at - waiting.at).total_seconds(), 0.0)
            decided = replace(
                state,
                **base,
                awaiting=None,
                approvals=state.approvals + (event,),
                inbox=inbox,
                waited_s=state.waited_s + waited,
            )
            if event.decision == ApprovalStatus.APPROVED:
                # Planned again: the approval holds only if the call prepares to the same input hash.
                return replace(decided, unplanned=(waiting.call,) + decided.unplanned)
            refusal = {
                "code": f"approval_{event.decision}",
                "message": event.reason or f"the approval for {waiting.tool} was {event.decision}",
            }
            decided = replace(
                decided,
                transcript=decided.transcript + (_output_item(waiting.call.call_id, {"error": refusal}),),
            )
            if event.decision == ApprovalStatus.EXPIRED or waiting.approver != Approver.GUEST:
                # Nobody said yes in time, or the manager said no: the run ends with a defined reply (after
                # the runtime undoes what the action would have completed, e.g. releases the hold). A message
                # the guest sent meanwhile is this run's turn: the model reads it (with the refusal) instead.
                return _flushed(replace(decided, final_reply=approval_ended_reply(waiting, event)))
            return _flushed(decided)
        case TurnReceived(event_id=event_id):
            if event_id in state.turn_ids or event_id == state.started.event_id:
                return replace(state, **base)  # the same message again (a redelivery): folded once
            queued = replace(
                state,
                **base,
                inbox=state.inbox.add(event),
                turns=state.turns + 1,
                turn_ids=state.turn_ids.add(event_id),
            )
            return _flushed(queued)
        case ActionCompleted(step_no=step):
            request = state.pending_step(step)
            if request is not None and not _receipt_for(request, event):
                return replace(state, **base)  # an executor's receipt for another request: not this step's
            if request is None:
                settled = state.unknown_step(step)
                if (
                    settled is not None
                    and event.status != OutcomeStatus.UNKNOWN
                    and _receipt_for(settled, event)
                ):
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
                if event.existing is not None:  # a conflict whose key already holds the run's guest's effect
                    payload["existing"] = msgspec.to_builtins(event.existing)
            transcript = state.transcript
            if request.origin != Origin.COMPENSATION:
                transcript += (_output_item(request.call_id, payload),)
            return _flushed(
                replace(
                    state,
                    **base,
                    pending=tuple(p for p in state.pending if p.step_no != step),
                    completed=state.completed + ((request, event),),
                    transcript=transcript,
                )
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
                # What the guest is told (a journal from before hand-off replies: the reason's defined reply).
                final_reply=event.reply or handoff_reply(reason),
            )
    raise TypeError(f"fold_run has no case for {type(event).__name__}")


def _flushed(state: RunState) -> RunState:
    """Guest messages waiting in the inbox join the model's view once no call is open (nothing pending,
    unplanned or awaiting approval): a function call and its output are never split by a user message."""
    if not state.inbox or state.pending or state.unplanned or state.awaiting is not None:
        return state
    said = tuple({"role": "user", "content": turn.text} for turn in state.inbox)
    return evolve(
        state,
        inbox=Chain(),
        transcript=state.transcript + said,
        final_reply=None,
        latest_turn_at=max(turn.at for turn in state.inbox),
    )


def context_items(started: RunStarted) -> tuple[dict[str, Any], ...]:
    """What the run knew when it started, as the model sees it: the session's earlier runs and the guest's
    profile (preferences), ahead of the guest's message."""
    items: list[dict[str, Any]] = []
    if started.history:
        lines = [f"- guest: {t.text!r} -> you: {t.reply!r}" for t in started.history]
        # The guest's own words: a user message, never the developer's (their text would gain its authority).
        items.append({"role": "user", "content": "Earlier in this session:\n" + "\n".join(lines)})
    profile = started.profile
    if profile is not None and profile.preferences:
        prefs = ", ".join(f"{k}: {v}" for k, v in sorted(profile.preferences.items()))
        items.append({"role": "developer", "content": f"The guest's remembered preferences: {prefs}"})
    return tuple(items)


def passages_item(passages: list[Passage]) -> dict[str, Any]:
    """Retrieved passages as the model sees them: one developer message ahead of the step's answer."""
    body = "\n\n".join(f"[{p.doc} § {p.section}]\n{p.text}" for p in passages)
    return {"role": "developer", "content": "From StayHub's documents:\n" + body}


def approval_ended_reply(waiting: ApprovalRequested, decided: ApprovalDecided) -> str:
    """The defined reply of a run whose approval expired or was refused by the manager."""
    what = waiting.question or f"{waiting.tool}"
    if decided.decision == ApprovalStatus.EXPIRED:
        return f"The approval for {what} was not given in time, so nothing was charged and the hold was released."
    reason = f" ({decided.reason})" if decided.reason else ""
    return f"The approval for {what} was declined by {decided.decided_by}{reason}; nothing was charged."


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
        # While the run waits for an approval, the guest is told what they are asked.
        reply=(
            state.awaiting.question
            if state.awaiting and state.awaiting.question and not state.terminal
            else state.final_reply
        ),
        handoff_reason=state.handoff_reason,
        pending_actions=[p.key for p in state.pending],
        awaiting_approval=state.awaiting.approval_id if state.awaiting and not state.terminal else None,
    )
