"""A pull feed, on a real nats-server: it stops when told, even while messages pour in, and hands nothing to its
handler afterwards (a feed that kept asking once held a released partition forever); it asks for no more messages
than its handlers have room for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, cast

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import executor_consumer, projector_planner_consumer, runtime_consumers
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.deliveries import Deliveries
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.platform.pull_feed import PullFeed
from tests.support.nats_users import access
from tests.support.waiting import eventually


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


class _SwallowingClient:
    """The real NATS client, except that a cancel landing inside `publish` is swallowed once, as nats-py's own
    `_flush_pending` does (`except asyncio.CancelledError: pass`) and as 3.11's `wait_for` can (gh-86296). It
    counts the pull requests sent, and says when one is being sent so a stop can land right there."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self.pull_requests = 0
        self.publishing = asyncio.Event()
        self.swallowed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nc, name)

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", **kw: Any) -> None:
        self.publishing.set()
        try:
            await asyncio.sleep(0.2)  # a flush in progress
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1
        self.publishing.clear()
        self.pull_requests += 1
        await self._nc.publish(subject, payload, reply=reply, **kw)


async def test_a_feed_whose_cancel_is_swallowed_still_stops_at_once_and_asks_for_nothing_more(
    broker: Broker, namespace: Namespace
) -> None:
    """The stop's cancel lands inside the client's publish, which swallows it: the feed must still end at once,
    by its own flag, and send no further pull request (one that kept asking would take messages for an inbox
    nobody reads, each lost for an ack wait, and hold its partition's release)."""
    await provision(broker, namespace)
    spec = executor_consumer(namespace, "payment", 0, ack_wait_s=1.0, lease_s=1)
    await broker.ensure_consumer(spec)
    handled: list[Msg] = []
    after_stop: list[Msg] = []
    stopped = False

    async def handle(msg: Msg) -> None:
        (after_stop if stopped else handled).append(msg)
        await msg.ack()

    client = _SwallowingClient(broker.nc)
    feed = PullFeed(cast(Client, client), spec, handle)
    await feed.start()
    await broker.publish(namespace.actions("payment", 0), b"{}", msg_id="before-stop")
    while not handled:  # the feed works: the message is handed over
        await asyncio.sleep(0.01)
    await asyncio.wait_for(client.publishing.wait(), timeout=5)  # the next pull request is being sent

    try:
        began = time.monotonic()
        await feed.stop()
        stopped = True
        took = time.monotonic() - began
        assert client.swallowed == 1  # the cancel did land in the publish, and was swallowed there
        asked = client.pull_requests
        await asyncio.sleep(spec.pull_expires_s + 1.0)  # long enough for a feed that kept going to ask again
        assert took < 1.0, f"the stop took {took:.2f}s"
        assert feed._task is not None and feed._task.done()
        assert client.pull_requests == asked, "the feed kept asking after its stop"
        assert after_stop == []
    finally:
        if feed._task is not None and not feed._task.done():  # a feed that failed to stop: end it (cancels
            feed._task.cancel()  # are no longer swallowed) so the broker can close
            await asyncio.wait({feed._task}, timeout=5.0)


async def test_a_feed_asks_only_for_what_its_handlers_have_room_for_the_rest_waits_on_the_server(
    broker: Broker, namespace: Namespace
) -> None:
    """Flow control (issue 17): with 3 handlers busy, the runtime's inbound feed holds 3 messages, not a batch
    buffered in its client behind a callback waiting for a free handler (which nats-py dropped as a slow consumer
    under a flood); the rest waits on the server, and every message is handled once as handlers free up."""
    await provision(broker, namespace)
    inbound = runtime_consumers(namespace, ack_wait_s=1.0)[0]
    await broker.ensure_consumer(inbound)
    for n in range(40):
        await broker.publish(namespace.inbound(f"run_{n:024x}"), b"{}", msg_id=f"m{n}")
    deliveries = Deliveries(
        broker, namespace, "runtime", logging.getLogger("test"), max_deliver=20, ack_wait_s=1.0, concurrency=3
    )
    gate = asyncio.Event()
    in_hand: set[str] = set()
    handled: list[str] = []

    async def handle(msg: Msg) -> None:
        in_hand.add(msg.subject)
        await gate.wait()
        in_hand.discard(msg.subject)
        handled.append(msg.subject)

    subscription = await broker.subscribe(inbound, deliveries.dispatch(handle), room=deliveries.room)
    try:
        await eventually(lambda: len(in_hand) == 3, what="three handlers busy")
        await asyncio.sleep(0.5)  # time for a batch to arrive, were one asked for
        info = await broker.js.consumer_info(inbound.stream, inbound.durable)
        assert (len(in_hand), info.num_ack_pending, info.num_pending) == (3, 3, 37)
        gate.set()
        await eventually(lambda: len(handled) == 40, what="every message handled", timeout_s=30)
        assert len(set(handled)) == 40
    finally:
        gate.set()
        await broker.unsubscribe(subscription)
        await deliveries.drain()


