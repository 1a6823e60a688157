"""A step key whose call is still in the provider's hands when its partition moves: the new owner, on a store of its
own that never saw the key and with no facts beside it (a step key has none until its second attempt), must treat
the key as sent no later than the takeover and wait out the tool's in-flight window from then before calling
again. A provider that does not lock a key while its write is in progress charges twice for a call made over one
still in its hands. Real executor replicas leasing on the real nats-server; the provider is Python, in-process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.workloads import StepsAgent
from crashsafe.contracts.keys import action_key, input_hash
from crashsafe.contracts.provider_settings import ProviderSettings
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    OutcomeStatus,
    runtime_message_decoder,
)
from crashsafe.contracts.tools import Effect, RetryRule, ToolContract
from crashsafe.domain.registry import (
    ProviderAnswer,
    ProviderCall,
    PythonOperation,
    Registration,
    Registry,
    Tool,
)
from crashsafe.natsd import NatsServer
from crashsafe.services.executor.service import Executor
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.support import inprocess
from tests.support.waiting import eventually

# A charge is in the provider's hands this long before it commits; the tool's contract says so (its in-flight
# window), so a caller that waits the window out from when the call was sent never calls over it.
HOLD_S = 3.0
LEASE_S = 2
CHARGE = ToolContract(
    name="charge_card",
    family="orders",
    effect=Effect.MONEY,
    timeout_s=5.0,
    retry=RetryRule.KEYED,
    max_attempts=3,
    in_flight_s=HOLD_S,
)


@dataclass
class Ledger:
    """The provider's side: the charges it made, and every call and lookup it was sent, by key."""

    made: dict[str, dict[str, Any]] = field(default_factory=dict)
    charges: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    # Each lookup's key, and whether a charge of that key was in the provider's hands when it came.
    lookups: list[tuple[str, bool]] = field(default_factory=list)
    in_hand: dict[str, int] = field(default_factory=dict)
    most_in_hand: int = 0
    work: set[asyncio.Task[ProviderAnswer]] = field(default_factory=set)


class UnlockedCharges:
    """A ProviderClient with no in-flight key locking: a charge looks for the key's record when it arrives and
    commits HOLD_S later, whoever is still waiting for its answer; two calls of one key in its hands at once
    both charge."""

    def __init__(self, ledger: Ledger, settings: ProviderSettings) -> None:
        self.ledger = ledger

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        self.ledger.calls.append(call.key)
        work = asyncio.ensure_future(self._charge(call.args, call.key))
        self.ledger.work.add(work)
        return await asyncio.shield(work)  # a caller that goes away does not stop the charge

    async def _charge(self, args: dict[str, Any], key: str) -> ProviderAnswer:
        known = self.ledger.made.get(key)
        if known is not None:
            return ProviderAnswer(Answer.OK, known, ref=known["charge_id"], replayed=True)
        self.ledger.in_hand[key] = self.ledger.in_hand.get(key, 0) + 1
        self.ledger.most_in_hand = max(self.ledger.most_in_hand, self.ledger.in_hand[key])
        try:
            await asyncio.sleep(HOLD_S)
        finally:
            self.ledger.in_hand[key] -= 1
        self.ledger.charges.append(key)
        charge = {"charge_id": f"ch_{len(self.ledger.charges)}", "amount_cents": args["amount_cents"]}
        self.ledger.made[key] = charge
        return ProviderAnswer(Answer.OK, charge, ref=charge["charge_id"])

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        key = call.key
        self.ledger.lookups.append((key, self.ledger.in_hand.get(key, 0) > 0))
        known = self.ledger.made.get(key)
        if known is not None:
            return ProviderAnswer(Answer.FOUND, known, ref=known["charge_id"])
        return ProviderAnswer(Answer.ABSENT, {})


