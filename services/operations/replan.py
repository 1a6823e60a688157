"""A dead projection planned again from its run's journal, now: what `crashsafe projections retry` sends and what
replaying a projector's dead letter sends (the console, `crashsafe dead-letters replay`). One home, so both carry
what the run decided by now (a charge refunded since is not confirmed)."""

from __future__ import annotations

from datetime import UTC, datetime

from crashsafe.contracts.projections import ProjectionTask
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.fold import replay
from crashsafe.domain.missing_projections import replanned
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.registry import Registry
from crashsafe.services.operations.dead_letter_tasks import DeadLetters, Replanner
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal


async def replan_projection(
    broker: Broker, ns: Namespace, registry: Registry, run_id: str, key: str, now: datetime
) -> ProjectionTask | None:
    """The task of `key` as the run's journal plans it now; None if the journal no longer calls for it."""
    events, _ = await RunJournal(broker, ns).read(run_id)
    state = replay(events)
    agent = registry.agents.get(state.agent) if state is not None else None
    if state is None or agent is None:
        return None
    return replanned(plan(state, state.events, agent, registry.tools, now), key, run_id, now)


def replanner(broker: Broker, ns: Namespace, registry: Registry) -> Replanner:
    async def replan(dead: ProjectionTask) -> ProjectionTask | None:
        return await replan_projection(broker, ns, registry, dead.run_id, dead.key, datetime.now(UTC))

    return replan


def operator_letters(broker: Broker, ns: Namespace, registry: Registry) -> DeadLetters:
    """The dead letters as an operator's credential settles them: a dead projection replayed is planned again
    here (a process that may not publish projection tasks, the gateway's, builds `DeadLetters` without this)."""
    return DeadLetters(broker, ns, replanner(broker, ns, registry))
