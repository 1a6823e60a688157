"""A provider operation written in Python, run by the real executor on the session's nats-server: an exception
after the write is an unknown outcome settled by key (one effect, the receipt succeeded), never a blind retry;
HTTP operations go to their own provider with its own credential."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from crashsafe.audit_command import listings
from crashsafe.contracts.audit import FindingKind
from crashsafe.contracts.keys import action_key, input_hash, partition_of
from crashsafe.contracts.provider_settings import ProviderSettings
from crashsafe.contracts.run_events import ActionRequested, RunCompleted, RunEvent
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    OutcomeStatus,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.operations.provider_audit import audit_all
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess, runs
from tests.support.capabilities import signed
from tests.support.python_providers import ORDER, OrderBook, registry
from tests.support.waiting import eventually

CREDENTIAL = "sk_test_orders"


class Orders:
    """The `orders` executor in front of an in-memory Python provider; requests published as the runtime does."""

    def __init__(self, broker: Broker, ns: Namespace, settings: Settings, book: OrderBook) -> None:
        self.broker, self.ns, self.settings, self.book = broker, ns, settings, book
        self.outcomes: list[ActionOutcome] = []
        self.run_id = "run_" + uuid.uuid4().hex[:24]
        self.steps = 0

    async def collect(self, msg: Any) -> None:
        message = runtime_message_decoder.decode(msg.data)
        if isinstance(message, ActionOutcome):
            self.outcomes.append(message)

    async def ask(self, args: dict[str, Any], request: ActionRequest | None = None) -> ActionRequest:
        if request is None:
            self.steps += 1
            now = datetime.now(UTC)
            request = ActionRequest(
                run_id=self.run_id,
                step_no=self.steps,
                tool=ORDER.name,
                family=ORDER.family,
                args=args,
                key=action_key(self.run_id, self.steps),
                input_hash=input_hash({"tool": ORDER.name, "args": args}),
                timeout_s=2.0,
                deadline_at=now + timedelta(seconds=30),
                requested_at=now,
            )
        subject = self.ns.actions(ORDER.family, partition_of(request.key, self.settings.partitions))
        await self.broker.publish(subject, tool_encoder.encode(signed(request)), msg_id=uuid.uuid4().hex)
        return request

    async def outcomes_for(self, key: str, count: int = 1) -> list[ActionOutcome]:
        def got() -> list[ActionOutcome] | None:
            found = [o for o in self.outcomes if o.key == key]
            return found if len(found) >= count else None

        return await eventually(got, what=f"{count} outcome(s) for {key}", timeout_s=20, every_s=0.02)


@pytest.fixture
async def orders(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[Orders]:
    book = OrderBook()
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data"),
        providers=(
            ProviderSettings("shop", "https://shop.example", CREDENTIAL),
            ProviderSettings("crm", f"http://127.0.0.1:{free_port()}"),
        ),
    )
    world = Orders(broker, namespace, settings, book)
    sub = await broker.nc.subscribe(namespace.outcomes_all, cb=world.collect)
    try:
        async with inprocess.executor(settings, ORDER.family, registry=registry(book)):
            yield world
    finally:
        await sub.unsubscribe()


async def test_a_call_that_committed_then_raised_is_unknown_found_by_key_and_made_once(
    orders: Orders,
) -> None:
    orders.book.raise_after_commit = 1
    request = await orders.ask({"item": "desk-4"})
    (outcome,) = await orders.outcomes_for(request.key)
    assert (outcome.status, outcome.via, outcome.attempts) == (OutcomeStatus.SUCCEEDED, "provider_lookup", 1)
    assert outcome.provider_ref == "ord_1" and outcome.result["item"] == "desk-4"
    call, lookup = outcome.evidence
    assert (call.asked, call.answer) == (Asked.PROVIDER_CALL, Answer.UNKNOWN)
    assert call.detail.startswith("place_order's call raised ConnectionResetError")
    assert (lookup.asked, lookup.answer) == (Asked.PROVIDER_LOOKUP, Answer.FOUND)
    assert list(orders.book.orders) == [request.key], "one effect"
    assert (orders.book.calls, orders.book.lookups) == ([request.key], [request.key]), "never called blind"
    assert orders.book.opened == [("shop", "https://shop.example", CREDENTIAL)], (
        "opened once, with its settings"
    )
    # Delivered again, it is answered from the receipt: no second call, no second effect.
    await orders.ask({"item": "desk-4"}, request)
    _, again = await orders.outcomes_for(request.key, 2)
    assert (again.status, again.provider_ref) == (OutcomeStatus.SUCCEEDED, "ord_1")
    assert (again.evidence[-1].asked, again.evidence[-1].answer) == (Asked.STORE_RECEIPT, Answer.REPLAYED)
    assert orders.book.calls == [request.key] and len(orders.book.orders) == 1


async def test_a_call_that_raised_before_writing_is_asked_absent_then_called_again_with_the_same_key(
    orders: Orders,
) -> None:
    orders.book.raise_before_commit = 1
    request = await orders.ask({"item": "desk-5"})
    (outcome,) = await orders.outcomes_for(request.key)
    assert (outcome.status, outcome.via, outcome.attempts) == (OutcomeStatus.SUCCEEDED, "call", 2)
    assert [e.answer for e in outcome.evidence] == [Answer.UNKNOWN, Answer.ABSENT, Answer.OK]
    assert orders.book.calls == [request.key, request.key] and list(orders.book.orders) == [request.key]


async def test_a_typed_refusal_is_a_definitive_failure(orders: Orders) -> None:
    request = await orders.ask({"item": "desk-6", "quantity": 0})
    (outcome,) = await orders.outcomes_for(request.key)
    assert (outcome.status, outcome.via) == (OutcomeStatus.FAILED, "call")
    assert outcome.error is not None and outcome.error.code == "invalid_quantity"
    assert orders.book.orders == {}


# HTTP operations at their own provider -----------------------------------------------------------------------


@pytest.fixture
async def crm() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A provider of its own, which records the headers of every request it is sent."""
    seen: list[dict[str, str]] = []

    async def note(request: web.Request) -> web.Response:
        seen.append({name.lower(): value for name, value in request.headers.items()})
        return web.json_response({"note_id": "n_1"}, status=201)

    app = web.Application()
    app.router.add_post("/notes", note)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_an_http_operation_goes_to_its_own_provider_with_its_own_credential(
    crm: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = crm
    settings = Settings(
        sandbox_url=f"http://127.0.0.1:{free_port()}",  # nobody: the default provider must not be asked
        providers=(
            ProviderSettings("crm", url, "crm-token"),
            ProviderSettings("shop", credential=CREDENTIAL),
        ),
    )
    tools = registry(OrderBook()).tools
    now = datetime.now(UTC)
    request = ActionRequest(
        run_id="run_1",
        step_no=1,
        tool="send_note",
        family="orders",
        args={"text": "hello"},
        key="run_1:1",
        input_hash="h",
        timeout_s=2.0,
        deadline_at=now + timedelta(seconds=30),
        requested_at=now,
    )
    async with Providers.open(settings, tools.values()) as providers:
        answer = await providers.call(tools["send_note"], request, 2.0)
    assert (answer.kind, answer.body) == (Answer.OK, {"note_id": "n_1"})
    ((headers),) = seen
    assert headers["authorization"] == "Bearer crm-token" and headers["idempotency-key"] == "run_1:1"


# The audit asks each tool through its own lookup ---------------------------------------------------------------


async def test_the_audit_asks_a_python_operation_by_key_and_lists_only_where_a_provider_offers_a_listing(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    book = OrderBook()
    deployment = registry(book)
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path),
        providers=(
            ProviderSettings("shop", credential=CREDENTIAL),
            ProviderSettings("crm", f"http://127.0.0.1:{free_port()}"),
        ),
    )
    await inprocess.provisioned(settings)
    journal = RunJournal(broker, namespace)
    at = datetime.now(UTC)
    run_id = "run_" + uuid.uuid4().hex[:24]
    events: list[RunEvent] = [msgspec.structs.replace(runs.started(agent="steps1", at=at), run_id=run_id)]
    for step in (1, 2):
        asked = ActionRequested(
            run_id=run_id,
            at=at,
            step_no=step,
            call_id=f"c{step}",
            tool=ORDER.name,
            family=ORDER.family,
            args={"item": f"desk-{step}"},
            key=action_key(run_id, step),
            input_hash="h",
            timeout_s=2.0,
            deadline_at=at + timedelta(seconds=30),
        )
        events += [asked, runs.receipt(asked, at)]
    events.append(RunCompleted(run_id=run_id, at=at, reply="done"))
    for seq, event in enumerate(events):
        await journal.append(event, seq if seq == 0 else await _last(journal, run_id))
    book.orders[action_key(run_id, 1)] = {
        "order_id": "ord_1"
    }  # step 2's success has no effect at the provider

    async with Providers.open(settings, deployment.tools.values()) as providers:
        listing, notes = await listings(providers, deployment)
        findings, stats = await audit_all(broker, settings, deployment, providers, listing)
    assert listing is None and stats.listed_effects is None
    assert [n.split(" ", 2)[1] for n in notes] == ["provider", "place_order:"], notes
    assert sorted(book.lookups) == [action_key(run_id, 1), action_key(run_id, 2)], (
        "asked through its own lookup"
    )
    assert [(f.kind, f.key) for f in findings] == [
        (FindingKind.SUCCESS_WITHOUT_EFFECT, action_key(run_id, 2))
    ]


