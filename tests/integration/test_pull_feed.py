"""A partition's pull feed, on a real nats-server: it stops when told, even while messages pour in, and hands
nothing to its handler afterwards (a feed that kept asking once held a released partition forever)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.aio.msg import Msg

from contracts.streams import executor_consumer
from contracts.subjects import Namespace
from services.platform.jetstream import Broker
from services.platform.provisioning import provision


async def test_a_feed_stops_at_once_under_a_steady_stream_and_hands_nothing_over_after(
    broker: Broker, namespace: Namespace
) -> None:
    await provision(broker, namespace)
    spec = executor_consumer(namespace, "payment", 0, ack_wait_s=1.0, lease_s=1)
    await broker.ensure_consumer(spec)
    subject = namespace.actions("payment", 0)

    async def pour() -> None:
        n = 0
        while True:
            await broker.publish(subject, b"{}", msg_id=f"m{n}")
            n += 1
            await asyncio.sleep(0.001)

    pouring = asyncio.create_task(pour())
    stopped = False
    after_stop: list[Msg] = []
    handled = 0

    async def handle(msg: Msg) -> None:
        nonlocal handled
        if stopped:
            after_stop.append(msg)
        handled += 1
        await msg.ack()

    try:
        slowest = 0.0
        for _ in range(15):
            stopped = False
            subscription = await broker.subscribe(spec, handle)
            before = handled
            deadline = time.monotonic() + 10
            while handled < before + 20 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert handled >= before + 20, "the feed handed over nothing"
            began = time.monotonic()
            await broker.unsubscribe(subscription)
            stopped = True
            slowest = max(slowest, time.monotonic() - began)
            await asyncio.sleep(0.05)
        assert slowest < 1.0, f"a stop took {slowest:.2f}s"
        assert after_stop == []
    finally:
        pouring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pouring
