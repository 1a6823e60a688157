"""Payment executor replicas scaled under a steady load of payment requests, as real processes started the same way
(`crashsafe serve executor --tool payment`, CRASHSAFE_PARTITIONS left at `all`): 2 -> 3 (a third replica joins and
the leases split three ways), then 3 -> 1 (one SIGTERMed, one SIGKILLed). Every key is charged exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.tool_messages import ActionRequest, Answer, Asked, Via, runtime_message_decoder
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from tests.support.payment_replicas import PARTITIONS, Payments, owners, payment_world
from tests.support.waiting import eventually
from tests.support.world import Sandbox

PACE_S = 0.25  # one payment request every quarter second or so, for the whole test
PER_PHASE = 8  # requests published at least in each phase: 2 replicas, 2 -> 3, 3 -> 1, and the survivor alone


@pytest.fixture
async def world(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[tuple[Sandbox, Payments, Callable[..., Any]]]:
    async with payment_world(nats_server, broker, namespace, tmp_path) as made:
        yield made


async def test_scaling_replicas_up_and_down_under_load_charges_every_key_once(
    world: tuple[Sandbox, Payments, Callable[..., Any]], broker: Broker, namespace: Namespace
) -> None:
    sandbox, payments, start = world
    # Exactly the same environment, one data dir too (one host), as Deployment pods sharing a volume would be.
    a = await start("a", "shared")
    b = await start("b", "shared")
    await held_by(broker, namespace, {a.worker_id, b.worker_id}, "a and b to split the partitions")

    published: list[ActionRequest] = []
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            request = await payments.request(f"guest-{len(published)}")
            await payments.publish(request)
            published.append(request)
            with contextlib.suppress(TimeoutError):  # the pace of the load, not a wait for anything
                await asyncio.wait_for(stop.wait(), PACE_S)

    async def published_since(mark: int, what: str) -> None:
        await eventually(lambda: len(published) >= mark + PER_PHASE, what=f"{PER_PHASE} requests {what}")

    loader = asyncio.create_task(load())
    try:
        await published_since(0, "with two replicas")
        await no_key_charged_twice(sandbox)

        # 2 -> 3: the third replica joins; the others hand it its share once they see its member key.
        c = await start("c", "shared")
        mark = len(published)
        await held_by(
            broker, namespace, {a.worker_id, b.worker_id, c.worker_id}, "a, b and c to share the partitions"
        )
        await published_since(mark, "while c joins")
        await no_key_charged_twice(sandbox)

        # 3 -> 1: b is stopped (hands its partitions back after its keys finish), c is killed (its leases run out).
        b.proc.send_signal(signal.SIGTERM)
        c.proc.kill()
        mark = len(published)
        await held_by(broker, namespace, {a.worker_id}, "a to hold every partition", timeout_s=30)
        assert await asyncio.wait_for(b.proc.wait(), timeout=30) == 0, b.log()
        assert await asyncio.wait_for(c.proc.wait(), timeout=10) == -signal.SIGKILL
        await published_since(mark, "while b stops and c's leases run out")
        await published_since(len(published), "with a alone")
    finally:
        stop.set()
        await loader

    keys = [r.key for r in published]
    assert {partition_of(k, PARTITIONS) for k in keys} == set(range(PARTITIONS))
    await eventually(
        lambda: all(payments.of(k) for k in keys),
        what=f"an outcome for each of {len(keys)} keys",
        timeout_s=30,
    )
    assert (await owners(broker, namespace)) == dict.fromkeys(range(PARTITIONS), a.worker_id)

    # The outcomes stream (what the runtime reads) holds an outcome for every key and nothing else, all
    # `succeeded`. Outcomes carry no message id (another publisher could reserve a predictable one and silence
    # them), so the store's receipt sent again is stored again: every copy of a key must be the same receipt.
    stored = await broker.read_subject(namespace.stream(StreamKind.OUTCOMES), namespace.outcomes_all)
    outcomes = [runtime_message_decoder.decode(m.data) for m in stored]
    assert sorted({o.key for o in outcomes}) == sorted(keys)
    assert all(o.status == "succeeded" for o in outcomes), [o for o in outcomes if o.status != "succeeded"]
    refs: dict[str, set[str | None]] = {}
    for o in outcomes:
        refs.setdefault(o.key, set()).add(o.provider_ref)
    assert all(len(r) == 1 for r in refs.values()), {k: r for k, r in refs.items() if len(r) > 1}
    # Every copy seen on the wire is one receipt: the first settling, then only the store's receipt sent again
    # (a redelivery answered from the store, a partition taken up republishing its recent receipts).
    for key in keys:
        seen = payments.of(key)
        settled = [o for o in seen if not any(e.asked == Asked.STORE_RECEIPT for e in o.evidence)]
        assert len(settled) == 1, (key, seen)
        assert {o.status for o in seen} == {"succeeded"}, (key, seen)
        first = settled[0]
        if first.via == Via.PROVIDER_LOOKUP:
            # An intent a replica left open (killed, or fenced): settled by asking by key before any call.
            assert first.evidence[0].asked == Asked.PROVIDER_LOOKUP, first
        else:
            assert first.via == Via.CALL, first
            # A key called once: either straight away, or (a key requested before its partition moved to a store
            # that cannot know it) after the provider said by key that it never saw it.
            asked = [(e.asked, e.answer) for e in first.evidence]
            assert asked in (
                [(Asked.PROVIDER_CALL, Answer.OK)],
                [(Asked.PROVIDER_LOOKUP, Answer.ABSENT), (Asked.PROVIDER_CALL, Answer.OK)],
            ), first

    # The ledger: one charge per key, none twice, and no key called twice (a replay is a second call).
    ledger = await sandbox.ledger()
    charged = Counter(e["key"] for e in ledger["entries"] if e["kind"] == "charge")
    assert charged == Counter(keys)
    assert ledger["counts"]["charge"] == len(keys)
    assert ledger["replays"].get("charge", 0) == 0


async def held_by(
    broker: Broker, ns: Namespace, workers: set[str], what: str, timeout_s: float = 30
) -> dict[int, str]:
    """Wait until every partition is leased and the owners are exactly `workers`."""

    async def check() -> dict[int, str] | None:
        held = await owners(broker, ns)
        return held if len(held) == PARTITIONS and set(held.values()) == workers else None

    return await eventually(check, what=what, timeout_s=timeout_s)


async def no_key_charged_twice(sandbox: Sandbox) -> None:
    ledger = await sandbox.ledger()
    twice = [
        k for k, n in Counter(e["key"] for e in ledger["entries"] if e["kind"] == "charge").items() if n > 1
    ]
    assert not twice, twice