async def test_replicas_that_declare_a_durable_with_a_start_time_at_once_all_start(
    broker: Broker, namespace: Namespace, nats_server: NatsServer
) -> None:
    """Two projector replicas started in the same instant (a rollout, a stack forking its services) each declare
    the planner's durable with a start time: the one that loses the race takes the winner's start, and never
    exits on the server's "start time can not be updated" (it did, once the stack started services together)."""
    await provision(broker, namespace)
    spec = projector_planner_consumer(namespace)
    for _ in range(5):
        replicas = [
            await Broker.connect(
                nats_server.url, f"replica-{n}", access=access(nats_server.url, Role.PROJECTOR)
            )
            for n in range(4)
        ]
        try:
            await asyncio.gather(*(replica.ensure_consumer(spec) for replica in replicas))
        finally:
            for replica in replicas:
                await replica.close()
        assert (await broker.js.consumer_info(spec.stream, spec.durable)).config.opt_start_time is not None
        await broker.js.delete_consumer(spec.stream, spec.durable)


@pytest.mark.parametrize("partitions", [16, 64])
async def test_every_partition_of_a_shared_room_keeps_a_request_on_the_server_and_is_served_after_a_quiet_spell(
    broker: Broker, namespace: Namespace, partitions: int
) -> None:
    """Issue 31: an executor's partition feeds share one room of 512 handlers. Each feed once asked for a full
    batch and took its room back the moment an empty request expired, so the first 8 feeds kept all of it and the
    others never asked the server again: their messages sat there. Every feed must keep a request waiting, and a
    message on any partition after a quiet spell must be handled within a couple of seconds."""
    await provision(broker, namespace)
    deliveries = Deliveries(
        broker, namespace, "executor_payment", logging.getLogger("test"), max_deliver=12, ack_wait_s=1.0
    )
    specs = [executor_consumer(namespace, "payment", p, ack_wait_s=1.0, lease_s=1) for p in range(partitions)]
    handled: set[str] = set()

    async def handle(msg: Msg) -> None:
        handled.add(msg.subject)

    subscriptions = []
    for spec in specs:
        await broker.ensure_consumer(spec)
        subscriptions.append(await broker.subscribe(spec, deliveries.dispatch(handle), room=deliveries.room))
    try:
        await asyncio.sleep(4 * specs[0].pull_expires_s)  # a quiet spell: every request expires empty, twice
        # A feed is between two requests for a moment after each expiry: a partition counts as asked if one of a
        # few looks finds its request (before the fix, 8 of 16 and 56 of 64 had none at any look).
        unasked = set(range(partitions))
        for _ in range(3):
            waiting = [
                (await broker.js.consumer_info(spec.stream, spec.durable)).num_waiting for spec in specs
            ]
            unasked -= {p for p, n in enumerate(waiting) if n}
            await asyncio.sleep(0.1)
        assert not unasked, f"{len(unasked)} of {partitions} partitions have no pull request on the server"
        for p in range(partitions):
            await broker.publish(namespace.actions("payment", p), b"{}", msg_id=f"quiet-{p}")
        # A couple of seconds, with slack for a loaded machine; before the fix half of them never came.
        await eventually(
            lambda: len(handled) == partitions, what="a message on every partition handled", timeout_s=3.0
        )
    finally:
        for subscription in subscriptions:
            await broker.unsubscribe(subscription)
        await deliveries.drain()
