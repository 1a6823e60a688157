"""The corpus check, Temporal's replayer: would this code have decided the journal it is given? Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    HandOffReason,
    JournalEvent,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    TurnReceived,
    UnknownEvent,
)
from crashsafe.domain.agent import Agent
from crashsafe.domain.decide import Append, AskModel, AwaitActions, Idle, next_move
from crashsafe.domain.fold import fold_run, summarize
from crashsafe.domain.model_calls import ModelReply, ask_at_risk, model_answered
from crashsafe.domain.run_state import RunState
from crashsafe.run_views import decision_of, move_summary


@dataclass(frozen=True, slots=True)
class Divergence:
    run_id: str
    position: int
    journaled: str
    decided: str

    def __str__(self) -> str:
        return (
            f"run {self.run_id} position {self.position}: journaled {self.journaled!r}, "
            f"but this code decides {self.decided!r}"
        )


def fields_differing(journaled: RunEvent, decided: RunEvent) -> str:
    """`field: journaled -> decided` for each field two events of one type disagree on."""
    a, b = msgspec.to_builtins(journaled), msgspec.to_builtins(decided)
    return "; ".join(
        f"{k}: {json.dumps(a.get(k), default=str)} -> {json.dumps(b.get(k), default=str)}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    )


def _reply_from(event: ModelAnswered) -> ModelReply:
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


# Hand-offs the runtime's shell decides from what it found outside the journal (the policy documents missing, the
# pinned catalog revision gone), not `next_move`: a replay takes them as given, as it takes a failed model call.
SHELL_HANDOFFS = frozenset(
    {HandOffReason.POLICY_UNAVAILABLE.value, HandOffReason.CATALOG_REVISION_GONE.value}
)


def _inputs(event: JournalEvent) -> bool:
    """Events the outside world journals (receipts are checked apart): markers, turns, decided approvals, a failed
    model call, a hand-off the shell decided, and events of a newer writer."""
    return (
        isinstance(event, RunResumed | RunNudged | TurnReceived | ApprovalDecided | UnknownEvent)
        or (isinstance(event, ModelAsked) and bool(event.failed))
        or (isinstance(event, RunHandedOff) and event.reason in SHELL_HANDOFFS)
    )


def _as_decided(event: JournalEvent) -> JournalEvent:
    """The event as `next_move` decides it: an intent journaled for the bus carries the capability the shell
    signed for it (issue 33), which is the runtime's key's answer, not the decision."""
    if isinstance(event, ActionRequested) and event.capability is not None:
        return msgspec.structs.replace(event, capability=None)
    return event


def divergences(
    journal: Sequence[JournalEvent], agent: Agent, config: AgentConfig | None
) -> list[Divergence]:
    """Temporal's replayer: fold each prefix, decide with the clock at the next event, compare with the journal.

    A decision that journals several events at one `now` (the calls of one answer, compensations) is compared as
    one batch. A model answer must have been asked for at its step, with the transcript the model saw, and be
    journaled as `model_answered` builds it; a receipt must answer a pending step (or repeat a settled one)."""
    found: list[Divergence] = []
    batch: list[RunEvent] = []
    run_id = journal[0].run_id if journal else ""
    state: RunState | None = fold_run(None, journal[0]) if journal else None
    states: list[RunState | None] = [None, state]  # states[i]: the fold of journal[:i]
    for i in range(1, len(journal)):
        assert state is not None
        before = state
        state = fold_run(state, journal[i])
        event = _as_decided(journal[i])
        states.append(state)
        position = i + 1
        if batch and event == batch[0]:
            batch.pop(0)
            continue
        # A batch cut short (a crash between its appends, then a resume) is decided again from here: the next
        # event is checked against a fresh decision, never against the rest of the old batch.
        batch = []
        if _inputs(event):
            continue
        if isinstance(event, ModelAnswered | ModelRejected) and isinstance(journal[i - 1], ModelAsked):
            prior = states[i - 1]  # the decision to ask was taken before the ask was journaled
            assert prior is not None
            before = prior
        move = next_move(before, agent, event.at, config)
        if isinstance(event, ModelAsked | ModelRejected | ModelAnswered):
            step = event.step_no
            # The ask is journaled before the call exactly when the run is at risk (resumed, or an ask lost):
            # a change of that rule would journal asks the recorded runs did not, or lose the ones they did.
            asked_first = not isinstance(event, ModelAsked) and isinstance(journal[i - 1], ModelAsked)
            if isinstance(event, ModelAsked) != ask_at_risk(before) and not asked_first:
                said = (
                    "journal an ask first"
                    if ask_at_risk(before)
                    else "call the model without journaling an ask"
                )
                found.append(Divergence(run_id, position, decision_of(event), said))
            elif move != AskModel(step_no=step, input=before.transcript):
                found.append(Divergence(run_id, position, decision_of(event), move_summary(move)))
            elif isinstance(event, ModelAnswered):
                rebuilt = model_answered(before, _reply_from(event), event.at, tuple(event.passages))
                if rebuilt != event:
                    found.append(Divergence(run_id, position, decision_of(event), decision_of(rebuilt)))
            continue
        if isinstance(event, ActionCompleted):
            if before.pending_step(event.step_no) is None:
                if not before.is_completed(event.step_no):
                    found.append(
                        Divergence(run_id, position, decision_of(event), "no such step was ever requested")
                    )
            elif not (isinstance(move, AwaitActions) and event.step_no in {p.step_no for p in move.pending}):
                found.append(Divergence(run_id, position, decision_of(event), move_summary(move)))
            continue
        if not isinstance(move, Append) or move.events[0] != event:
            decided = move_summary(move)
            if isinstance(move, Append) and type(move.events[0]) is type(event):
                decided += f" (differs in {fields_differing(event, move.events[0])})"
            found.append(Divergence(run_id, position, decision_of(event), decided))
            continue
        batch = list(move.events[1:])
    # A journal may end inside a batch (a crash between two appends): the runtime decides the rest again.
    if not batch and state is not None and state.terminal:
        # An ended run must stay ended under this code: a deploy must not start acting on old runs (a new
        # compensation rule undoing what a finished run did, a request published again).
        after = next_move(state, agent, journal[-1].at, config)
        if not isinstance(after, Idle):
            found.append(Divergence(run_id, len(journal) + 1, "nothing (the run ended)", move_summary(after)))
    return found


def model_views(journal: Sequence[JournalEvent]) -> dict[str, str]:
    """What the model was shown at each answered step, by journal position of the answer: a digest of the
    transcript the runtime sent (`AskModel.input`, the fold of the journal before the ask).

    The journal does not hold the model's input, so `divergences` can only check an answer's ask against the
    transcript this code folds, which is itself: a fold that changed what the model sees (a refusal dropped, a
    guest's turn doubled, a compensation's output shown) would pass. The recorder keeps these digests beside
    the corpus (tests/corpus/views.json), computed by the code that ran, and the corpus test holds the
    fold to them."""
    views: dict[str, str] = {}
    state: RunState | None = None
    states: list[RunState | None] = [None]
    for event in journal:
        state = fold_run(state, event)
        states.append(state)
    for i, event in enumerate(journal):
        if not isinstance(event, ModelAnswered | ModelRejected):
            continue
        asked = i - 1 if i > 0 and isinstance(journal[i - 1], ModelAsked) else i
        before = states[asked]
        if before is not None:
            body = _view_encoder.encode(list(before.transcript))
            views[str(i + 1)] = hashlib.sha256(body).hexdigest()
    return views


_view_encoder = msgspec.json.Encoder(order="sorted")


def recorded_views(journal: Sequence[JournalEvent]) -> dict[str, Any]:
    """What a recorded run showed outside its journal: the model at each answered step (`model_views`), and the
    caller at the end (`GET /v1/runs/{id}`'s summary of the fold)."""
    state: RunState | None = None
    for event in journal:
        state = fold_run(state, event)
    summary = msgspec.to_builtins(summarize(state)) if state is not None else None
    return {"asks": model_views(journal), "summary": summary}
