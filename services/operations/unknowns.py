"""Open unknown outcomes for an operator: what the console's reconciliation page lists and "ask again now" asks.

The same reading `reconcile_run` acts on (services/records/run_asks.py): an action whose journaled outcome is
unknown and not yet resolved by a later receipt, or one still pending when its run ended (a deadline)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from crashsafe.contracts.run_events import ActionRequested, JournalEvent, RunStarted
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.fold import replay
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal


@dataclass(frozen=True, slots=True)
class OpenUnknown:
    run_id: str
    tenant: str
    run_status: str
    request: ActionRequested
    # When the unknown was journaled (None: still pending at the run's end, never answered).
    since: datetime | None
    detail: str


def open_unknowns(
    journals: Mapping[str, list[JournalEvent]], sees: Callable[[str], bool]
) -> list[OpenUnknown]:
    """Every open unknown in the runs a client sees, oldest run first."""
    out: list[OpenUnknown] = []
    for run_id, events in journals.items():
        first = events[0] if events else None
        if not isinstance(first, RunStarted) or not sees(first.tenant):
            continue
        state = replay(events)
        if state is None:
            continue
        for request, done in state.completed:
            if done.status == OutcomeStatus.UNKNOWN:
                detail = done.error.message if done.error else "the provider's answer could not be trusted"
                out.append(OpenUnknown(run_id, first.tenant, state.status, request, done.at, detail))
        if state.terminal:
            for request in state.pending:
                detail = "still in flight when the run ended; never answered"
                out.append(OpenUnknown(run_id, first.tenant, state.status, request, None, detail))
    return sorted(out, key=lambda u: (u.request.at, u.run_id, u.request.step_no))


async def unknowns_in(broker: Broker, ns: Namespace, sees: Callable[[str], bool]) -> list[OpenUnknown]:
    """Every open unknown of the runs a client sees, read from every journal (whole: not for a hot path). The
    journals are let go on return; only the open unknowns are kept."""
    return open_unknowns(await RunJournal(broker, ns).read_all(), sees)
