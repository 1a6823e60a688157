"""A takeover judges "asked before the takeover" by the request's own time, not by when the key reaches the new
owner: a key asked of the old owner and delivered to the new one long after the takeover (a redelivery that
waited out its ack, a consumer that lagged) is still looked up by key before any call. Real executor replicas
leasing on the real nats-server, the sandbox as the provider."""

from __future__ import annotations

import asyncio
import contextlib

from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.tool_messages import Asked
from tests.integration import test_partition_leases as leases
from tests.integration.test_partition_leases import PARTITIONS, Replicas
from tests.support import inprocess
from tests.support.waiting import eventually

# The replicas of test_partition_leases.py, lent to this module under the same fixture name.
replicas = leases.replicas


async def test_a_key_asked_before_the_takeover_is_looked_up_however_late_it_reaches_the_new_owner(
    replicas: Replicas,
) -> None:
    a = await replicas.replica("pay-a")
    request = await replicas.payment()
    await replicas.world.arm("payments", drop_after_commit=1)
    await replicas.world.arm("lookups", fail_5xx=10_000)
    asked = asyncio.create_task(inprocess.deliver(a, request, deliveries=1))

    async def charged_and_open() -> bool:
        record = await a.stores[partition_of(request.key, PARTITIONS)].get(request.key)
        return (await replicas.world.counts())["charge"] == 1 and record is not None and record.attempts >= 1

    await eventually(charged_and_open, what="a's charge at the provider, its outcome unknown to a")
    await a.close()  # the pod goes away; its volume does not come with the partition
    asked.cancel()
    with contextlib.suppress(BaseException):
        await asked
    await replicas.world.clear_faults()

    b = await replicas.replica("pay-b")  # an empty data dir of its own: a takeover
    assert b.partitions == [0, 1, 2, 3]
    # The key reaches b well past the takeover and its clock-skew allowance: by b's clock it is "after", by the
    # request's own time it was asked of a.
    await asyncio.sleep(replicas.settings("pay-b").clock_skew_s + 1.0)
    await inprocess.deliver(b, request, deliveries=2)

    outcome = await replicas.outcome(request.key)
    assert outcome.status == "succeeded" and outcome.via == "provider_lookup"
    assert [e.asked for e in outcome.evidence] == [Asked.PROVIDER_LOOKUP]
    ledger = await replicas.world.ledger()
    assert ledger["counts"]["charge"] == 1 and ledger["replays"].get("charge", 0) == 0
