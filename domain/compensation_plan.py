"""What an agent would undo, checked, and the compensation intents that undo it (whatever the budget). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import msgspec

from crashsafe.contracts.errors import AgentFault
from crashsafe.contracts.keys import CompensationKind, compensation_key, undone_by
from crashsafe.contracts.run_events import Origin, RunEvent, RunStatus, ToolCall
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import Agent, Compensation, hook_misanswered, hook_raised
from crashsafe.domain.call_plan import plan_one
from crashsafe.domain.fold import fold_run
from crashsafe.domain.identity import handed_by_another_run
from crashsafe.domain.run_state import RunState

_json = msgspec.json.Encoder(order="sorted")


def _fits(comp: object) -> bool:
    return (
        isinstance(comp, Compensation)
        and isinstance(comp.tool, str)
        and isinstance(comp.args, dict)
        and isinstance(comp.undoes, str)
        and comp.kind in set(CompensationKind)
    )


def agent_compensations(state: RunState, agent: Agent, ending: bool) -> tuple[Compensation, ...]:
    """What the agent would undo, less the effects another run made (a business key's stored receipt handed to
    this run): that run undoes them, if anyone does; this one releasing them would undo another run's effect."""
    try:
        undo = agent.compensations(state, ending=ending)
    except Exception as exc:  # noqa: BLE001 -- the agent's code is foreign: whatever it raises is its fault
        raise hook_raised(agent, "compensations", exc) from exc
    if not isinstance(undo, (tuple, list)) or not all(_fits(c) for c in undo):
        raise hook_misanswered(agent, "compensations", undo, "a tuple of Compensation")
    return tuple(c for c in undo if not handed_by_another_run(state, c.undoes))


def left_to_undo(state: RunState, tools: Mapping[str, ToolContract]) -> tuple[str, ...]:
    """The keys of effects a handed-off run made and has not undone, whose tool has an undo (its contract names a
    `compensation`): what its agent would be asked to undo if its code answered. Read from the journal alone, for
    when that code faulted. A completed run undoes nothing (its effects are what the guest asked for); an effect
    another run made is that run's to undo; one whose compensation is on its way or succeeded is being undone (one
    that failed is not: a person must undo it)."""
    if state.status != RunStatus.HANDED_OFF:
        return ()
    undoing = {undone_by(r.key) for r in state.pending if r.origin == Origin.COMPENSATION}
    undoing |= {
        undone_by(r.key)
        for r, done in state.completed
        if r.origin == Origin.COMPENSATION and done.status == OutcomeStatus.SUCCEEDED
    }
    left = [
        req.key
        for req, done in state.completed
        if req.origin != Origin.COMPENSATION
        and done.status == OutcomeStatus.SUCCEEDED
        and (contract := tools.get(req.tool)) is not None
        and contract.compensation is not None
        and req.key not in undoing
        and not handed_by_another_run(state, req.key)
    ]
    return tuple(dict.fromkeys(left))  # one key asked twice (the same room) is one effect


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
        event = plan_one(
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
