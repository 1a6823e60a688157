"""A final unknown reaches the run at once, through the real executor on the session's nats-server: a tool with no
lookup is told `unknown` at its first delivery, and a restarted executor tells the runs whose left-over intents
cannot be known (no lookup, or an effect in its own dead process) while it starts, not after ~35 s of
redeliveries. Neither is ever called again, and a later delivery of the key answers unknown again."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.workloads import NOOP_CONTRACT, StepsAgent
from crashsafe.contracts.keys import action_key, input_hash, partition_of
from crashsafe.contracts.provider_settings import ProviderSettings
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    OutcomeStatus,
    RecordStatus,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.registry import LocalOperation, PythonOperation, Registration, Registry, Tool
from crashsafe.natsd import NatsServer
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.support import inprocess
from tests.support.capabilities import signed
from tests.support.python_providers import ORDER, OrderBook, OrderClient
from tests.support.waiting import eventually

# Far below the ~35 s the delivery cap took: the answer comes from the first delivery, or from the start.
PROMPTLY_S = 5.0


@dataclasses.dataclass
class World:
    """The namespace, a provider that cannot be asked by key, a local effect that counts its runs, and every
    outcome published on the runs' own subjects."""

    broker: Broker
    ns: Namespace
    settings: Settings
    book: OrderBook = dataclasses.field(default_factory=OrderBook)
    local_runs: list[str] = dataclasses.field(default_factory=list)
    outcomes: list[tuple[str, ActionOutcome]] = dataclasses.field(default_factory=list)
    run_id: str = dataclasses.field(default_factory=lambda: "run_" + uuid.uuid4().hex[:24])
    steps: int = 0

    @property
    def registry(self) -> Registry:
        async def local(args: dict[str, Any], key: str) -> dict[str, Any]:
            self.local_runs.append(key)
            return {"done": True}

        blind = PythonOperation(
            lambda settings: OrderClient(self.book, settings), provider="shop", looks_up=False
        )
        tools = (Tool(NOOP_CONTRACT, LocalOperation(local)), Tool(ORDER, blind))
        return Registry.of(Registration(agent=StepsAgent(steps=1), tools=tools))

    def request(self, contract: ToolContract, args: dict[str, Any]) -> ActionRequest:
        self.steps += 1
        now = datetime.now(UTC)
        return ActionRequest(
            run_id=self.run_id,
            step_no=self.steps,
            tool=contract.name,
            family=contract.family,
            args=args,
            key=action_key(self.run_id, self.steps),
            input_hash=input_hash({"tool": contract.name, "args": args}),
            timeout_s=2.0,
            deadline_at=now + timedelta(seconds=30),
            requested_at=now,
        )

    async def publish(self, request: ActionRequest) -> None:
        subject = self.ns.actions(request.family, partition_of(request.key, self.settings.partitions))
        await self.broker.publish(subject, tool_encoder.encode(signed(request)), msg_id=uuid.uuid4().hex)

    async def outcomes_for(self, key: str, count: int = 1) -> list[ActionOutcome]:
        def got() -> list[ActionOutcome] | None:
            found = [o for _, o in self.outcomes if o.key == key]
            return found if len(found) >= count else None

        return await eventually(got, what=f"{count} outcome(s) for {key}", timeout_s=PROMPTLY_S, every_s=0.02)

    def store_path(self, family: str, key: str) -> Path:
        partition = partition_of(key, self.settings.partitions)
        return self.settings.data_dir / f"{self.ns.name}-{family}-p{partition}.sqlite3"

    async def left_over(self, request: ActionRequest) -> None:
        """An intent a previous life committed and then died with: no receipt."""
        store = await ActionStore.open(self.store_path(request.family, request.key))
        try:
            assert await store.begin(request, stream_seq=1)
        finally:
            await store.close()

    async def status_of(self, request: ActionRequest) -> RecordStatus | None:
        store = await ActionStore.open(self.store_path(request.family, request.key))
        try:
            record = await store.get(request.key)
        finally:
            await store.close()
        return None if record is None else record.status


