"""Active runs per guest in the `{ns}_active` bucket: claimed by the gateway, released by the runtime.

A session needs no such record: its lane (`domain/session_lanes.py`) lets one run own it at a time, and a message
for a session whose run is under way is that run's next turn, capped per run. Each record is read and written with compare-and-set on its revision, so two gateway replicas admitting runs for
one guest at once never both take its last slot. Entries carry a deadline, so a run whose end is never recorded
(a runtime killed at the wrong moment) stops counting by itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from crashsafe.contracts.active import ActiveRuns, active_decoder, active_encoder
from crashsafe.contracts.errors import CrashsafeError, LeaseConflict, TooManyActiveRuns
from crashsafe.contracts.streams import active_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.record_ttls import active_ttl
from crashsafe.domain.run_state import RunState
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log

# Compare-and-set rounds before giving up on a record many writers fight over (each round is one read, one write).
MAX_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Caps:
    """How many runs of one guest may be under way at once; 0 for no cap."""

    per_guest: int


async def _update(
    broker: Broker, ns: Namespace, key: str, change: str, run_id: str, until: datetime, cap: int, limit: str
) -> bool:
    """Add (`change="add"`) or remove the run in one record; True if the record was written."""
    spec = active_spec(ns)
    for _ in range(MAX_ROUNDS):
        now = datetime.now(UTC)
        entry = await broker.kv_get(spec, key)
        record = active_decoder.decode(entry.value) if entry is not None and entry.value else ActiveRuns()
        live = record.live(now)
        if change == "add":
            if run_id in live:
                return False  # the same event again: it already counts, once
            if cap and len(live) >= cap:
                raise TooManyActiveRuns(limit=limit, cap=cap, retry_after_s=record.retry_after_s(now))
            updated = record.with_run(run_id, until, now)
        else:
            if run_id not in record.runs:
                return False
            updated = record.without_run(run_id, now)
        try:
            await broker.kv_write(
                spec,
                key,
                active_encoder.encode(updated),
                revision=entry.revision if entry else 0,
                ttl_s=active_ttl(updated, now, broker.retention.active_s),
            )
            return True
        except LeaseConflict:
            continue  # another writer moved it: read again
    raise LeaseConflict(key=key, expected_revision=0)


async def claim(
    broker: Broker,
    ns: Namespace,
    caps: Caps,
    *,
    tenant: str,
    guest_id: str,
    run_id: str,
    until: datetime,
) -> None:
    """Count a new run against its guest, or raise TooManyActiveRuns; the same run twice counts once."""
    key = ns.guest_active_key(tenant, guest_id)
    await _update(broker, ns, key, "add", run_id, until, caps.per_guest, "guest")


async def release_active(broker: Broker, ns: Namespace, state: RunState, logger: logging.Logger) -> None:
    """The runtime's hook once a run has ended: it no longer counts against its guest and session.

    A failure is logged, not raised: the entry stops counting at its deadline anyway, and the ended run's message
    must not be redelivered for a quota's sake."""
    tenant = state.started.tenant
    if not tenant:
        return  # a run admitted before tenants: never claimed
    now = datetime.now(UTC)
    try:
        await _update(
            broker, ns, ns.guest_active_key(tenant, state.guest_id), "remove", state.run_id, now, 0, ""
        )
    except CrashsafeError as exc:
        log(
            logger,
            logging.WARNING,
            "could not release an ended run's active slot",
            run_id=state.run_id,
            error=exc.code.value,
        )
