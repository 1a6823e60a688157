"""Counts each acquisition of a partition in the key-facts bucket: the epoch that orders the partition's holders,
kept beside the facts it fences so that a leases bucket made again (lease tokens from 1 again) cannot reorder them."""

from __future__ import annotations

import time

from crashsafe.contracts.errors import LeaseConflict
from crashsafe.contracts.streams import key_facts_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.partition_ownership import PartitionEpoch, epoch_decoder, lease_encoder, next_epoch
from crashsafe.services.platform.jetstream import Broker

# Compare-and-set rounds: two replicas count the same partition's epoch at once only while both try to take it.
_ROUNDS = 4


class PartitionEpochs:
    """One family's partition epochs (`fact.<family>.epoch-<partition>`)."""

    def __init__(self, broker: Broker, ns: Namespace, family: str, replicas: int = 1) -> None:
        self.broker = broker
        self.ns = ns
        self.family = family
        self.spec = key_facts_spec(ns, replicas)

    async def count(self, partition: int, owner: str, token: int) -> int:
        """The epoch of an acquisition just written under lease revision `token`: above every earlier one's."""
        key = self.ns.partition_epoch_key(self.family, partition)
        revision = 0
        for _ in range(_ROUNDS):
            entry = await self.broker.kv_get(self.spec, key)
            revision = entry.revision if entry is not None else 0
            epoch = next_epoch(epoch_decoder.decode(entry.value) if entry is not None else None, time.time())
            value = lease_encoder.encode(PartitionEpoch(epoch=epoch, owner=owner, token=token))
            try:
                await self.broker.kv_write(self.spec, key, value, revision=revision)
                return epoch
            except LeaseConflict:
                continue
        raise LeaseConflict(key=key, expected_revision=revision)
