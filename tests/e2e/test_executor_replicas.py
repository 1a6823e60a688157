"""Payment executor replicas as real processes started the same way (`crashsafe serve executor --tool payment`):
one SIGKILLed and the other takes its partitions; one SIGSTOPped past its lease and resumed commits nothing."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionRequest, Via
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from tests.support.payment_replicas import LEASE_S, PARTITIONS, Payments, owners, payment_world
from tests.support.waiting import eventually
from tests.support.world import Sandbox


@pytest.fixture
async def world(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[tuple[Sandbox, Payments, Callable[..., Any]]]:
    async with payment_world(nats_server, broker, namespace, tmp_path) as made:
        yield made


async def test_a_killed_replicas_partitions_move_to_the_survivor_within_seconds(
    world: tuple[Sandbox, Payments, Callable[[str], Any]], broker: Broker, namespace: Namespace
) -> None:
    sandbox, payments, start = world
    # Exactly the same environment, one data dir too (one host): a store proves itself by its id, so the
    # partitions move between the two without a takeover's lookups.
    a = await start("a", "shared")
    b = await start("b", "shared")

    def split(held: dict[int, str]) -> bool:
        return len(held) == PARTITIONS and set(held.values()) == {a.worker_id, b.worker_id}

    held = await eventually(
        lambda: _when(owners(broker, namespace), split), what="a and b to split the partitions", timeout_s=30
    )
    assert sorted(held.values()).count(a.worker_id) == 2  # two each

    b.proc.kill()  # SIGKILL: no hand-back; its leases have to run out
    killed = time.monotonic()
    await eventually(
        lambda: _when(owners(broker, namespace), lambda h: set(h.values()) == {a.worker_id} and len(h) == 4),
        what="a to hold every partition",
        timeout_s=30,
    )
    moved_s = time.monotonic() - killed
    assert moved_s < LEASE_S + 5, f"the partitions took {moved_s:.1f}s to move"

    requests: list[ActionRequest] = []
    while {partition_of(r.key, PARTITIONS) for r in requests} != set(range(PARTITIONS)) or len(requests) < 8:
        requests.append(await payments.request(f"guest-{len(requests)}"))  # keys in every partition, b's too
    for request in requests:
        await payments.publish(request)
    for request in requests:
        await eventually(
            lambda r=request: payments.of(r.key), what=f"an outcome for {request.key}", timeout_s=30
        )
    assert all(payments.of(r.key)[0].status == "succeeded" for r in requests)
    assert all([e.asked for e in payments.of(r.key)[0].evidence] == ["provider.call"] for r in requests)
    assert (await sandbox.counts())["charge"] == len(requests)


async def test_a_replica_paused_past_its_lease_and_resumed_commits_nothing(
    world: tuple[Sandbox, Payments, Callable[[str], Any]], broker: Broker, namespace: Namespace
) -> None:
    """z sends four charges to a slow provider and is SIGSTOPped before the answers come; b takes the
    partitions (with its own empty data dir) and settles the keys by lookup; z, resumed, finds its lease gone."""
    sandbox, payments, start = world
    z = await start("z")
    await eventually(
        lambda: _when(owners(broker, namespace), lambda h: len(h) == 4), what="z to hold every partition"
    )
    requests = [await payments.request(f"guest-{i}") for i in range(4)]
    await sandbox.arm("payments", latency_ms=4000)
    for request in requests:
        await payments.publish(request)
    keys = {r.key for r in requests}
    await eventually(lambda: keys <= set(z.rows()), what="z to commit the four intents", every_s=0.02)
    await asyncio.sleep(1.0)  # and to send the calls (on a loaded machine one may still be on its way)
    z.proc.send_signal(signal.SIGSTOP)

    # The provider commits what z sent while z is stopped; the answers wait in z's socket.
    await asyncio.sleep(4.5)
    called_by_z = (await sandbox.counts())["charge"]
    assert called_by_z >= 1
    await sandbox.clear_faults()
    b = await start("b")
    await eventually(
        lambda: _when(owners(broker, namespace), lambda h: set(h.values()) == {b.worker_id} and len(h) == 4),
        what="b to hold every partition",
        timeout_s=30,
    )
    assert z.proc.returncode is None  # z is alive, only stopped: its leases ran out, it handed nothing back
    for request in requests:
        await eventually(
            lambda r=request: payments.of(r.key), what=f"b's outcome for {request.key}", timeout_s=30
        )
    settled_by_b = {o.key: o for o in payments.outcomes}
    assert all(o.status == "succeeded" for o in settled_by_b.values())
    # b asked by key first for every key z may have acted on: found the ones z's calls reached.
    assert [o.via for o in settled_by_b.values()].count(Via.PROVIDER_LOOKUP) == called_by_z
    assert all(o.evidence[0].asked == "provider.lookup" for o in settled_by_b.values())

    published_before = len(payments.outcomes)
    z.proc.send_signal(signal.SIGCONT)
    # z reads the four stale answers at once and tries to commit their receipts; the fence refuses. A second is
    # far less than z would need to be given a partition again (b must see it, release, and z's next round).
    await asyncio.sleep(1.0)
    z.proc.kill()
    await z.proc.wait()

    assert all(status == "started" for key, status in z.rows().items() if key in keys), z.rows()
    assert "partition_not_owned" in z.log()  # the fence refused the stale receipts
    assert len(payments.outcomes) == published_before  # z published no outcome either
    ledger = await sandbox.ledger()
    assert ledger["counts"]["charge"] == 4
    assert ledger["replays"].get("charge", 0) == 0  # one call per key: b asked by key, z never called again


async def _when(value: Any, ok: Callable[[Any], bool]) -> Any:
    got = await value
    return got if ok(got) else None
