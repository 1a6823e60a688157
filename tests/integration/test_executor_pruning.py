"""An executor's store stays bounded (issue 31, months of runs): settled rows are deleted in short batches once
their retention has passed (step keys after the step window, business keys after the longer business window),
an intent with no receipt never is, and a request asked again after its row went is still answered without a
second effect: a step key by the provider's lookup by key, a business key by its facts beside the store. A real
executor on the real nats-server; the provider is Python, in-process, and counts every call."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.workloads import StepsAgent
from crashsafe.contracts.keys import action_key, business_key, partition_of, tool_input_hash
from crashsafe.contracts.provider_settings import ProviderSettings
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    OutcomeStatus,
    RecordStatus,
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
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.jetstream import Broker
from tests.support import inprocess
from tests.support.waiting import eventually

CHARGE = ToolContract(
    name="charge_card",
    family="orders",
    effect=Effect.MONEY,
    timeout_s=5.0,
    retry=RetryRule.KEYED,
    max_attempts=3,
)
BATCH = 3


@dataclass
class Ledger:
    """The provider's side: every charge it made by key, and every call and lookup it was sent."""

    made: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)


class Charges:
    """A provider that remembers its keys (as Stripe does for a day): a call with a known key is its replay."""

    def __init__(self, ledger: Ledger, settings: ProviderSettings) -> None:
        self.ledger = ledger

    async def call(self, call: ProviderCall) -> ProviderAnswer:
        self.ledger.calls.append(call.key)
        known = self.ledger.made.get(call.key)
        if known is not None:
            return ProviderAnswer(Answer.OK, known, ref=known["charge_id"], replayed=True)
        charge = {"charge_id": f"ch_{len(self.ledger.made) + 1}", "amount_cents": call.args["amount_cents"]}
        self.ledger.made[call.key] = charge
        return ProviderAnswer(Answer.OK, charge, ref=charge["charge_id"])

    async def lookup(self, call: ProviderCall) -> ProviderAnswer:
        self.ledger.lookups.append(call.key)
        known = self.ledger.made.get(call.key)
        if known is not None:
            return ProviderAnswer(Answer.FOUND, known, ref=known["charge_id"])
        return ProviderAnswer(Answer.ABSENT, {})


@dataclass
class Shop:
    worker: Executor
    ledger: Ledger
    outcomes: list[ActionOutcome]

    def request(self, key: str | None = None, run_id: str | None = None) -> ActionRequest:
        run_id = run_id or "run_" + uuid.uuid4().hex[:24]
        args = {"card": "tok_visa", "amount_cents": 4200}
        now = datetime.now(UTC)
        return ActionRequest(
            run_id=run_id,
            step_no=1,
            tool=CHARGE.name,
            family=CHARGE.family,
            args=args,
            key=key or action_key(run_id, 1),
            input_hash=tool_input_hash(CHARGE.name, args),
            timeout_s=CHARGE.timeout_s,
            deadline_at=now + timedelta(seconds=60),
            requested_at=now,
        )

    def store_of(self, key: str) -> ActionStore:
        return self.worker.stores[partition_of(key, self.worker.settings.partitions)]

    async def rows(self) -> int:
        return sum([await store.count() for store in self.worker.stores.values()])


@pytest.fixture
async def shop(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[Shop]:
    ledger, outcomes = Ledger(), []
    tool = Tool(CHARGE, PythonOperation(lambda s: Charges(ledger, s), provider="shop"))
    registry = Registry.of(Registration(agent=StepsAgent(steps=1), tools=(tool,)))
    retention = dataclasses.replace(
        RecordRetention(), step_rows_s=1, business_rows_s=3, prune_every_s=3600.0, prune_batch=BATCH
    )
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path),
        providers=(ProviderSettings("shop", "https://shop.example"),),
        retention=retention,
        partitions=1,  # one store: its newest row, never pruned in a pass (store.py), is the test's to choose
        owned_partitions=(0,),
    )

    async def collect(msg: Any) -> None:
        message = runtime_message_decoder.decode(msg.data)
        if isinstance(message, ActionOutcome):
            outcomes.append(message)

    sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
    try:
        async with inprocess.executor(settings, CHARGE.family, registry=registry) as worker:
            yield Shop(worker, ledger, outcomes)
    finally:
        await sub.unsubscribe()


