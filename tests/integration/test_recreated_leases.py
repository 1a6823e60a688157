"""A leases bucket deleted and made again (an operator's `nats kv rm` then `infra apply`, a restore, a new cluster)
numbers its revisions from 1 again, and a lease's revision is the token the key facts are fenced by. The facts
must keep ordering their writers across it: a holder of the new bucket may write a shared key whose facts a
holder of the old one wrote under a far higher revision, and an old holder still alive, with a lease it believes
valid, is refused once a holder of the new bucket has written. Real executor replicas on the real nats-server,
the sandbox as the provider."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import pytest

from crashsafe.contracts.errors import PartitionNotOwned
from crashsafe.contracts.keys import CompensationKind, business_key, compensation_key, partition_of
from crashsafe.contracts.streams import leases_spec
from crashsafe.contracts.tool_messages import ActionRequest, OutcomeStatus
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.partition_epochs import PartitionEpochs
from crashsafe.services.executor.partitions import PartitionKeeper
from crashsafe.services.executor.service import Executor
from crashsafe.services.platform.jetstream import Broker
from tests.integration import test_partition_leases as leases
from tests.integration.test_partition_leases import PARTITIONS, Replicas
from tests.support import inprocess
from tests.support.broker import ensure_streams
from tests.support.waiting import eventually

# The replicas of test_partition_leases.py, lent to this module under the same fixture name.
replicas = leases.replicas

# Months of renewals, in a moment: the old bucket's revisions run this far ahead of a new one's.
OLD_WRITES = 300


async def _age_the_bucket(broker: Broker, replicas: Replicas) -> None:
    await ensure_streams(broker, replicas.ns)  # as the operator, before any executor starts
    spec = leases_spec(replicas.ns)
    for _ in range(OLD_WRITES):
        await broker.kv_write(spec, "aged.by.renewals", b"{}", revision=None)


async def _recreate_the_bucket(broker: Broker, replicas: Replicas) -> None:
    """`nats kv rm <ns>_leases` then `crashsafe infra apply`, as the operator."""
    spec = leases_spec(replicas.ns)
    await broker.js.delete_stream(spec.stream)
    await broker.ensure_kv(spec)


async def _holds_everything(replica: Executor) -> None:
    await eventually(
        lambda: replica.partitions == list(range(PARTITIONS)) or None,
        what=f"{replica.settings.worker_id} to hold every partition",
        timeout_s=20.0,
    )


def _hold(replicas: Replicas, guest: str) -> ActionRequest:
    """A hold asked under its business key: shared by every run that asks it, so it has facts from its first ask."""
    request = replicas.book(guest)
    return msgspec.structs.replace(request, key=business_key("hold", "t1", dict(request.args)))


async def test_a_holder_of_a_recreated_bucket_may_still_write_a_key_an_old_holder_wrote(
    replicas: Replicas, broker: Broker
) -> None:
    """The hold was made under a lease revision of the old bucket; after the bucket is made again, its new holder
    releases it. Before: the release's 'undone' mark on the hold was refused as written by a newer holder
    (PartitionNotOwned, retried until its dead letter), and so was every later write of every key the old bucket's
    holders had written: the release's receipt was never stored, the run never heard it."""
    await _age_the_bucket(broker, replicas)
    a = await replicas.replica("book-a", family="booking")
    hold = _hold(replicas, "guest-old")
    await inprocess.deliver(a, hold, 1)
    made = await replicas.outcome(hold.key)
    assert made.status == OutcomeStatus.SUCCEEDED
    book = FactBook(broker, replicas.ns, "booking")
    written, _ = await book.read(hold.key)
    assert written is not None and written.token > OLD_WRITES
    await a.close()

    await _recreate_the_bucket(broker, replicas)
    b = await replicas.replica("book-b", family="booking")  # a data dir of its own
    await _holds_everything(b)
    partition = partition_of(hold.key, PARTITIONS)
    assert b.keeper.tenures[partition].token < written.token, "the new bucket's revisions did not restart"

    release = msgspec.structs.replace(
        replicas.request("release_booking", "booking", {"booking_id": made.result["booking_id"]}),
        key=compensation_key(hold.key, CompensationKind.RELEASE),
    )
    await inprocess.deliver(b, release, 1)
    released = await replicas.outcome(release.key)
    assert released.status == OutcomeStatus.SUCCEEDED
    undone, _ = await book.read(hold.key)
    assert undone is not None and undone.undone_by == release.key

    # Another run asking the same hold is told it was undone, never handed the released booking as held.
    again = msgspec.structs.replace(hold, run_id=replicas.run_id + "x", step_no=99)
    await inprocess.deliver(b, again, 1)
    answer = await eventually(
        lambda: next((o for o in replicas.outcomes if o.run_id == again.run_id), None),
        what="the other run's answer",
    )
    assert (answer.status, answer.error and answer.error.code) == (OutcomeStatus.FAILED, "action_undone")


