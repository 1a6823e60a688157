"""Asks any service or operator may send over JetStream: resolve this key by asking its executor, wake this run."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from contracts.errors import RunNotFound
from contracts.run_events import ActionRequested, request_for
from contracts.tool_messages import OutcomeStatus, RunWake, tool_encoder
from services.platform.jetstream import Broker
from services.platform.journal import RunJournal
from services.platform.logs import log
from services.platform.settings import Settings
from services.platform.tracing import context_from, headers_for
from services.runtime.core.fold import replay

logger = logging.getLogger("crashsafe.asks")


async def ask_to_resolve(broker: Broker, settings: Settings, intent: ActionRequested, by: str) -> None:
    """Send the journaled request to the executor that owns its key: it answers from its receipt, or asks the provider by key."""
    subject = settings.namespace.actions_for_key(intent.family, intent.key, settings.partitions)
    # A fresh message id: this ask must reach the executor even inside the duplicate window of the original.
    await broker.publish(
        subject,
        tool_encoder.encode(request_for(intent)),
        msg_id=f"resolve:{intent.key}:{uuid.uuid4().hex}",
        headers=headers_for(context_from(None)),
    )
    log(
        logger,
        logging.INFO,
        "asked executor to resolve",
        run_id=intent.run_id,
        key=intent.key,
        step_no=intent.step_no,
        by=by,
    )


async def wake_run(
    broker: Broker, settings: Settings, run_id: str, reason: str, by: str, keys: list[str] | None = None
) -> None:
    wake = RunWake(run_id=run_id, reason=reason, at=datetime.now(UTC), by=by, keys=keys or [])
    await broker.publish(settings.namespace.outcomes(run_id), tool_encoder.encode(wake))
    log(logger, logging.INFO, "woke run", run_id=run_id, reason=reason, by=by)


@dataclass(frozen=True, slots=True)
class Reconciliation:
    run_id: str
    status: str
    asked: list[str]


async def reconcile_run(broker: Broker, settings: Settings, run_id: str, by: str) -> Reconciliation:
    """Manual reconciliation of one run: resolve each open action by key, then wake the run to continue."""
    events = [e for _, e in await RunJournal(broker, settings.namespace).read_with_seqs(run_id)]
    state = replay(events)
    if state is None:
        raise RunNotFound(f"no run {run_id} to reconcile", run_id=run_id)
    if state.terminal:
        # An ended run may still hold unknown outcomes, or actions pending when it handed off (a deadline): ask
        # by key, so its journal learns what really happened (and a late failure is still compensated).
        unknown = [req for req, done in state.completed if done.status == OutcomeStatus.UNKNOWN]
        unknown += list(state.pending)
        for request in unknown:
            await ask_to_resolve(broker, settings, request, by)
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
    for request in state.pending:
        await ask_to_resolve(broker, settings, request, by)
    await wake_run(
        broker, settings, run_id, f"manual reconciliation by {by}", by, [p.key for p in state.pending]
    )
    return Reconciliation(run_id, state.status, [p.key for p in state.pending])
