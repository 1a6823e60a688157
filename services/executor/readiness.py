"""What an executor's /readyz asks, afresh each time (partitions move): NATS and its streams, its member record or
its listed leases, each held partition's store and consumer, and its seams (its outcomes land in OUTCOMES, no
partition's consumer is of another shape); and the consumer lag its /metrics samples."""

from __future__ import annotations

import functools
import time

from crashsafe.contracts.stream_routes import executor_routes
from crashsafe.contracts.streams import ConsumerSpec, executor_consumer
from crashsafe.domain.partition_ownership import fenced, member_decoder
from crashsafe.services.executor.partitions import PartitionKeeper
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform import probes, seam_checks
from crashsafe.services.platform.jetstream import Broker, Subscription
from crashsafe.services.platform.provisioning import executor_streams
from crashsafe.services.platform.settings import Settings


class ExecutorReadiness:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        family: str,
        keeper: PartitionKeeper,
        incarnation: str,
        stores: dict[int, ActionStore],
        subscriptions: dict[int, Subscription],
        max_deliver: int,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.ns = settings.namespace
        self.family = family
        self.keeper = keeper
        self.incarnation = incarnation
        # The executor's own maps (the same dicts): what it holds now.
        self.stores = stores
        self.subscriptions = subscriptions
        self.max_deliver = max_deliver

    def checks(self) -> dict[str, probes.Check]:
        """Readiness, asked afresh each time (partitions move): NATS and its streams; in shared mode its member
        record alive, with an explicit list each listed partition's lease held; every held partition's store
        answering and its consumer present; its seams."""
        checks = probes.basic_checks(self.broker, executor_streams(self.ns))
        keeper = self.keeper
        if keeper.static is None:
            checks["member"] = self._member_alive
        else:
            for p in keeper.static:
                checks[f"lease:{p}"] = functools.partial(self._lease_held, p)
        for p, store in sorted(self.stores.items()):
            checks[f"store:{p}"] = functools.partial(_store_answers, store)
        checks.update(self.seams())
        checks.update(seam_checks.consumer_checks(self.broker, self.consumers()))
        return checks

    def seams(self) -> dict[str, probes.Check]:
        """What it must prove before it takes any partition: its outcomes (the receipt path) and dead letters land
        in the streams it expects, and no partition's consumer is of another shape (one not made yet is made
        when its partition is taken)."""
        every = [self._consumer(p) for p in range(self.settings.partitions)]
        return {
            **seam_checks.route_checks(self.broker, executor_routes(self.ns, self.family)),
            **seam_checks.consumer_checks(self.broker, every, required=False),
        }

    def samplers(self) -> list[probes.Sampler]:
        return [probes.lag_sampler(self.broker, self.consumers)]

    def consumers(self) -> list[ConsumerSpec]:
        """The durables of the partitions it holds now."""
        return [self._consumer(p) for p in sorted(self.subscriptions)]

    def _consumer(self, partition: int) -> ConsumerSpec:
        s = self.settings
        return executor_consumer(self.ns, self.family, partition, s.ack_wait_s, self.max_deliver, s.lease_s)

    async def _member_alive(self) -> str | None:
        keeper = self.keeper
        entry = await self.broker.kv_get(keeper.spec, self.ns.member_key(self.family, keeper.me))
        if entry is None:
            return f"member record of {keeper.me} expired (lease rounds not landing)"
        if member_decoder.decode(entry.value).incarnation != self.incarnation:
            return f"member record of {keeper.me} belongs to another process life"
        return None

    async def _lease_held(self, partition: int) -> str | None:
        why = fenced(self.keeper.tenures.get(partition), time.monotonic())
        if why is not None:
            return f"partition {partition}: {why}"
        if partition not in self.subscriptions:
            return f"partition {partition}: lease held, store and consumer still being taken up"
        return None


async def _store_answers(store: ActionStore) -> str | None:
    await store.ping()
    return None
