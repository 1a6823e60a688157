"""Holds this replica's share of a family's partitions: membership, leases and their renewal, and the fence."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from crashsafe.contracts.errors import BrokerUnavailable, CrashsafeError, LeaseConflict, PartitionNotOwned
from crashsafe.contracts.streams import leases_spec
from crashsafe.domain.partition_ownership import (
    Acquire,
    Holder,
    Holding,
    Lease,
    Member,
    Release,
    Renew,
    Slot,
    Tenure,
    desired,
    fenced,
    holder_decoder,
    lease_decoder,
    lease_encoder,
    member_decoder,
    plan,
    takeover,
    tenure_after_write,
)
from crashsafe.services.executor.partition_epochs import PartitionEpochs
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings

Acquired = Callable[[int, int], Awaitable[None]]  # (partition, fencing token): open its store, subscribe
Released = Callable[[int], Awaitable[None]]  # partition: unsubscribe, let its keys finish, close its store

# The first lease round is retried this many times, 0.25 s apart (a new R3 bucket electing its leader).
FIRST_ROUND_ATTEMPTS = 40


class PartitionKeeper:
    """Every `lease_s / 3`: renew this replica's member key and leases, release what it should no longer hold,
    take what it should and nobody holds. A partition is acted on only while `check` passes."""

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        family: str,
        incarnation: str,
        logger: logging.Logger,
        *,
        acquired: Acquired,
        released: Released,
    ) -> None:
        self.broker = broker
        self.ns = settings.namespace
        self.spec = leases_spec(self.ns, settings.stream_replicas)
        self.family = family
        self.me = settings.worker_id
        self.incarnation = incarnation
        self.partitions = settings.partitions
        # An explicit list is leased too (two replicas given overlapping lists never both act), but not shared.
        self.static = None if settings.shared_partitions else settings.owned_partitions
        self.lease_s = settings.lease_s
        # Stop acting this long before the server could expire the lease: covers a write in flight and a stall.
        self.margin_s = max(settings.lease_s / 5, 0.5)
        self.logger = logger
        self._acquired = acquired
        self._released = released
        self.epochs = PartitionEpochs(broker, self.ns, family, settings.stream_replicas)
        self.tenures: dict[int, Tenure] = {}
        self._acquired_at: dict[int, float] = {}
        self._releasing: dict[int, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._owned_gauges = [metrics.LEASE_OWNED.labels(family, str(p)) for p in range(settings.partitions)]

    def report(self) -> None:
        """crashsafe_partition_lease_owned: 1 for each partition this replica may act on now, else 0."""
        now = time.monotonic()
        for p, gauge in enumerate(self._owned_gauges):
            gauge.set(1 if fenced(self.tenures.get(p), now) is None else 0)

    @property
    def held(self) -> list[int]:
        return sorted(self.tenures)

    def holding(self, partition: int) -> Holding:
        """Where this replica's writes for `partition` stand in its fencing order ((0, 0) if it does not hold it:
        every fenced write then refuses)."""
        tenure = self.tenures.get(partition)
        return tenure.holding if tenure is not None else Holding(0, 0)

    def check(self, partition: int, key: str | None = None) -> None:
        """The fence: raise unless this replica may still write for `partition` (by the local monotonic clock)."""
        why = fenced(self.tenures.get(partition), time.monotonic())
        if why is not None:
            raise PartitionNotOwned(family=self.family, partition=partition, key=key, why=why)

    async def previous(self, partition: int) -> Holder | None:
        """The partition's holder record: which store held it last (None: no store ever did, under leases)."""
        entry = await self.broker.kv_get(self.spec, self.ns.holder_key(self.family, partition))
        return holder_decoder.decode(entry.value) if entry is not None else None

    async def hold(
        self, store: ActionStore, partition: int, token: int, restored: bool = False
    ) -> tuple[Holder | None, bool]:
        """Make `store` the partition's holder under `token`: read the previous holder (a takeover if it was
        another store, or `store` was just restored from a backup), record the tenure in the store, fence its
        writes, and write the holder record."""
        holder = await self.previous(partition)
        taken = restored or takeover(holder, store.store_id)
        epoch = self.holding(partition).epoch
        await store.record_tenure(token, self.me, holder.store if holder else None, taken, epoch)
        store.fence = functools.partial(self.check, partition)
        record = Holder(store=store.store_id, owner=self.me, token=token, epoch=epoch)
        await self.broker.kv_write(
            self.spec, self.ns.holder_key(self.family, partition), lease_encoder.encode(record), revision=None
        )
        return holder, taken

    async def start(self) -> None:
        await self.broker.require_stream(self.spec.stream)  # the operator made the bucket (`infra apply`)
        # Take what is free now; what others hold comes later, without holding up start-up. A bucket just created
        # on a cluster answers 503 until its stream has elected a leader: the first round waits for that.
        for attempt in range(FIRST_ROUND_ATTEMPTS):
            try:
                await self.tick()
                break
            except BrokerUnavailable:
                if attempt == FIRST_ROUND_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.25)
        self._loop_task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        """Hand every partition back (after its keys finish) and leave, so the others take over at once.

        The lease loop stops by a flag, not by cancellation alone: on Python 3.11 a `wait_for` whose inner wait
        completes as the task is cancelled swallows the cancel (gh-86296; a lease round's direct get waits in one),
        and the loop then ran on and this close waited for it forever (a test teardown under load hung on it)."""
        self._closing = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        async with self._lock:
            for p in list(self.tenures):
                if p not in self._releasing:
                    self._releasing[p] = asyncio.create_task(self._release(p))
            tasks = list(self._releasing.values())
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.static is None:
            try:
                await self.broker.kv_delete(self.spec, self.ns.member_key(self.family, self.me))
            except BrokerUnavailable:
                pass  # the member key's TTL removes it anyway

    async def _loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.lease_s / 3)
            if self._closing:
                return
            try:
                await self.tick()
            except CrashsafeError as exc:
                log(
                    self.logger,
                    logging.WARNING,
                    "lease round failed",
                    error=exc.code.value,
                    detail=exc.message,
                )
                self.report()  # a lease not renewed runs out by the local clock: say so, NATS or not

    async def tick(self) -> None:
        async with self._lock:
            if self.static is None:
                member = Member(worker=self.me, incarnation=self.incarnation)
                await self.broker.kv_write(
                    self.spec,
                    self.ns.member_key(self.family, self.me),
                    lease_encoder.encode(member),
                    revision=None,
                    ttl_s=self.lease_s,
                )
                entries = await self.broker.kv_scan(self.spec, self.ns.members_of(self.family))
                members = [member_decoder.decode(e.value).worker for e in entries]
            else:
                members = []
            want = desired(self.me, members, self.partitions, self.static)
            slots: dict[int, Slot] = {}
            for entry in await self.broker.kv_scan(self.spec, self.ns.leases_of(self.family)):
                slots[int(entry.key.rsplit(".", 1)[1])] = Slot(
                    entry.revision, lease_decoder.decode(entry.value)
                )
            for move in plan(self.me, self.incarnation, want, self.tenures, slots):
                match move:
                    case Renew(partition=p):
                        await self._renew(p)
                    case Release(partition=p):
                        # Keep renewing while its keys finish; the release task frees the lease after them.
                        await self._renew(p)
                        if p in self.tenures and p not in self._releasing:
                            self._releasing[p] = asyncio.create_task(self._release(p))
                    case Acquire(partition=p, revision=revision) if p not in self._releasing:
                        # (one still being put down after a loss is taken again next round, not over it)
                        await self._acquire(p, revision)
            self.report()

    def _lease(self, partition: int, owner: str) -> bytes:
        now = time.time()
        acquired_at = self._acquired_at.get(partition, now)
        return lease_encoder.encode(
            Lease(owner=owner, incarnation=self.incarnation, acquired_at=acquired_at, renewed_at=now)
        )

    async def _acquire(self, partition: int, revision: int) -> None:
        started = time.monotonic()
        self._acquired_at[partition] = time.time()
        key = self.ns.lease_key(self.family, partition)
        try:
            token = await self.broker.kv_write(
                self.spec, key, self._lease(partition, self.me), revision=revision, ttl_s=self.lease_s
            )
            epoch = await self.epochs.count(partition, self.me, token)
            # The lease must still be the one written above once its epoch is counted: an epoch counted for a
            # lease of a bucket deleted meanwhile would stand above the holder of the new one. A compare-and-set
            # asks the stream's leader (a direct get may be answered by a replica that lags).
            token = await self.broker.kv_write(
                self.spec, key, self._lease(partition, self.me), revision=token, ttl_s=self.lease_s
            )
        except LeaseConflict:
            return  # another replica got there first (the TTL frees a lease written before that was found out)
        holding = Holding(epoch, token)
        self.tenures[partition] = tenure_after_write(partition, holding, started, self.lease_s, self.margin_s)
        try:
            await self._acquired(partition, token)
        except Exception:
            self.logger.exception(
                "could not take up an acquired partition; handing it back",
                extra={"fields": {"partition": partition}},
            )
            await self._released(partition)
            await self._free(partition)
            return
        log(
            self.logger,
            logging.INFO,
            "partition acquired",
            family=self.family,
            partition=partition,
            token=token,
            epoch=epoch,
        )

    async def _renew(self, partition: int) -> None:
        tenure = self.tenures.get(partition)
        if tenure is None:
            return
        started = time.monotonic()
        key = self.ns.lease_key(self.family, partition)
        try:
            token = await self.broker.kv_write(
                self.spec, key, self._lease(partition, self.me), revision=tenure.token, ttl_s=self.lease_s
            )
        except LeaseConflict:
            # Expired and taken (or expired while this replica was paused): stop at once, the fence already holds.
            self.tenures.pop(partition, None)
            self.report()
            log(self.logger, logging.WARNING, "partition lease lost", family=self.family, partition=partition)
            if partition not in self._releasing:
                self._releasing[partition] = asyncio.create_task(self._let_go(partition))
            return
        except BrokerUnavailable as exc:
            # The lease runs out by the local clock unless a later renewal lands; the fence needs nothing more.
            log(self.logger, logging.WARNING, "lease renewal failed", partition=partition, detail=exc.message)
            return
        if partition in self.tenures:
            self.tenures[partition] = tenure_after_write(
                partition, Holding(tenure.epoch, token), started, self.lease_s, self.margin_s
            )

    async def _release(self, partition: int) -> None:
        try:
            await self._released(partition)
        finally:
            async with self._lock:
                await self._free(partition)
                self._releasing.pop(partition, None)
        log(self.logger, logging.INFO, "partition released", family=self.family, partition=partition)

    async def _let_go(self, partition: int) -> None:
        try:
            await self._released(partition)
        finally:
            self._releasing.pop(partition, None)

    async def _free(self, partition: int) -> None:
        tenure = self.tenures.pop(partition, None)
        if tenure is None:
            return
        self.report()
        try:
            await self.broker.kv_write(
                self.spec,
                self.ns.lease_key(self.family, partition),
                self._lease(partition, ""),
                revision=tenure.token,
                ttl_s=self.lease_s,
            )
        except (LeaseConflict, BrokerUnavailable):
            pass  # lost meanwhile, or the TTL frees it
