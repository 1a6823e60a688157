"""Which projections a run's journal calls for, as tasks with their receivers' dedup keys. Pure: the projector
plans with it when a run ends, the reconciler with it to find projections that never arrived."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from crashsafe.contracts.keys import business_key, input_hash
from crashsafe.contracts.projections import AUDIT_TRAIL_TOOL, ProjectionTask
from crashsafe.contracts.synthetic_turn import SYNTHETIC_AGENT, SYNTHETIC_TENANT
from crashsafe.domain.agent import ProjectionCall
from crashsafe.domain.identity import identity_of
from crashsafe.domain.registry import Tool
from crashsafe.domain.run_state import RunState


class Projecting(Protocol):
    """What the planner needs of an agent: the projection tools it declares and its pure `projections`."""

    @property
    def projection_tools(self) -> frozenset[str]: ...

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]: ...


class RetiredAgent:
    """An agent this deployment no longer runs, to the planner: no projections of its own (its runs' audit trail
    is still delivered)."""

    projection_tools: frozenset[str] = frozenset()

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        return ()


RETIRED = RetiredAgent()


def audit_key(run_id: str, upto: int) -> str:
    """The audit trail's task key: the run's events 1..upto (the receiver deduplicates each by its event id)."""
    return f"audit:{run_id}:{upto}"


def plan(
    state: RunState, events: int, agent: Projecting, tools: Mapping[str, Tool], now: datetime
) -> list[ProjectionTask]:
    """The tasks for a run whose journal holds `events` events: the agent's projections (each keyed by its tool's
    business identity, the key the receiver deduplicates by) and, where the deployment has one, its audit trail.

    A call naming a tool that is not a projection tool, or not one of the agent's `projection_tools`, is not
    planned: a projection is never a way around the executor's capabilities."""
    started = state.started
    tasks: list[ProjectionTask] = []
    for call in agent.projections(state):
        tool = tools.get(call.tool)
        if tool is None or tool.projection is None or call.tool not in agent.projection_tools:
            continue  # (an undeclared tool too: the projector reads no journal of an agent that declares none)
        values = identity_of(state, tool.contract, call.args)
        key = (
            business_key(tool.contract.identity_kind, started.tenant, values)
            if values is not None
            else f"{call.tool}:{state.run_id}:{input_hash(call.args)}"
        )
        tasks.append(
            ProjectionTask(
                tool=call.tool,
                key=key,
                run_id=state.run_id,
                tenant=started.tenant,
                agent=started.agent,
                args=call.args,
                planned_at=now,
            )
        )
    audit = tools.get(AUDIT_TRAIL_TOOL)
    # The synthetic turn's probes stay out of the audit log: their journal is their record (docs/failure-modes.md).
    # Both marks: the synthetic tenant's key starting any other agent's run is audited as every run is.
    probe = started.tenant == SYNTHETIC_TENANT and started.agent == SYNTHETIC_AGENT
    if audit is not None and audit.projection is not None and events > 0 and not probe:
        tasks.append(
            ProjectionTask(
                tool=AUDIT_TRAIL_TOOL,
                key=audit_key(state.run_id, events),
                run_id=state.run_id,
                tenant=started.tenant,
                agent=started.agent,
                planned_at=now,
                upto=events,
            )
        )
    return tasks
