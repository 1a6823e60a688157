"""Every write of the action store is fenced by the partition's lease, not only the intent: a replica whose lease ran
out while a call was in flight writes no receipt, no attempt and no unknown mark (the next owner resolves the key
by lookup). Real executor replicas leasing on the real nats-server, the sandbox as the provider."""

from __future__ import annotations

import asyncio
import time

import pytest

from crashsafe.contracts.errors import PartitionNotOwned
from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus, RecordStatus
from crashsafe.services.executor.service import Executor
from tests.integration import test_partition_leases as leases
from tests.integration.test_partition_leases import PARTITIONS, Replicas
from tests.support import inprocess
from tests.support.waiting import eventually

# The replicas of test_partition_leases.py, lent to this module under the same fixture name.
replicas = leases.replicas


async def _stop_renewing(replica: Executor, partition: int) -> None:
    """Renewals stop (as in a process paused past its lease); returns once the fence has closed by the local clock."""
    assert replica.keeper._loop_task is not None
    replica.keeper._loop_task.cancel()
    await eventually(
        lambda: replica.keeper.tenures[partition].valid_until < time.monotonic(),
        what="the lease to run out",
        every_s=0.05,
    )


async def test_a_call_answered_after_the_lease_ran_out_leaves_no_receipt(replicas: Replicas) -> None:
    """The intent commits under the lease; the provider answers (it charged) only after the lease ran out: the
    receipt is not written and nothing is published, so the message comes back to the partition's next owner,
    which asks the provider by key. A receipt written here could race that owner's."""
    a = await replicas.replica("pay-a")
    request = await replicas.payment()
    store = a.stores[partition_of(request.key, PARTITIONS)]
    await replicas.world.arm("payments", latency_ms=3_500)
    delivery = asyncio.create_task(inprocess.deliver(a, request, deliveries=1))
    await eventually(lambda: store.get(request.key), what="the intent committed", every_s=0.01)
    await _stop_renewing(a, partition_of(request.key, PARTITIONS))

    with pytest.raises(PartitionNotOwned):
        await delivery
    await replicas.world.arm("payments")
    assert (await replicas.world.counts())["charge"] == 1  # the provider did act
    record = await store.get(request.key)
    assert record is not None
    assert (record.status, record.outcome) == (RecordStatus.STARTED, None)
    assert [o for o in replicas.outcomes if o.key == request.key] == []


async def test_a_replica_whose_lease_ran_out_writes_no_attempt_unknown_mark_or_receipt(
    replicas: Replicas,
) -> None:
    a = await replicas.replica("pay-a")
    request = await replicas.payment()
    partition = partition_of(request.key, PARTITIONS)
    store = a.stores[partition]
    assert await store.begin(request, stream_seq=1)  # under the lease
    await _stop_renewing(a, partition)

    receipt = ActionOutcome(
        run_id=request.run_id,
        step_no=request.step_no,
        key=request.key,
        tool=request.tool,
        status=OutcomeStatus.SUCCEEDED,
        result={"payment_id": "pay_1"},
        attempts=2,
    )
    with pytest.raises(PartitionNotOwned):
        await store.attempt(request.key, 2, sent_at=time.time())
    with pytest.raises(PartitionNotOwned):
        await store.mark_unknown(request.key)
    with pytest.raises(PartitionNotOwned):
        await store.finish(receipt, stream_seq=2)
    record = await store.get(request.key)
    assert record is not None
    assert (record.status, record.attempts, record.outcome) == (RecordStatus.STARTED, 1, None)
