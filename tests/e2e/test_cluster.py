"""A three-node JetStream cluster, every stream at R3: one node SIGKILLed under booking load and brought back on
its own store. No accepted run is lost and no provider effect happens twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.streams import StreamSpec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.natsd import NatsCluster, NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess
from crashsafe.stack import EXECUTOR_FAMILIES
from tests.support.nats_users import admit
from tests.support.stack import StackClient, open_stack, operator_access, supervised
from tests.support.waiting import eventually
from tests.support.world import effects_per_run


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    # Ports are picked free and bound a moment later by three processes: another process can take one in
    # between. A cluster that could not start is started once more on fresh ports (its logs stay for reading).
    first = NatsCluster(tmp_path / "cluster", size=3, families=EXECUTOR_FAMILIES)
    try:
        started = await asyncio.to_thread(first.start)
        admit(started)
    except RuntimeError:
        await asyncio.to_thread(first.stop)
        started = await asyncio.to_thread(
            NatsCluster(tmp_path / "cluster-again", size=3, families=EXECUTOR_FAMILIES).start
        )
        admit(started)
    try:
        yield started
    finally:
        await asyncio.to_thread(started.stop)


async def _runs_leader(broker: Broker, ns: Namespace) -> str:
    info = await broker.js.stream_info(ns.stream(StreamKind.RUNS))
    assert info.config.num_replicas == 3 and info.cluster is not None and info.cluster.leader
    return info.cluster.leader


async def test_r3_cluster_loses_a_node_under_load(tmp_path: Path, cluster: NatsCluster) -> None:
    env = {"CRASHSAFE_STREAM_REPLICAS": "3", "CRASHSAFE_ACK_WAIT_S": "1"}
    async with open_stack(tmp_path / "stack", nats_url=cluster.url, env=env) as client:
        broker = await Broker.connect(cluster.url, "cluster-test", access=operator_access(client.stack))
        try:
            # The gateway's buckets (API keys, active runs) are replicated like the streams: a node lost is no outage.
            for bucket in (client.ns.clients_bucket, client.ns.active_bucket):
                assert (await broker.js.stream_info(f"KV_{bucket}")).config.num_replicas == 3
            async with supervised(client.stack):
                await _load_with_a_node_killed(client, broker, cluster)
        finally:
            await broker.close()


async def _load_with_a_node_killed(client: StackClient, broker: Broker, cluster: NatsCluster) -> None:
    guests = [f"guest-a{i}" for i in range(15)]
    first = [asyncio.create_task(client.submit(guest_id=g)) for g in guests]
    run_ids = list(await asyncio.gather(*first))

    async def under_way() -> bool:
        going = 0
        for run_id in run_ids[:5]:
            try:
                going += len(await client.events(run_id)) >= 3
            except httpx.HTTPStatusError:  # not journaled yet
                pass
        return going >= 3

    await eventually(under_way, what="the first runs to get going", every_s=0.05)
    # The leader of the journal stream: losing it forces an election while runs append to it.
    victim = cluster.node(await _runs_leader(broker, client.ns))
    # Read before the kill: while the stream elects a new leader the gateway rightly answers 503 (retry later).
    still_running = [r for r in run_ids if ((await client.summary(r)) or {}).get("status") == "running"]
    victim.kill()
    assert still_running, "the node must die under load, with runs mid-flight"
    # Runs keep arriving while the cluster is one node short.
    guests += [f"guest-b{i}" for i in range(10)]
    run_ids += await asyncio.gather(*(client.submit(guest_id=g) for g in guests[15:]))
    await asyncio.to_thread(victim.start)  # back on its port and its own store, as a rescheduled pod
    guests += [f"guest-c{i}" for i in range(5)]
    run_ids += await asyncio.gather(*(client.submit(guest_id=g) for g in guests[25:]))
    summaries = await asyncio.gather(*(client.wait_terminal(r, timeout_s=90) for r in run_ids))

    assert Counter(s["status"] for s in summaries) == {"completed": len(run_ids)}, summaries
    entries = (await client.ledger())["entries"]
    per_key = Counter(e["key"] for e in entries)
    assert [k for k, n in per_key.items() if n > 1] == [], "no provider effect twice"
    effects = effects_per_run(entries, dict(zip(guests, run_ids, strict=True)))
    for run_id in run_ids:
        assert effects[run_id].get("booking") == 1 and effects[run_id].get("charge") == 1, effects[run_id]

    # The node that came back catches up: both followers of the journal are current again.
    async def caught_up() -> bool:
        info = await broker.js.stream_info(client.ns.stream(StreamKind.RUNS))
        followers = (info.cluster.replicas or []) if info.cluster else []
        return len(followers) == 2 and all(f.current and not f.offline for f in followers)

    await eventually(caught_up, what=f"{victim.server_name} to catch up on the journal", timeout_s=30)


async def test_provisioning_waits_for_a_cluster_that_cannot_place_replicas_yet(tmp_path: Path) -> None:
    """Two of three nodes up, the third not yet: an R3 stream has no three peers to go on (as right after a
    cluster starts, before every peer reported in). Provisioning neither takes "no suitable peers" for "exists"
    (and fails updating a stream that is not there) nor gives up at once: it waits, bounded, and says why."""
    cluster = NatsCluster(tmp_path / "cluster", size=3, families=EXECUTOR_FAMILIES)
    assert cluster.auth is not None
    routes = tuple(free_port() for _ in range(3))
    cluster.nodes = [
        NatsServer(
            tmp_path / "cluster" / f"n{i}",
            port=free_port(),
            server_name=f"n{i}",
            cluster_name=cluster.name,
            cluster_port=routes[i],
            routes=tuple(p for j, p in enumerate(routes) if j != i),
            auth=cluster.auth,
        )
        for i in range(3)
    ]
    late = cluster.nodes[2]
    try:
        for node in cluster.nodes[:2]:
            node.spawn()
        for node in cluster.nodes[:2]:
            await asyncio.to_thread(node.await_ready, 30.0)
        await asyncio.to_thread(cluster.await_meta_leader, 30.0)
        broker = await Broker.connect(
            cluster.nodes[0].url, "placement-test", access=NatsAccess(creds=cluster.auth.creds(Role.OPERATOR))
        )
        try:
            # The metadata leader answers before anything is asked of placement: a leader elected a moment ago
            # on a loaded machine may let the first request go unanswered (a timeout, not "no suitable peers").
            await broker.ensure_stream(StreamSpec(name="WARM_R1", subjects=("warm.>",), replicas=1))
            await broker.js.delete_stream("WARM_R1")
            spec = StreamSpec(name="PLACEMENT_R3", subjects=("placement.>",), replicas=3)
            broker.placement_wait_s = 1.0
            with pytest.raises(BrokerUnavailable, match="cannot place PLACEMENT_R3's replicas"):
                await broker.ensure_stream(spec)
            assert not await broker.stream_exists("PLACEMENT_R3")
            # The third node comes up while provisioning waits: the stream is placed on all three.
            broker.placement_wait_s = 30.0
            late.spawn()
            await broker.ensure_stream(spec)
            info = await broker.js.stream_info("PLACEMENT_R3")
            assert info.config.num_replicas == 3
        finally:
            await broker.close()
    finally:
        await asyncio.to_thread(cluster.stop)
