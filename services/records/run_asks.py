"""Asks any service or operator may send over JetStream: wake this run, and have it resolve these keys.

Only the runtime publishes action requests (it alone holds the signing key): an ask names the keys, and the
runtime re-sends their journaled requests with a fresh capability."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from opentelemetry.context import Context

from crashsafe.contracts.errors import RunNotFound
from crashsafe.contracts.tool_messages import OutcomeStatus, RunWake, tool_encoder
from crashsafe.domain.fold import replay
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import headers_for
from crashsafe.services.records.run_journal import RunJournal

logger = logging.getLogger("crashsafe.asks")


async def wake_run(
    broker: Broker,
    settings: Settings,
    run_id: str,
    reason: str,
    by: str,
    keys: list[str] | None = None,
    ctx: Context | None = None,
) -> None:
    """Ask the runtime to re-fold the run and go on; each of `keys` (journaled actions) it re-sends to its executor,
    which answers from its receipt or asks the provider by key. `ctx`: the asker's trace, carried on the wake."""
    wake = RunWake(run_id=run_id, reason=reason, at=datetime.now(UTC), by=by, keys=keys or [])
    headers = headers_for(ctx) if ctx is not None else None
    await broker.publish(settings.namespace.wakes(run_id), tool_encoder.encode(wake), headers=headers)
    log(logger, logging.INFO, "woke run", run_id=run_id, reason=reason, by=by, keys=len(wake.keys))


@dataclass(frozen=True, slots=True)
class Reconciliation:
    run_id: str
    status: str
    asked: list[str]


async def reconcile_run(broker: Broker, settings: Settings, run_id: str, by: str) -> Reconciliation:
    """Manual reconciliation of one run: wake it naming each open action, so the runtime has them resolved by
    key and continues."""
    events = [e for _, e in await RunJournal(broker, settings.namespace).read_with_seqs(run_id)]
    state = replay(events)
    if state is None:
        raise RunNotFound(f"no run {run_id} to reconcile", run_id=run_id)
    if state.terminal:
        # An ended run may still hold unknown outcomes, or actions pending when it handed off (a deadline): ask
        # by key, so its journal learns what really happened (and a late failure is still compensated).
        unknown = [req for req, done in state.completed if done.status == OutcomeStatus.UNKNOWN]
        unknown += list(state.pending)
        if unknown:
            await wake_run(
                broker,
                settings,
                run_id,
                f"manual reconciliation of unknown outcomes by {by}",
                by,
                [r.key for r in unknown],
            )
        return Reconciliation(run_id, state.status, [r.key for r in unknown])
    await wake_run(
        broker, settings, run_id, f"manual reconciliation by {by}", by, [p.key for p in state.pending]
    )
    return Reconciliation(run_id, state.status, [p.key for p in state.pending])
