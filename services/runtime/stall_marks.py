"""The memory of a stalled loop: which run's agent code held the runtime's event loop when its watchdog ended the
process, kept where the next process to hold the run will look before it runs that agent's code again.

Without it the run's message came back after the ack wait to a fresh process, its agent blocked the new loop the
same way, and the runtime went down for every tenant once per delivery, about 20 times (issue 31, item 2). The
mark is written by the watchdog's own thread, on a connection of its own (the loop it would use is the one that
is stuck), in the few seconds before it ends the process; it is read once per run a process takes up from its
journal, and again for a redelivered message, so a healthy step pays nothing for it."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from crashsafe.contracts.active import StallMark, stall_decoder, stall_encoder
from crashsafe.contracts.streams import active_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings

log = logging.getLogger("crashsafe.runtime")
_WRITE_S = 3.0  # what the watchdog gives the mark before it ends the process anyway


async def read(broker: Broker, ns: Namespace, run_id: str) -> StallMark | None:
    entry = await broker.kv_get(active_spec(ns), ns.stalled_run_key(run_id))
    return stall_decoder.decode(entry.value) if entry is not None and entry.value else None


def record_blocking(settings: Settings, run_id: str, stalled_s: float, where: str) -> bool:
    """Write the run's stall mark from a thread that is not the stuck loop's: a loop and a connection of its own,
    at most `_WRITE_S`. Whether it was written (if not, the run may stall the next process too: logged)."""
    mark = StallMark(
        run_id=run_id,
        worker=settings.worker_id,
        stalled_s=round(stalled_s, 1),
        at=datetime.now(UTC),
        where=where[:500],
    )

    async def write() -> None:
        broker = await Broker.connect(
            settings.nats_url, f"runtime-{settings.worker_id}-watchdog", True, access=settings.nats_access
        )
        try:
            ns = settings.namespace
            await broker.kv_write(
                active_spec(ns), ns.stalled_run_key(run_id), stall_encoder.encode(mark), revision=None
            )
        finally:
            await broker.close()

    try:
        asyncio.run(asyncio.wait_for(write(), _WRITE_S))
    except Exception as exc:  # noqa: BLE001 -- the process ends next whatever happens: say why, then go
        log.critical("could not mark run %s as stalled: %s: %s", run_id, type(exc).__name__, exc)
        return False
    log.critical("run %s marked as stalled: no process drives its agent again", run_id)
    return True
