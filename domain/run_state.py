"""What a run is at a point in its journal, as plain immutable data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from crashsafe.contracts.keys import provider_account
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    Budget,
    RunStarted,
    RunStatus,
    ToolCall,
    TurnReceived,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.chain import Chain


@dataclass(frozen=True, slots=True)
class RunState:
    run_id: str
    agent: str
    guest_id: str
    session_id: str
    started: RunStarted
    status: RunStatus = RunStatus.RUNNING
    next_step: int = 1
    tokens_used: int = 0
    # The conversation as the model sees it, in OpenAI Responses API input items.
    transcript: tuple[dict[str, Any], ...] = ()
    # Tool calls from the latest model answer that the runtime has not yet requested or rejected.
    unplanned: tuple[ToolCall, ...] = ()
    pending: tuple[ActionRequested, ...] = ()
    completed: tuple[tuple[ActionRequested, ActionCompleted], ...] = ()
    # Compensations the runtime refused to even request (bad arguments): a person must undo those effects.
    rejected_compensations: tuple[str, ...] = ()
    final_reply: str | None = None
    outcome: RunStatus | None = None  # how it ended: completed or handed_off
    handoff_reason: str | None = None  # a HandOffReason, as journaled (open: a newer writer may add reasons)
    last_event_at: datetime | None = None
    events: int = 0
    resumes: int = 0
    model_steps: int = 0
    action_steps: int = 0
    # Model calls journaled as asked (`run.model_asked`) whose answer never reached the journal: each one
    # counts as a step, and its input as tokens, though no step number is spent on it.
    asking: bool = False  # the latest ask has no answer (yet)
    asked_tokens: int = 0  # what the open ask is charged if it never gets an answer
    lost_asks: int = 0
    # Model calls in a row that failed on every route (`run.model_asked` with `failed`), since the last answer.
    failed_asks_in_row: int = 0
    # Events a newer writer journaled that this version does not know: kept in the journal, skipped here.
    unknown_events: tuple[str, ...] = ()
    # The action a rule holds back until it is approved (the run waits, holding no worker), and every
    # approval asked for and decided so far.
    awaiting: ApprovalRequested | None = None
    approval_requests: tuple[ApprovalRequested, ...] = ()
    approvals: tuple[ApprovalDecided, ...] = ()
    # Guest messages of the session that arrived while the run was mid-step: they join the model's view
    # once nothing is pending (a function call and its output are never split by a user message). Chains, not
    # tuples: a run waiting for a manager may take many turns, and each must fold in O(1) (`core/chain.py`).
    inbox: Chain[TurnReceived] = field(default_factory=Chain)
    turns: int = 1
    # The event ids of the session's messages this run took as turns: a redelivered turn is folded once.
    turn_ids: Chain[str] = field(default_factory=Chain)
    # Seconds spent waiting for approvals: they do not count against the run's deadline.
    waited_s: float = 0.0
    denials: int = 0  # run.policy_denied
    tool_errors: int = 0  # run.tool_rejected of the model's calls
    # Guest turns in the transcript when the latest model answer was journaled: retrieval searches a turn's
    # text once, before that turn's first answered model call (`core/retrieval.py`).
    searched_turns: int = 0
    # When the latest guest turn that joined the model's view was journaled (None: only the run's first message).
    latest_turn_at: datetime | None = None

    @property
    def account(self) -> str:
        """The provider account this run acts in: its tenant's own ("" for a run journaled before tenancy)."""
        return provider_account(self.started.tenant, self.started.guest_scope)

    @property
    def turn_at(self) -> datetime:
        """When the guest's message the run is handling was journaled: its first message's `run.started`, or the
        latest `run.turn_received` the model has read. An agent's "today" (`prepare`'s "at most 5 days ahead"):
        folded from the journal, so every replay sees the same time; `datetime.now()` in a hook would not."""
        return self.latest_turn_at or self.started.at

    @property
    def budget(self) -> Budget:
        return self.started.budget

    @property
    def deadline_at(self) -> datetime:
        return self.started.deadline_at + timedelta(seconds=self.waited_s)

    @property
    def terminal(self) -> bool:
        return self.status != RunStatus.RUNNING

    @property
    def steps_used(self) -> int:
        """Step numbers spent, plus every model call whose answer never reached the journal (an open ask at
        decision time is one: the shell journals the answer before it decides again)."""
        return self.next_step - 1 + self.lost_asks + int(self.asking)

    @property
    def tokens_charged(self) -> int:
        """Tokens the journal accounts for, plus the estimate for an open ask that may never be answered."""
        return self.tokens_used + (self.asked_tokens if self.asking else 0)

    def pending_step(self, step_no: int) -> ActionRequested | None:
        return next((p for p in self.pending if p.step_no == step_no), None)

    def is_completed(self, step_no: int) -> bool:
        return any(req.step_no == step_no for req, _ in self.completed)

    def unknown_step(self, step_no: int) -> ActionRequested | None:
        """The request of a step whose journaled outcome is still unknown (a later resolution may settle it)."""
        return next(
            (
                req
                for req, done in self.completed
                if req.step_no == step_no and done.status == OutcomeStatus.UNKNOWN
            ),
            None,
        )

    def succeeded_results(self, tool: str) -> list[dict[str, Any]]:
        return [
            done.result
            for req, done in self.completed
            if req.tool == tool and done.status == OutcomeStatus.SUCCEEDED
        ]


@dataclass(frozen=True, slots=True)
class Summary:
    """What `GET /v1/runs/{id}` answers: derived from the state, never stored."""

    run_id: str
    status: RunStatus
    agent: str
    steps: int
    tokens_used: int
    outcome: RunStatus | None
    reply: str | None
    handoff_reason: str | None
    pending_actions: list[str] = field(default_factory=list)
    awaiting_approval: str | None = None  # the approval id the run waits for


def _evolver() -> Callable[..., RunState]:
    """`dataclasses.replace` for RunState at a fifth of its cost (the fold makes one per event): a copy whose
    slots are set straight from the old state or the changes, with no `__init__` (a frozen dataclass's sets each
    of its 37 fields through `object.__setattr__`). A name that is not a field is refused, as `replace` does."""
    names = tuple(f.name for f in fields(RunState))
    lines = ["def evolve(state, **changes):", "    new = make(RunState)"]
    for name in names:
        lines.append(f"    set_{name}(new, changes.pop({name!r}) if {name!r} in changes else state.{name})")
    lines += [
        "    if changes:",
        "        raise TypeError(f'RunState has no field(s) {sorted(changes)}')",
        "    return new",
    ]
    scope: dict[str, Any] = {"make": object.__new__, "RunState": RunState}
    scope |= {f"set_{name}": getattr(RunState, name).__set__ for name in names}
    exec("\n".join(lines), scope)  # noqa: S102 - code made here from the class's own field names
    evolve: Callable[..., RunState] = scope["evolve"]
    return evolve


evolve = _evolver()