@pytest.fixture
async def world(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[World]:
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data"),
        providers=(ProviderSettings("shop", "https://shop.example", "sk_test_orders"),),
    )
    w = World(broker, namespace, settings)

    async def collect(msg: Any) -> None:
        message = runtime_message_decoder.decode(msg.data)
        if isinstance(message, ActionOutcome):
            w.outcomes.append((msg.subject, message))

    sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
    try:
        yield w
    finally:
        await sub.unsubscribe()


def assert_unknown(outcome: ActionOutcome, deliveries: int) -> None:
    assert (outcome.status, outcome.via, outcome.deliveries) == (
        OutcomeStatus.UNKNOWN,
        "unresolved",
        deliveries,
    )
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retry) == ("outcome_unknown", "unknown_outcome")


async def test_a_no_lookup_tools_unknown_reaches_the_run_at_its_first_delivery(world: World) -> None:
    """The order committed, then its answer was lost, and the provider cannot be asked by key: no later delivery
    can tell, so the run hears `unknown` from the first one (acknowledged, not redelivered), never `failed`."""
    world.book.raise_after_commit = 1
    request = world.request(ORDER, {"item": "desk-7"})
    async with inprocess.executor(world.settings, ORDER.family, registry=world.registry):
        await world.publish(request)
        (outcome,) = await world.outcomes_for(request.key)
        assert_unknown(outcome, deliveries=1)
        (subject,) = [s for s, o in world.outcomes if o.key == request.key]
        assert subject == world.ns.outcomes(ORDER.family, request.run_id)
        assert [(e.asked, e.answer) for e in outcome.evidence] == [(Asked.PROVIDER_CALL, Answer.UNKNOWN)]

        # Asked again (a reconciler's resolve): unknown again, from the first delivery, and never called again.
        await world.publish(request)
        _, again = await world.outcomes_for(request.key, 2)
        assert_unknown(again, deliveries=1)
    assert world.book.calls == [request.key], "called once, never again"
    assert world.book.lookups == [] and list(world.book.orders) == [request.key]
    assert await world.status_of(request) == RecordStatus.UNKNOWN


@pytest.mark.parametrize("contract", [NOOP_CONTRACT, ORDER], ids=["local", "no-lookup"])
async def test_a_left_over_intent_that_cannot_be_known_is_told_to_the_run_at_start(
    world: World, contract: ToolContract
) -> None:
    """A previous life committed the intent and died: whether its call happened nobody can tell (a local effect's
    lookup only ever says absent; a no-lookup tool cannot be asked). The restarted executor tells the run while
    it starts; the request's own redelivery then answers unknown again and calls nothing."""
    request = world.request(contract, {"item": "desk-8"} if contract is ORDER else {"i": 1})
    await world.left_over(request)

    started = time.monotonic()
    async with inprocess.executor(world.settings, contract.family, registry=world.registry) as executor:
        (outcome,) = await world.outcomes_for(request.key)
        assert time.monotonic() - started < PROMPTLY_S
        assert_unknown(outcome, deliveries=1)
        assert outcome.attempts == 1
        asked = [(e.asked, e.answer) for e in outcome.evidence]
        assert asked == ([(Asked.PROVIDER_LOOKUP, Answer.ABSENT)] if contract is NOOP_CONTRACT else [])
        record = await executor._store_for(request.key).get(request.key)
        assert record is not None and record.status == RecordStatus.UNKNOWN

        await inprocess.deliver(executor, request, 2)  # returns: acknowledged, not sent back for later
        _, again = await world.outcomes_for(request.key, 2)
        assert_unknown(again, deliveries=2)
    assert world.local_runs == [] and world.book.calls == [] and world.book.lookups == [], "never called"


async def test_a_settled_unknown_is_not_told_again_at_every_restart(world: World) -> None:
    """Told once (at the first start after the crash); a later restart of the executor finds the key already
    marked unknown and the run already told: nothing new to say, so nothing is published."""
    request = world.request(ORDER, {"item": "desk-9"})
    await world.left_over(request)
    async with inprocess.executor(world.settings, ORDER.family, registry=world.registry):
        await world.outcomes_for(request.key)
    for _ in range(2):
        async with inprocess.executor(world.settings, ORDER.family, registry=world.registry):
            await asyncio.sleep(1.0)
    told = [o for _, o in world.outcomes if o.key == request.key]
    assert len(told) == 1, f"told the run {len(told)} times"
