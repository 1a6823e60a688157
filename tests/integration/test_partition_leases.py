"""Executor replicas lease their partitions on the real nats-server: they split them, hand them over, fence writes,
look up first after a takeover, and a restarted executor takes new work while its left-overs are still settling."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashsafe.contracts.errors import PartitionNotOwned
from crashsafe.contracts.keys import action_key, input_hash, partition_of
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Asked,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.natsd import NatsServer
from crashsafe.services.executor.service import Executor
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.support import inprocess
from tests.support.capabilities import signed
from tests.support.waiting import eventually
from tests.support.world import Sandbox

PARTITIONS = DEFAULT_ACTION_PARTITIONS
LEASE_S = 2  # short, so a hand-over takes seconds; the fence stops acting 0.5 s before it could expire
DATES = {"check_in": "2031-12-01", "check_out": "2031-12-03"}


@dataclass
class Replicas:
    """Payment and booking executors as separate replicas (own worker id, own data dir) in front of the sandbox."""

    nats_url: str
    ns: Namespace
    broker: Broker
    sandbox: httpx.AsyncClient
    world: Sandbox
    root: Path
    running: AsyncExitStack
    outcomes: list[ActionOutcome] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: "run_" + uuid.uuid4().hex[:24])
    steps: int = 0

    def settings(self, worker: str, data_dir: str | None = None) -> Settings:
        base = inprocess.settings_for(
            self.nats_url,
            self.ns,
            sandbox_url=self.world.url,
            data_dir=self.root / (data_dir or worker),
            worker_id=worker,
        )
        return dataclasses.replace(base, lease_s=LEASE_S)

    async def replica(self, worker: str, family: str = "payment", data_dir: str | None = None) -> Executor:
        return await self.running.enter_async_context(
            inprocess.executor(self.settings(worker, data_dir), family)
        )

    async def replica_with(self, worker: str, partitions: str) -> Executor:
        """A replica started with `--partitions`: it takes only these, and only while it holds their leases."""
        settings = self.settings(worker).with_partitions(partitions)
        return await self.running.enter_async_context(inprocess.executor(settings, "payment"))

    def request(self, tool: str, family: str, args: dict[str, Any]) -> ActionRequest:
        self.steps += 1
        now = datetime.now(UTC)
        return ActionRequest(
            run_id=self.run_id,
            step_no=self.steps,
            tool=tool,
            family=family,
            args=args,
            key=action_key(self.run_id, self.steps),
            input_hash=input_hash({"tool": tool, "args": args}),
            timeout_s=5.0,
            deadline_at=now + timedelta(seconds=60),
            requested_at=now,
        )

    async def publish(self, request: ActionRequest) -> None:
        subject = self.ns.actions(request.family, partition_of(request.key, PARTITIONS))
        await self.broker.publish(
            subject, tool_encoder.encode(signed(request)), msg_id=f"test:{uuid.uuid4().hex}"
        )

    async def outcome(self, key: str, timeout_s: float = 30.0) -> ActionOutcome:
        def got() -> ActionOutcome | None:
            return next((o for o in self.outcomes if o.key == key), None)

        return await eventually(got, what=f"an outcome for {key}", timeout_s=timeout_s, every_s=0.01)

    async def booking(self, guest: str = "guest-1") -> dict[str, Any]:
        response = await self.sandbox.post(
            "/bookings",
            json={"hotel_id": "lis-1", "guest_id": guest, **DATES},
            headers={"Idempotency-Key": f"setup-{uuid.uuid4().hex}"},
        )
        assert response.status_code == 201, response.text
        return dict(response.json())

    async def payment(self, guest: str = "guest-1") -> ActionRequest:
        booking = await self.booking(guest)
        args = {
            "booking_id": booking["booking_id"],
            "guest_id": booking["guest_id"],
            "amount_cents": booking["total_cents"],
            "currency": "EUR",
        }
        return self.request("create_payment", "payment", args)

    def book(self, guest: str) -> ActionRequest:
        return self.request("create_booking", "booking", {"hotel_id": "lis-1", "guest_id": guest, **DATES})


@pytest.fixture
async def replicas(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[Replicas]:
    async with (
        inprocess.sandbox_server() as url,
        httpx.AsyncClient(base_url=url, timeout=10.0) as sandbox,
        AsyncExitStack() as running,
    ):
        r = Replicas(nats_server.url, namespace, broker, sandbox, Sandbox(sandbox, url), tmp_path, running)

        async def collect(msg: Any) -> None:
            message = runtime_message_decoder.decode(msg.data)
            if isinstance(message, ActionOutcome):
                r.outcomes.append(message)

        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
        try:
            yield r
        finally:
            await sub.unsubscribe()


async def split(*workers: Executor) -> list[list[int]]:
    """Wait until the replicas hold every partition between them, none twice; returns who holds what."""

    def settled() -> list[list[int]] | None:
        shares = [w.partitions for w in workers]
        held = sorted(p for share in shares for p in share)
        return shares if held == list(range(PARTITIONS)) and all(shares) else None

    return await eventually(settled, what="the partitions split between the replicas", timeout_s=20.0)


async def test_two_replicas_split_the_partitions_and_one_leaving_hands_its_share_to_the_other(
    replicas: Replicas,
) -> None:
    a = await replicas.replica("pay-a")
    assert a.partitions == [0, 1, 2, 3]  # alone: everything, at once
    b = await replicas.replica("pay-b")
    started = time.monotonic()
    assert await split(a, b) == [[0, 2], [1, 3]]  # round-robin over the sorted members
    assert time.monotonic() - started < 10.0

    requests = [await replicas.payment(f"guest-{i}") for i in range(8)]
    for request in requests:
        await replicas.publish(request)
    for request in requests:
        outcome = await replicas.outcome(request.key)
        assert outcome.status == "succeeded"
    counts = await replicas.world.counts()
    assert counts["charge"] == len(requests)

    # b leaves (as a pod stopped by a scale-down): it hands its partitions back; a takes them within seconds.
    started = time.monotonic()
    await b.close()
    await eventually(lambda: a.partitions == [0, 1, 2, 3], what="a to take b's partitions", timeout_s=10.0)
    assert time.monotonic() - started < 6.0
    late = await replicas.payment("guest-late")
    await replicas.publish(late)
    assert (await replicas.outcome(late.key)).status == "succeeded"


async def test_a_replica_whose_lease_ran_out_cannot_commit_an_intent_or_a_receipt(replicas: Replicas) -> None:
    a = await replicas.replica("pay-a")
    request = await replicas.payment()
    partition = partition_of(request.key, PARTITIONS)
    store = a.stores[partition]
    # The renewals stop (as in a process paused past its lease): the fence closes by the local clock alone.
    assert a.keeper._loop_task is not None
    a.keeper._loop_task.cancel()
    await eventually(
        lambda: a.keeper.tenures[partition].valid_until < time.monotonic(),
        what="the lease to run out",
        every_s=0.1,
    )
    with pytest.raises(PartitionNotOwned):
        await store.begin(request, stream_seq=1)
    with pytest.raises(PartitionNotOwned):
        await inprocess.deliver(a, request, deliveries=1)
    assert await store.get(request.key) is None
    assert (await replicas.world.counts())["charge"] == 0  # nothing reached the provider either


async def test_a_partition_moved_to_a_replica_with_an_empty_data_dir_is_looked_up_before_any_call(
    replicas: Replicas,
) -> None:
    """a charged the guest but never learned it (the answer was lost, lookups failing); b, with none of a's
    files, gets the key next: it must ask the provider by key first, never call blind."""
    a = await replicas.replica("pay-a")
    request = await replicas.payment()
    await replicas.world.arm("payments", drop_after_commit=1)
    await replicas.world.arm("lookups", fail_5xx=10_000)
    await replicas.publish(request)

    async def charged_and_open() -> bool:
        record = await a.stores[partition_of(request.key, PARTITIONS)].get(request.key)
        return (await replicas.world.counts())["charge"] == 1 and record is not None and record.attempts >= 1

    await eventually(charged_and_open, what="a's charge at the provider, its outcome unknown to a")
    await a.close()  # the pod goes away; its volume does not come with the partition
    await replicas.world.clear_faults()

    b = await replicas.replica("pay-b")  # an empty data dir of its own
    assert b.partitions == [0, 1, 2, 3]
    outcome = await replicas.outcome(request.key)
    assert outcome.status == "succeeded" and outcome.via == "provider_lookup"
    assert [e.asked for e in outcome.evidence][:1] == [Asked.PROVIDER_LOOKUP]
    assert Asked.PROVIDER_CALL not in [e.asked for e in outcome.evidence]
    ledger = await replicas.world.ledger()
    assert ledger["counts"]["charge"] == 1 and ledger["replays"].get("charge", 0) == 0

    # A key first asked after the takeover is new to everyone: called straight away, no lookup spent on it.
    await asyncio.sleep(replicas.settings("pay-b").clock_skew_s)
    fresh = await replicas.payment("guest-fresh")
    await replicas.publish(fresh)
    called = await replicas.outcome(fresh.key)
    assert [e.asked for e in called.evidence] == [Asked.PROVIDER_CALL]


async def test_a_restarted_executor_answers_a_new_key_within_a_second_while_a_left_over_is_still_settling(
    replicas: Replicas,
) -> None:
    """Its previous life left an intent open; settling it means asking a provider that now takes 4 s a lookup."""
    settings = replicas.settings("book-a")
    left = replicas.book("guest-left")
    store = await ActionStore.open(
        settings.data_dir / f"{replicas.ns.name}-booking-p{partition_of(left.key, PARTITIONS)}.sqlite3"
    )
    assert await store.begin(left, stream_seq=1)
    await store.close()
    await replicas.world.arm("lookups", latency_ms=4000)

    started = time.monotonic()
    await replicas.replica("book-a", family="booking")
    new = replicas.book("guest-new")
    await replicas.publish(new)
    answered = await replicas.outcome(new.key, timeout_s=10.0)
    took = time.monotonic() - started
    assert answered.status == "succeeded"
    assert took < 1.0, f"the new key waited {took:.2f}s behind the left-over"
    assert not [o for o in replicas.outcomes if o.key == left.key]  # still being looked up

    settled = await replicas.outcome(left.key, timeout_s=20.0)
    assert settled.status == "succeeded" and settled.evidence[0].asked == Asked.PROVIDER_LOOKUP
    assert (await replicas.world.counts())["booking"] == 2


async def test_explicit_partition_lists_are_leased_too_so_overlapping_lists_never_both_act(
    replicas: Replicas,
) -> None:
    first = await replicas.replica_with("pay-a", "0-2")
    second = await replicas.replica_with("pay-b", "2-3")
    await eventually(lambda: second.partitions == [3], what="pay-b to take the one partition nobody holds")
    # 2 stays with whoever leased it first; a list is not shared (pay-a's rounds may lag on a loaded machine).
    await eventually(lambda: first.partitions == [0, 1, 2], what="pay-a to hold its whole list")
    assert 2 not in second.partitions
    await first.close()
    await eventually(lambda: second.partitions == [2, 3], what="pay-b to take 2 once pay-a lets go")


async def test_closing_an_executor_ends_even_when_a_lease_round_swallows_the_cancel(
    replicas: Replicas,
) -> None:
    """On Python 3.11 an `asyncio.wait_for` whose inner wait completes in the same loop iteration as the task's
    cancel returns the result and loses the cancel (gh-86296); a lease round's direct get waits in one, and
    under load the answer often lands just as `close()` cancels the round. Before: the lease loop ran on and the
    executor's close (a test's teardown, a SIGTERMed pod) waited for it forever."""
    worker = await replicas.replica("pay-a")
    await eventually(
        lambda: worker.partitions == list(range(PARTITIONS)), what="pay-a to hold every partition"
    )
    broker = worker.keeper.broker
    real_scan = broker.kv_scan
    answer: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
    in_round = asyncio.Event()
    asked: list[tuple[Any, str]] = []

    async def scan_answered_as_cancelled(spec: Any, pattern: str) -> list[Any]:
        if answer.done():
            return await real_scan(spec, pattern)
        asked.append((spec, pattern))
        in_round.set()
        return await asyncio.wait_for(answer, timeout=30)

    broker.kv_scan = scan_answered_as_cancelled  # type: ignore[method-assign]
    await asyncio.wait_for(in_round.wait(), timeout=LEASE_S * 5)
    entries = await real_scan(*asked[0])
    # In one loop iteration, in this order: close() cancels the round, then the round's answer lands.
    closing = asyncio.ensure_future(worker.keeper.close())
    asyncio.get_running_loop().call_soon(answer.set_result, entries)
    await asyncio.wait_for(closing, timeout=LEASE_S * 10)
    assert worker.keeper.held == []  # every partition handed back