async def test_settled_rows_go_after_their_retention_and_an_intent_without_a_receipt_never(
    shop: Shop,
) -> None:
    steps = [shop.request() for _ in range(7)]
    charges = [shop.request(key=business_key("charge", "acme", {"booking": f"b{n}"})) for n in range(4)]
    for request in [*steps, *charges]:
        await inprocess.deliver(shop.worker, request, deliveries=1)
    # An intent whose call never answered (its executor died): `started`, then `unknown`; neither may go.
    open_step, unknown_step = shop.request(), shop.request()
    assert await shop.store_of(open_step.key).begin(open_step, 1)
    assert await shop.store_of(unknown_step.key).begin(unknown_step, 2)
    assert await shop.store_of(unknown_step.key).mark_unknown(unknown_step.key)
    assert await shop.rows() == 13

    await asyncio.sleep(1.2)  # past the step window, inside the business one
    assert await shop.worker.pruner.prune_all() == 7
    assert await shop.rows() == 6  # the 4 charges, the open intent, the unknown one
    for request in steps:
        assert await shop.store_of(request.key).get(request.key) is None

    await asyncio.sleep(2.0)  # past the business window too
    assert await shop.worker.pruner.prune_all() == 4
    left = {
        request.key: record.status
        for request in (open_step, unknown_step)
        if (record := await shop.store_of(request.key).get(request.key)) is not None
    }
    assert left == {open_step.key: RecordStatus.STARTED, unknown_step.key: RecordStatus.UNKNOWN}
    assert await shop.worker.pruner.prune_all() == 0  # nothing more to take, however often it passes


async def test_a_request_asked_again_after_its_row_was_pruned_is_answered_with_no_second_effect(
    shop: Shop,
) -> None:
    step = shop.request()
    charge = shop.request(key=business_key("charge", "acme", {"booking": "b1"}))
    for request in (step, charge):
        await inprocess.deliver(shop.worker, request, deliveries=1)
    newest = shop.request()  # a later run's: the store's newest row, which a pass never takes
    await inprocess.deliver(shop.worker, newest, deliveries=1)
    first = {o.key: o for o in shop.outcomes}
    await asyncio.sleep(3.2)
    assert await shop.worker.pruner.prune_all() == 2
    assert await shop.rows() == 1

    # The step's request comes back (a redelivery, the runtime re-sending it): asked before the store pruned, it
    # is looked up by key first, and the provider's record answers it.
    await inprocess.deliver(shop.worker, step, deliveries=2)
    # Another run of the tenant asks the same charge: its facts beside the store answer it.
    await inprocess.deliver(shop.worker, shop.request(key=charge.key), deliveries=1)

    assert shop.ledger.calls == [step.key, charge.key, newest.key], "a pruned key was called again"
    assert shop.ledger.lookups == [step.key]
    await eventually(lambda: len(shop.outcomes) == 5, what="both asked-again requests answered")
    again = shop.outcomes[3:]
    assert [o.status for o in again] == [OutcomeStatus.SUCCEEDED] * 2
    step_again = next(o for o in again if o.key == step.key)
    assert step_again.result == first[step.key].result
    assert step_again.evidence[0].asked == Asked.PROVIDER_LOOKUP
    charge_again = next(o for o in again if o.key == charge.key)
    assert charge_again.result == first[charge.key].result


async def test_one_delete_never_takes_more_than_a_batch(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's writer is held for one short delete at a time, whatever is due."""
    for _ in range(10):
        await inprocess.deliver(shop.worker, shop.request(), deliveries=1)
    deletes: list[int] = []
    for store in shop.worker.stores.values():
        execute = store._db.execute

        async def counted(sql: str, parameters: Any = None, execute: Any = execute) -> Any:
            rows = await execute(sql, parameters)
            if sql.startswith("DELETE"):
                deletes.append(rows.rowcount)
            return rows

        monkeypatch.setattr(store._db, "execute", counted)
    await asyncio.sleep(1.2)
    assert await shop.worker.pruner.prune_all() == 9  # all but the newest
    assert deletes and max(deletes) <= BATCH