@dataclass
class Shop:
    nats_url: str
    ns: Namespace
    root: Path
    running: AsyncExitStack
    ledger: Ledger = field(default_factory=Ledger)
    outcomes: list[ActionOutcome] = field(default_factory=list)

    @property
    def registry(self) -> Registry:
        tool = Tool(CHARGE, PythonOperation(lambda s: UnlockedCharges(self.ledger, s), provider="shop"))
        return Registry.of(Registration(agent=StepsAgent(steps=1), tools=(tool,)))

    def settings(self, worker: str) -> Settings:
        """A replica with a data dir of its own: a partition that moves to it does not bring its store."""
        base = inprocess.settings_for(self.nats_url, self.ns, data_dir=self.root / worker, worker_id=worker)
        return dataclasses.replace(
            base, lease_s=LEASE_S, providers=(ProviderSettings("shop", "https://shop.example"),)
        )

    async def replica(self, worker: str) -> Executor:
        return await self.running.enter_async_context(
            inprocess.executor(self.settings(worker), CHARGE.family, registry=self.registry)
        )

    def request(self) -> ActionRequest:
        run_id = "run_" + uuid.uuid4().hex[:24]
        args = {"card": "tok_visa", "amount_cents": 4200}
        now = datetime.now(UTC)
        return ActionRequest(
            run_id=run_id,
            step_no=1,
            tool=CHARGE.name,
            family=CHARGE.family,
            args=args,
            key=action_key(run_id, 1),  # a step key: no facts beside the store on its first attempt
            input_hash=input_hash({"tool": CHARGE.name, "args": args}),
            timeout_s=CHARGE.timeout_s,
            deadline_at=now + timedelta(seconds=60),
            requested_at=now,
        )


@pytest.fixture
async def shop(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[Shop]:
    async with AsyncExitStack() as running:
        world = Shop(nats_server.url, namespace, tmp_path, running)

        async def collect(msg: Any) -> None:
            message = runtime_message_decoder.decode(msg.data)
            if isinstance(message, ActionOutcome):
                world.outcomes.append(message)

        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
        try:
            yield world
        finally:
            await sub.unsubscribe()
            await asyncio.gather(*world.ledger.work, return_exceptions=True)


async def test_a_step_keys_call_still_in_the_providers_hands_at_a_takeover_is_not_called_over(
    shop: Shop,
) -> None:
    a = await shop.replica("orders-a")
    request = shop.request()
    asked = asyncio.create_task(inprocess.deliver(a, request, deliveries=1))
    await eventually(
        lambda: shop.ledger.in_hand.get(request.key) == 1,
        what="a's charge in the provider's hands",
        every_s=0.01,
    )
    # a goes away with the call in flight (a killed pod): it never hears the answer, and hands its partitions
    # back; its volume does not come with them.
    asked.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asked
    await a.close()

    b = await shop.replica("orders-b")  # an empty data dir of its own: a takeover
    assert b.partitions == list(range(b.settings.partitions))
    await inprocess.deliver(b, request, deliveries=2)  # the request comes back, to b

    assert shop.ledger.charges == [request.key], (
        f"charged {len(shop.ledger.charges)} times: b called while a's call was still in the provider's hands"
    )
    assert shop.ledger.most_in_hand == 1
    first_lookup = next((lookup for lookup in shop.ledger.lookups if lookup[0] == request.key), None)
    assert first_lookup == (request.key, True), (
        f"b asked only after a's charge committed (the takeover took over {HOLD_S:.0f}s): nothing was tested"
    )
    (outcome,) = [o for o in shop.outcomes if o.key == request.key]
    assert outcome.status == OutcomeStatus.SUCCEEDED and outcome.provider_ref == "ch_1"
    # b looked up first, heard "absent", and waited out a's call before calling again with the same key.
    assert [(e.asked, e.answer) for e in outcome.evidence] == [
        (Asked.PROVIDER_LOOKUP, Answer.ABSENT),
        (Asked.PROVIDER_CALL, Answer.OK),
    ]
