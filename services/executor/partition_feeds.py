"""What a held partition pulls: its requests on ACTIONS and, since the journal became the bus (issue 33), the
intents journaled for it; both opened when its lease is taken up and closed when it is put down."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from crashsafe.contracts.streams import ConsumerSpec, executor_consumer, executor_journal_consumer
from crashsafe.services.platform.deliveries import Deliveries
from crashsafe.services.platform.jetstream import Broker, Subscription
from crashsafe.services.platform.settings import Settings

Handler = Callable[[Msg], Awaitable[None]]


class PartitionFeeds:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        family: str,
        max_deliver: int,
        deliveries: Deliveries,
        on_request: Handler,
        on_intent: Handler,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.family = family
        self.max_deliver = max_deliver
        self.deliveries = deliveries
        self.handlers = (on_request, on_intent)
        self.requests: dict[int, Subscription] = {}  # readiness samples and checks these
        self.intents: dict[int, Subscription] = {}

    def specs(self, partition: int) -> tuple[ConsumerSpec, ConsumerSpec]:
        s, ns = self.settings, self.settings.namespace
        shape = (s.ack_wait_s, self.max_deliver, s.lease_s)
        return (
            executor_consumer(ns, self.family, partition, *shape),
            executor_journal_consumer(ns, self.family, partition, *shape),
        )

    async def open(self, partition: int) -> None:
        for spec, handler, held in zip(
            self.specs(partition), self.handlers, (self.requests, self.intents), strict=True
        ):
            await self.broker.ensure_consumer(spec)
            held[partition] = await self.broker.subscribe(
                spec, self.deliveries.dispatch(handler), room=self.deliveries.room
            )

    async def close(self, partition: int) -> None:
        for held in (self.requests, self.intents):
            if (subscription := held.pop(partition, None)) is not None:
                await self.broker.unsubscribe(subscription)
