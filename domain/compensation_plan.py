"""What an agent would undo, checked, and the compensation intents that undo it (whatever the budget). Pure."""

from __future__ import annotations

from datetime import datetime

import msgspec

from crashsafe.contracts.errors import AgentFault
from crashsafe.contracts.keys import CompensationKind, compensation_key
from crashsafe.contracts.run_events import Origin, RunEvent, ToolCall
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