async def test_an_old_holder_still_alive_is_refused_once_a_holder_of_the_recreated_bucket_wrote(
    replicas: Replicas, broker: Broker
) -> None:
    """a holds every partition of the old bucket and is paused (no renewal notices the bucket went) while its lease
    is still valid by its own clock; b takes the partitions of the new bucket and makes a hold. a's write of the
    hold's facts must be refused, though a's lease revision is far above b's. Before: a's higher revision won,
    and it overwrote the facts of the partition's real holder."""
    await _age_the_bucket(broker, replicas)
    a = await replicas.replica("book-a", family="booking")
    await _holds_everything(a)
    assert a.keeper._loop_task is not None
    a.keeper._loop_task.cancel()  # paused: its tenures stay as they were
    await asyncio.gather(a.keeper._loop_task, return_exceptions=True)

    await _recreate_the_bucket(broker, replicas)
    b = await replicas.replica("book-b", family="booking")
    await _holds_everything(b)
    hold = _hold(replicas, "guest-new")
    await inprocess.deliver(b, hold, 1)
    assert (await replicas.outcome(hold.key)).status == OutcomeStatus.SUCCEEDED
    book = FactBook(broker, replicas.ns, "booking")
    written, _ = await book.read(hold.key)
    assert written is not None

    partition = partition_of(hold.key, PARTITIONS)
    assert a.keeper.tenures[partition].token > b.keeper.tenures[partition].token
    stale_store = a.stores[partition]
    stale_store.fence = lambda: None  # a believes its lease valid: only the facts can stop it now
    with pytest.raises(PartitionNotOwned):
        await a.records.attempted(stale_store, hold, 2, time.time())
    assert (await book.read(hold.key))[0] == written


async def test_an_acquisition_whose_bucket_is_made_again_before_its_epoch_is_counted_takes_nothing(
    replicas: Replicas, broker: Broker
) -> None:
    """The lease went to the old bucket; the bucket was made again and a holder of the new one counted its epoch
    first, so this acquisition's epoch, counted after, stands above that holder's. It must not act on a lease of
    a bucket that is gone: its second compare-and-set on the lease, after the count, finds that out, and the
    partition is taken in the new bucket at a later round instead."""
    await ensure_streams(broker, replicas.ns)
    taken: list[tuple[int, int]] = []

    async def acquired(partition: int, token: int) -> None:
        taken.append((partition, token))

    async def released(partition: int) -> None:
        pass

    keeper = PartitionKeeper(
        broker,
        replicas.settings("book-a"),
        "booking",
        "life-1",
        logging.getLogger("test"),
        acquired=acquired,
        released=released,
    )
    real_count = keeper.epochs.count
    raced: list[int] = []

    async def count_after_the_bucket_went(partition: int, owner: str, token: int) -> int:
        if not raced:
            raced.append(partition)
            await _recreate_the_bucket(broker, replicas)
            # b takes the partition in the new bucket and counts its epoch first.
            await PartitionEpochs(broker, replicas.ns, "booking").count(partition, "book-b", 1)
        return await real_count(partition, owner, token)

    keeper.epochs.count = count_after_the_bucket_went  # type: ignore[method-assign]
    await keeper.tick()
    try:
        assert raced and raced[0] not in keeper.tenures and raced[0] not in dict(taken)
        for partition, tenure in keeper.tenures.items():  # the others were taken in the new bucket
            entry = await broker.kv_get(leases_spec(replicas.ns), replicas.ns.lease_key("booking", partition))
            assert entry is not None and entry.revision == tenure.token
    finally:
        await keeper.close()
