"""A session lane's compare-and-set on the real nats-server: two claimers (two gateways, or a gateway and a runtime)
that both read the lane free before either writes make one owner, and the other hears who it is."""

from __future__ import annotations

import asyncio
from typing import cast

from crashsafe.contracts.streams import KvSpec
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker, KvEntry
from crashsafe.services.records.session_lane_records import SessionRecords
from tests.support import inprocess
from tests.support.waiting import unique

TENANT = "t1"


class ReadsThenWaits:
    """The broker as one claimer sees it: its first read of the lane is answered, then waits until the other
    claimer has read the lane too, so both decide on the free lane before either writes."""

    def __init__(self, broker: Broker, key: str, both_read: asyncio.Barrier) -> None:
        self._broker = broker
        self._key = key
        self._both_read = both_read
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._broker, name)

    async def kv_get(self, spec: KvSpec, key: str) -> KvEntry | None:
        entry = await self._broker.kv_get(spec, key)
        if key == self._key:
            self.reads += 1
            if self.reads == 1:
                await asyncio.wait_for(self._both_read.wait(), timeout=10)
        return entry


async def test_two_claimers_that_both_read_the_free_lane_before_either_writes_make_one_owner(
    nats_server: NatsServer, broker: Broker, namespace: Namespace
) -> None:
    await inprocess.provisioned(inprocess.settings_for(nats_server.url, namespace))
    session = unique("s")
    both_read = asyncio.Barrier(2)
    views = [ReadsThenWaits(broker, namespace.session_key(TENANT, session), both_read) for _ in range(2)]
    claims = {unique("run_a"): unique("guest_a"), unique("run_b"): unique("guest_b")}

    owners = await asyncio.gather(
        *(
            SessionRecords(cast(Broker, view), namespace).claim(TENANT, session, run_id, guest)
            for view, (run_id, guest) in zip(views, claims.items(), strict=True)
        )
    )

    assert owners[0] == owners[1], f"both claimers won the session: {owners}"
    winner = owners[0]
    lane, revision = await SessionRecords(broker, namespace).get(TENANT, session)
    assert (lane.run_id, lane.guest_id) == (winner, claims[winner])
    assert revision == 1  # one write: the loser's was refused, and it wrote nothing after
    # The loser read the lane again after its write was refused, and found it taken.
    assert sorted(view.reads for view in views) == [1, 2]