async def test_the_audit_finds_an_effect_no_journal_asked_for_through_a_python_operations_listing(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    """Issue 32, item 14: a Python operation that lists (`lists=True`) is read like a sandbox ledger, so an order
    its provider holds at a key no run journaled is reported, beside the by-key answers for journaled ones."""
    book = OrderBook()
    deployment = registry(book, lists=True)
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path),
        providers=(
            ProviderSettings("shop", credential=CREDENTIAL),
            ProviderSettings("crm", f"http://127.0.0.1:{free_port()}"),
        ),
    )
    await inprocess.provisioned(settings)
    journal = RunJournal(broker, namespace)
    at = datetime.now(UTC)
    run_id = "run_" + uuid.uuid4().hex[:24]
    asked = ActionRequested(
        run_id=run_id,
        at=at,
        step_no=1,
        call_id="c1",
        tool=ORDER.name,
        family=ORDER.family,
        args={"item": "desk-1"},
        key=action_key(run_id, 1),
        input_hash="h",
        timeout_s=2.0,
        deadline_at=at + timedelta(seconds=30),
    )
    events: list[RunEvent] = [msgspec.structs.replace(runs.started(agent="steps1", at=at), run_id=run_id)]
    events += [asked, runs.receipt(asked, at), RunCompleted(run_id=run_id, at=at, reply="done")]
    for seq, event in enumerate(events):
        await journal.append(event, seq if seq == 0 else await _last(journal, run_id))
    book.orders[action_key(run_id, 1)] = {"order_id": "ord_1"}
    stray = "run_" + uuid.uuid4().hex[:24] + ":1"  # no journal asked for it
    book.orders[stray] = {"order_id": "ord_2"}

    async with Providers.open(settings, deployment.tools.values()) as providers:
        listing, notes = await listings(providers, deployment)
        findings, stats = await audit_all(broker, settings, deployment, providers, listing)
    assert stats.listed_effects == 2 and [n.split(" ", 2)[1] for n in notes] == ["provider"], notes
    assert [(f.kind, f.key) for f in findings] == [(FindingKind.EFFECT_WITHOUT_INTENT, stray)]


async def _last(journal: RunJournal, run_id: str) -> int:
    _, version = await journal.read(run_id)
    return version
