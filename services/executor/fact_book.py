"""The key-facts bucket as the executor uses it: read a key's facts, create them once, change them by
compare-and-set, and never write from below the last writer in the fencing order (the fence, in the bucket)."""

from __future__ import annotations

from collections.abc import Callable

from crashsafe.contracts.errors import LeaseConflict, PartitionNotOwned
from crashsafe.contracts.streams import key_facts_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.key_facts import KeyFacts, facts_decoder, facts_encoder, stale
from crashsafe.domain.partition_ownership import Holding
from crashsafe.services.platform.jetstream import Broker

# Compare-and-set rounds before giving up (retry later): two writers of one key are only ever an old holder
# and a new one, so a second round already sees who won.
_ROUNDS = 4


class FactBook:
    """One family's key facts (`fact.<family>.<digest(key)>`)."""

    def __init__(self, broker: Broker, ns: Namespace, family: str, replicas: int = 1) -> None:
        self.broker = broker
        self.ns = ns
        self.family = family
        self.spec = key_facts_spec(ns, replicas)

    async def read(self, key: str) -> tuple[KeyFacts | None, int]:
        """The key's facts and their revision (0: none yet)."""
        entry = await self.broker.kv_get(self.spec, self.ns.key_facts_key(self.family, key))
        if entry is None:
            return None, 0
        return facts_decoder.decode(entry.value), entry.revision

    async def first(self, facts: KeyFacts, fence: Callable[[], None]) -> KeyFacts | None:
        """Record a first ask unless the key has facts already; returns those facts (None: these are the first)."""
        fence()
        subject = self.ns.key_facts_key(self.family, facts.key)
        try:
            await self.broker.kv_write(self.spec, subject, facts_encoder.encode(facts), revision=0)
            return None
        except LeaseConflict:
            known, _ = await self.read(facts.key)
            return known

    async def change(
        self,
        key: str,
        change: Callable[[KeyFacts | None], KeyFacts | None],
        holding: Holding,
        fence: Callable[[], None],
        partition: int,
    ) -> None:
        """Apply `change` to the key's current facts (None: none yet) and write the result by compare-and-set;
        `change` returning None writes nothing. A value written from above `holding` (a later epoch, or a later
        lease token of the same one) means this replica lost the partition: PartitionNotOwned, nothing written."""
        subject = self.ns.key_facts_key(self.family, key)
        for _ in range(_ROUNDS):
            current, revision = await self.read(key)
            if stale(current, holding):
                raise PartitionNotOwned(
                    family=self.family,
                    partition=partition,
                    key=key,
                    why="a newer holder wrote the key's facts",
                )
            changed = change(current)
            if changed is None:
                return
            fence()
            try:
                await self.broker.kv_write(
                    self.spec, subject, facts_encoder.encode(changed), revision=revision
                )
                return
            except LeaseConflict:
                continue
        raise LeaseConflict(key=subject, expected_revision=revision)

    async def seal(
        self, key: str, ttl_s: int, holding: Holding, fence: Callable[[], None], partition: int
    ) -> bool:
        """Write the key's facts again as they are, with a TTL: a backup of the store now holds what they say
        (fact_seals.py). False if there are none, or they changed since read (the change has no TTL: kept)."""
        subject = self.ns.key_facts_key(self.family, key)
        entry = await self.broker.kv_get(self.spec, subject)
        if entry is None:
            return False
        if stale(facts_decoder.decode(entry.value), holding):
            raise PartitionNotOwned(
                family=self.family, partition=partition, key=key, why="a newer holder wrote the key's facts"
            )
        fence()
        try:
            await self.broker.kv_write(self.spec, subject, entry.value, revision=entry.revision, ttl_s=ttl_s)
        except LeaseConflict:
            return False
        return True
