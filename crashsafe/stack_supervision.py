"""Kubernetes' restart loop over a stack's processes: each with its own back-off, nats-server included."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from crashsafe.stack_processes import SINGLE_PORT, Backoff

if TYPE_CHECKING:
    from crashsafe.stack import Stack


async def supervise(stack: Stack, stop: asyncio.Event, backoff_s: float | None = None) -> None:
    """Restart whatever it started that died, nats-server included, as Kubernetes restarts a crashed pod.

    Each process gets its own back-off (`stack.backoff`: at once after a long life, then 0.2 s doubling to
    10 s while it keeps dying within 10 s of its start), so one crash-looping service neither spins nor
    delays the others' restarts.
    `backoff_s` overrides the base delay.
    """
    policy = (
        stack.backoff
        if backoff_s is None
        else Backoff(backoff_s, stack.backoff.cap_s, stack.backoff.stable_s)
    )
    nats_restart: asyncio.Task[None] | None = None
    # Restarted without waiting: stack.json gets each one's new ops URL once it printed it.
    unannounced: set[str] = set()
    while not stop.is_set():
        now = time.monotonic()
        if unannounced and (known := {n for n in unannounced if stack.ops_url(n) is not None}):
            unannounced -= known
            stack.write_state()
        for service in stack._supervised():
            if service is stack.nats_supervision and nats_restart is not None and not nats_restart.done():
                continue  # starting: waiting for its readiness must not hold up the other restarts
            if service.stopped or service.process is None or service.process.poll() is None:
                service.restart_at = None  # alive (or restarted by hand): nothing pending
                continue
            if service.restart_at is None:
                service.delay_s = policy.next(service.delay_s, now - service.started_at)
                service.restart_at = now + service.delay_s
            elif now >= service.restart_at:
                service.restart_at = None
                if service is stack.nats_supervision:
                    nats_restart = asyncio.create_task(restart_nats(stack))
                else:
                    stack.restart(service.name, wait=False)
                    if service.name not in SINGLE_PORT:
                        unannounced.add(service.name)
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.05)
        except TimeoutError:
            pass
    if nats_restart is not None:
        await nats_restart


async def restart_nats(stack: Stack) -> None:
    """The same port and file store: clients reconnect to the URL they know, and nothing acked is lost."""
    assert stack.nats is not None
    service = stack.nats_supervision
    service.restarts += 1
    try:
        await asyncio.to_thread(stack.nats.start)
    except RuntimeError:
        # It died again while starting (or never got ready): the next round backs off further.
        service.started_at = time.monotonic()
        service.process = stack.nats.process
        return
    stack._track_nats()
    stack.write_state()
