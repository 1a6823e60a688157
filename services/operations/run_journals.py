"""One run's journal as an operator reads it (`crashsafe runs show`, the console's pages), and the runs that
reconciliation asks about (`crashsafe reconcile`, the console's "ask again now"). Every run's listing: run_index.py."""

from __future__ import annotations

from crashsafe.contracts.keys import is_run_id
from crashsafe.contracts.run_events import JournalEvent, RunStarted, decode_event
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.fold import replay
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_asks import Reconciliation, reconcile_run
from crashsafe.services.records.run_journal import RunJournal

# One run reconciled: the function the gateway's POST /v1/runs/{id}/reconcile calls too (services/platform/asks.py).
__all__ = ["Reconciliation", "reconcile_run", "run_journal", "runs_to_reconcile", "tenant_of_run"]


async def run_journal(broker: Broker, ns: Namespace, run_id: str) -> list[tuple[int, JournalEvent]]:
    """The run's events with their stream sequences, in order; empty for a run that does not exist. An event type
    a newer writer added comes back as an `UnknownEvent`, kept, never an error."""
    return await RunJournal(broker, ns).read_with_seqs(run_id)


async def tenant_of_run(broker: Broker, ns: Namespace, run_id: str) -> str | None:
    """The tenant a run belongs to, from its first event alone; None for no such run (or no run id at all)."""
    if not is_run_id(run_id):
        return None
    first = await RunJournal(broker, ns).first(run_id)
    started = decode_event(first.data) if first is not None else None
    return started.tenant if isinstance(started, RunStarted) else None


async def runs_to_reconcile(broker: Broker, ns: Namespace) -> list[str]:
    """Open runs, and ended runs that left an action pending at hand-off (a deadline passed under it)."""
    journals = await RunJournal(broker, ns).read_all()
    return [
        run_id
        for run_id, events in journals.items()
        if (s := replay(events)) is not None and (not s.terminal or s.pending)
    ]
