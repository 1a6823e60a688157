"""The executor's idempotency against real NATS and the real sandbox provider: one key, one effect, whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import httpx
import msgspec
import pytest

from crashsafe.contracts.dead_letters import DeadLetter
from crashsafe.contracts.errors import CrashsafeError, ErrorCode, PartitionNotOwned, RetryClass
from crashsafe.contracts.keys import (
    CompensationKind,
    action_key,
    business_key,
    compensation_key,
    input_hash,
    partition_of,
)
from crashsafe.contracts.streams import executor_consumer
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.domain.key_facts import attempted, first_asked
from crashsafe.domain.partition_ownership import Holding
from crashsafe.natsd import NatsServer
from crashsafe.services.executor import service as executor_service
from crashsafe.services.executor import store_connection
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.service import Executor, OutcomeStillUnknown
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.jetstream import Broker, Published
from crashsafe.services.platform.settings import Settings
from tests.support import inprocess
from tests.support.broker import consumer_settled, dead_letters, ensure_streams
from tests.support.capabilities import signed
from tests.support.waiting import eventually
from tests.support.world import Sandbox

PARTITIONS = DEFAULT_ACTION_PARTITIONS
DATES = {"check_in": "2031-12-01", "check_out": "2031-12-03"}


@pytest.fixture
async def sandbox_url() -> AsyncIterator[str]:
    """The sandbox provider in this process, on a free port."""
    async with inprocess.sandbox_server() as url:
        yield url


@dataclass
class Harness:
    """Executors on real NATS in front of the sandbox; requests published and outcomes read like the runtime does."""

    nats_url: str
    ns: Namespace
    broker: Broker
    sandbox: httpx.AsyncClient
    world: Sandbox
    data_dir: Path
    running: AsyncExitStack
    outcomes: list[ActionOutcome] = field(default_factory=list)
    executors: dict[str, Executor] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: "run_" + uuid.uuid4().hex[:24])
    steps: int = 0

    @property
    def settings(self) -> Settings:
        return inprocess.settings_for(
            self.nats_url,
            self.ns,
            sandbox_url=self.world.url,
            data_dir=self.data_dir,
            worker_id="test-executor",
        )

    async def start(self, *families: str, registry: Any = None, max_deliver: int | None = None) -> None:
        for family in families:
            self.executors[family] = await self.running.enter_async_context(
                inprocess.executor(
                    self.settings, family, registry=registry or inprocess.REGISTRY, max_deliver=max_deliver
                )
            )

    def request(self, tool: str, family: str, args: dict[str, Any], key: str | None = None) -> ActionRequest:
        self.steps += 1
        now = datetime.now(UTC)
        return ActionRequest(
            run_id=self.run_id,
            step_no=self.steps,
            tool=tool,
            family=family,
            args=args,
            key=key or action_key(self.run_id, self.steps),
            input_hash=input_hash({"tool": tool, "args": args}),
            timeout_s=5.0,
            deadline_at=now + timedelta(seconds=30),
            requested_at=now,
        )

    async def publish(self, request: ActionRequest, msg_id: str | None = None) -> Published:
        subject = self.ns.actions(request.family, partition_of(request.key, PARTITIONS))
        return await self.broker.publish(
            subject, tool_encoder.encode(signed(request)), msg_id=msg_id or f"test:{uuid.uuid4().hex}"
        )

    async def outcomes_for(self, key: str, count: int = 1, deadline_s: float = 15.0) -> list[ActionOutcome]:
        def got() -> list[ActionOutcome] | None:
            found = [o for o in self.outcomes if o.key == key]
            return found if len(found) >= count else None

        return await eventually(got, what=f"{count} outcome(s) for {key}", timeout_s=deadline_s, every_s=0.02)

    async def booking(self, guest: str = "guest-1", hotel: str = "lis-1") -> dict[str, Any]:
        """A held booking made straight at the provider, to pay for."""
        response = await self.sandbox.post(
            "/bookings",
            json={"hotel_id": hotel, "guest_id": guest, **DATES},
            headers={"Idempotency-Key": f"setup-{uuid.uuid4().hex}"},
        )
        assert response.status_code == 201, response.text
        return dict(response.json())

    def store_path(self, family: str, key: str) -> Path:
        return self.data_dir / f"{self.ns.name}-{family}-p{partition_of(key, PARTITIONS)}.sqlite3"


@pytest.fixture
async def harness(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, sandbox_url: str, tmp_path: Path
) -> AsyncIterator[Harness]:
    async with httpx.AsyncClient(base_url=sandbox_url, timeout=10.0) as sandbox, AsyncExitStack() as running:
        h = Harness(
            nats_server.url,
            namespace,
            broker,
            sandbox,
            Sandbox(sandbox, sandbox_url),
            tmp_path / "data",
            running,
        )

        async def collect(msg: Any) -> None:
            message = runtime_message_decoder.decode(msg.data)
            if isinstance(message, ActionOutcome):
                h.outcomes.append(message)

        # A plain subscription sees every outcome published, including ones JetStream then deduplicates.
        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
        try:
            yield h
        finally:
            await sub.unsubscribe()


def book_args(hotel: str = "lis-1", guest: str = "guest-1", **dates: str) -> dict[str, Any]:
    return {"hotel_id": hotel, "guest_id": guest, **DATES, **dates}


def pay_args(booking: dict[str, Any], amount: int | None = None) -> dict[str, Any]:
    return {
        "booking_id": booking["booking_id"],
        "guest_id": booking["guest_id"],
        "amount_cents": booking["total_cents"] if amount is None else amount,
        "currency": "EUR",
    }


# One key, one effect ------------------------------------------------------------------------------------------


async def test_a_request_sent_again_is_answered_from_the_receipt(harness: Harness) -> None:
    await harness.start("booking")
    request = harness.request("create_booking", "booking", book_args())
    first = await harness.publish(request, msg_id="first")
    (call,) = await harness.outcomes_for(request.key)
    assert (call.status, call.via, call.attempts) == (OutcomeStatus.SUCCEEDED, "call", 1)
    assert call.provider_ref == call.result["booking_id"] and call.result["total_cents"] == 2 * 12000

    # The same msg id inside the window never reaches the executor; a new one (a redelivery after it) does.
    assert (await harness.publish(request, msg_id="first")).duplicate and not first.duplicate
    await harness.publish(request, msg_id="second")
    _, replay = await harness.outcomes_for(request.key, 2)
    assert (replay.status, replay.via, replay.provider_ref, replay.result) == (
        OutcomeStatus.SUCCEEDED,
        "replay",
        call.provider_ref,
        call.result,
    )
    ledger = await harness.world.ledger()
    assert ledger["counts"]["booking"] == 1
    assert ledger["replays"]["booking"] == 0  # the provider was not even asked again


async def test_the_exact_message_twice_back_to_back_charges_once(harness: Harness) -> None:
    await harness.start("payment")
    booking = await harness.booking()
    request = harness.request("create_payment", "payment", pay_args(booking))
    await asyncio.gather(harness.publish(request), harness.publish(request))  # two msg ids, both delivered
    outcomes = await harness.outcomes_for(request.key, 2)
    assert [o.status for o in outcomes] == [OutcomeStatus.SUCCEEDED] * 2
    assert sorted(o.via for o in outcomes) == ["call", "replay"]
    assert outcomes[0].provider_ref == outcomes[1].provider_ref is not None
    ledger = await harness.world.ledger()
    charges = [e for e in ledger["entries"] if e["kind"] == "charge"]
    assert (
        len(charges) == 1
        and charges[0]["key"] == request.key
        and charges[0]["amount_cents"] == booking["total_cents"]
    )
    assert ledger["replays"]["charge"] == 0


async def test_two_runs_asking_one_business_key_at_once_charge_once_and_each_hears_back(
    harness: Harness,
) -> None:
    """A business key (the booking a charge pays) asked by two runs at the same moment: one provider call, and
    each run answered on its own subject and step; the replay says which run made the charge."""
    await harness.start("payment")
    booking = await harness.booking()
    key = business_key("charge", "acme", {"booking_id": booking["booking_id"]})
    first = harness.request("create_payment", "payment", pay_args(booking), key=key)
    other_run = "run_" + uuid.uuid4().hex[:24]
    second = msgspec.structs.replace(first, run_id=other_run, step_no=9)
    await asyncio.gather(harness.publish(first), harness.publish(second))
    outcomes = await harness.outcomes_for(key, 2)
    by_run = {(o.run_id, o.step_no): o for o in outcomes}
    assert set(by_run) == {(first.run_id, first.step_no), (other_run, 9)}
    assert {o.status for o in outcomes} == {OutcomeStatus.SUCCEEDED}
    assert sorted(o.via for o in outcomes) == ["call", "replay"]
    assert len({o.result["payment_id"] for o in outcomes}) == 1
    (replayed,) = [o for o in outcomes if o.via == "replay"]
    maker = next(o for o in outcomes if o.via == "call")
    assert f"first made for {maker.run_id} step {maker.step_no}" in replayed.evidence[-2].detail
    charges = [e for e in (await harness.world.ledger())["entries"] if e["kind"] == "charge"]
    assert [c["key"] for c in charges] == [key]


async def test_a_key_reused_with_other_input_is_a_conflict_and_never_reaches_the_provider(
    harness: Harness,
) -> None:
    await harness.start("booking")
    request = harness.request("create_booking", "booking", book_args())
    await harness.publish(request)
    (original,) = await harness.outcomes_for(request.key)
    assert original.status == OutcomeStatus.SUCCEEDED

    # Arm a refusal on the bookings endpoint: if the executor called the provider, the fault would be used up.
    await harness.world.arm("bookings", fail_5xx=1)
    other = msgspec.structs.replace(request, args=book_args(check_out="2031-12-05"))
    other = msgspec.structs.replace(other, input_hash=input_hash({"tool": other.tool, "args": other.args}))
    await harness.publish(other)
    _, conflict = await harness.outcomes_for(request.key, 2)
    assert (conflict.status, conflict.via, conflict.attempts, conflict.provider_ref) == (
        OutcomeStatus.CONFLICT,
        "conflict",
        0,
        None,
    )
    assert conflict.error is not None and conflict.error.code == "idempotency_conflict"
    assert (
        conflict.error.details["stored_input_hash"] == request.input_hash
        and conflict.error.details["input_hash"] == other.input_hash
    )
    assert (await harness.world.faults())["bookings"]["fail_5xx"] == 1
    ledger = await harness.world.ledger()
    assert ledger["counts"]["booking"] == 1 and ledger["entries"][0]["key"] == request.key


@pytest.mark.parametrize(
    ("tool", "code"),
    [("create_booking", "hotel_unavailable"), ("create_payment", "amount_mismatch")],
    ids=["409-sold-out", "422-wrong-amount"],
)
async def test_a_provider_refusal_is_a_definitive_failure(harness: Harness, tool: str, code: str) -> None:
    await harness.start("booking", "payment")
    if tool == "create_booking":
        request = harness.request(tool, "booking", book_args(hotel="lis-3"))  # sold out: 409
    else:
        request = harness.request(tool, "payment", pay_args(await harness.booking(), amount=1))  # 422
    await harness.publish(request)
    (failed,) = await harness.outcomes_for(request.key)
    assert (failed.status, failed.via, failed.attempts) == (OutcomeStatus.FAILED, "call", 1)
    assert failed.error is not None and failed.error.code == code
    await harness.publish(request)  # a redelivery replays the failure; the provider is not asked again
    _, again = await harness.outcomes_for(request.key, 2)
    assert (again.status, again.via, again.error) == (OutcomeStatus.FAILED, "replay", failed.error)
    ledger = await harness.world.ledger()
    assert ledger["counts"]["charge"] == 0 and ledger["counts"]["booking"] == (
        1 if tool == "create_payment" else 0
    )


# Unknown outcomes: look up by key, never retry blind ----------------------------------------------------------


async def test_a_charge_whose_answer_was_lost_is_found_by_key(harness: Harness) -> None:
    await harness.start("payment")
    booking = await harness.booking()
    await harness.world.arm("payments", drop_after_commit=1)
    request = harness.request("create_payment", "payment", pay_args(booking))
    await harness.publish(request)
    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via) == (OutcomeStatus.SUCCEEDED, "provider_lookup")
    assert (
        outcome.provider_ref == outcome.result["payment_id"]
        and outcome.result["amount_cents"] == booking["total_cents"]
    )
    assert await harness.world.faults() == {}  # the drop really happened
    charges = [e for e in (await harness.world.ledger())["entries"] if e["kind"] == "charge"]
    assert (
        len(charges) == 1 and charges[0]["key"] == request.key and charges[0]["ref"] == outcome.provider_ref
    )


async def test_a_refused_write_is_looked_up_then_called_again_with_the_same_key(harness: Harness) -> None:
    await harness.start("booking", registry=FAST)
    await harness.world.arm("bookings", fail_5xx=1)
    request = harness.request("create_booking", "booking", book_args())
    await harness.publish(request)
    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via, outcome.attempts) == (OutcomeStatus.SUCCEEDED, "call", 2)
    assert await harness.world.faults() == {}
    ledger = await harness.world.ledger()
    assert ledger["counts"]["booking"] == 1 and ledger["entries"][0]["key"] == request.key
    assert ledger["replays"]["booking"] == 0  # the second call was the first to arrive


async def test_an_outcome_still_unknown_at_the_last_delivery_is_reported_unknown_never_failed(
    harness: Harness,
) -> None:
    """The charge went through, its answer was lost, and every lookup by key is refused: nobody can tell. Until the
    last delivery the request just comes back; at the last one the run is told `unknown` (it hands off), never
    `failed` (which would release the booking of a guest who may have paid). Later, a lookup finds the charge."""
    await harness.start("payment")
    executor = harness.executors["payment"]
    booking = await harness.booking()
    await harness.world.arm("payments", drop_after_commit=1)
    await harness.world.arm("lookups", fail_5xx=100)
    request = harness.request("create_payment", "payment", pay_args(booking))
    last = inprocess.last_delivery(executor)

    for deliveries in (1, last - 1):  # the first (calls, then asks by key) and the one before the last (asks)
        with pytest.raises(CrashsafeError) as comes_back:
            await inprocess.deliver(executor, request, deliveries)
        assert (comes_back.value.code, comes_back.value.retry) == (
            ErrorCode.OUTCOME_UNKNOWN,
            RetryClass.RETRY_LATER,
        )

    await inprocess.deliver(
        executor, request, last
    )  # returns: the delivery is acknowledged, not dead-lettered

    (unknown,) = await harness.outcomes_for(request.key)  # nothing was reported before the last delivery
    assert (unknown.status, unknown.via, unknown.attempts, unknown.deliveries) == (
        OutcomeStatus.UNKNOWN,
        "unresolved",
        1,
        last,
    )
    assert unknown.error is not None
    assert (unknown.error.code, unknown.error.retry) == ("outcome_unknown", "unknown_outcome")
    assert unknown.error.details == {"key": request.key}
    assert unknown.result == {} and unknown.provider_ref is None
    assert [(e.asked, e.answer) for e in unknown.evidence] == [("provider.lookup", "unknown")]
    charges = [e for e in (await harness.world.ledger())["entries"] if e["kind"] == "charge"]
    assert len(charges) == 1 and charges[0]["key"] == request.key  # the lost answer was a real charge

    # Lookups are back: the next ask (a reconciler's resolve request) finds the charge by key, calls nothing.
    await harness.world.clear_faults()
    await inprocess.deliver(executor, request, 1)
    _, found = await harness.outcomes_for(request.key, 2)
    assert (found.status, found.via, found.provider_ref) == (
        OutcomeStatus.SUCCEEDED,
        "provider_lookup",
        charges[0]["ref"],
    )
    assert (await harness.world.ledger())["counts"]["charge"] == 1


# Durable before effect ----------------------------------------------------------------------------------------


def _row(path: Path, key: str) -> tuple[str, bytes | None, int | None] | None:
    """Read the executor's SQLite store from outside, as a crash investigator would."""
    if not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
        try:
            row = db.execute(
                "SELECT status, outcome, stream_seq FROM actions WHERE key = ?", (key,)
            ).fetchone()
        except sqlite3.OperationalError:  # the schema is not there yet
            return None
    return None if row is None else (str(row[0]), row[1], row[2])


async def test_the_intent_is_committed_before_the_provider_is_called(harness: Harness) -> None:
    await harness.start("booking")
    await harness.world.arm("bookings", latency_ms=1500)
    request = harness.request("create_booking", "booking", book_args())
    path = harness.store_path("booking", request.key)
    await harness.publish(request)
    row = await eventually(lambda: _row(path, request.key), what="the intent row", timeout_s=10, every_s=0.01)
    assert row is not None and row[0] == "started" and row[1] is None
    assert (await harness.world.ledger())["counts"]["booking"] == 0  # intent durable, effect not yet made

    (outcome,) = await harness.outcomes_for(request.key)
    status, stored, stream_seq = _row(path, request.key) or ("", None, None)
    assert status == "succeeded" and stream_seq is not None and stream_seq >= 1
    assert (
        stored is not None
        and msgspec.json.decode(stored, type=ActionOutcome).provider_ref == outcome.provider_ref
    )
    assert (await harness.world.ledger())["counts"]["booking"] == 1


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])  # on the event loop; in aiosqlite's thread
async def test_action_store_keeps_intents_and_receipts(tmp_path: Path, synchronous: str) -> None:
    path = tmp_path / "store.sqlite3"
    store = await ActionStore.open(path, synchronous)
    now = datetime.now(UTC)
    request = ActionRequest(
        run_id="run_a",
        step_no=2,
        tool="create_booking",
        family="booking",
        args=book_args(),
        key="run_a:2",
        input_hash="h1",
        timeout_s=5.0,
        deadline_at=now,
        requested_at=now,
    )
    other = msgspec.structs.replace(request, key="run_a:4", step_no=4)
    try:
        assert await store.get(request.key) is None
        assert await store.begin(request, stream_seq=7)
        assert not await store.begin(
            msgspec.structs.replace(request, input_hash="h2"), stream_seq=8
        )  # first writer wins
        assert await store.begin(other, stream_seq=9)
        record = await store.get(request.key)
        assert record is not None and (record.status, record.input_hash, record.attempts, record.outcome) == (
            "started",
            "h1",
            1,
            None,
        )
        assert [(r.key, n) for r, n, _ in await store.open_intents()] == [(request.key, 1), (other.key, 1)]
        assert (await store.open_intents())[0][
            0
        ] == request  # the full request survives for start-up reconciliation

        await store.attempt(request.key, 2, time.time())
        outcome = ActionOutcome(
            run_id="run_a",
            step_no=2,
            tool="create_booking",
            key=request.key,
            status=OutcomeStatus.SUCCEEDED,
            result={"booking_id": "bk_1"},
            provider_ref="bk_1",
            attempts=2,
        )
        await store.finish(outcome, stream_seq=11)
        await store.mark_unknown(request.key)  # a receipt is final: nothing moves it back
        await store.mark_unknown(other.key)
    finally:
        await store.close()

    reopened = await ActionStore.open(path, synchronous)  # durable across a restart
    try:
        record = await reopened.get(request.key)
        assert record is not None and (record.status, record.attempts, record.outcome) == (
            "succeeded",
            2,
            outcome,
        )
        assert [(r.key, n) for r, n, _ in await reopened.open_intents()] == [(other.key, 1)]
        assert (await reopened.get(other.key)).status == "unknown"  # type: ignore[union-attr]
        assert await reopened.count() == 2
    finally:
        await reopened.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT stream_seq FROM actions WHERE key = ?", (request.key,)).fetchone() == (11,)


async def test_intents_left_by_a_dead_executor_are_settled_at_start(harness: Harness) -> None:
    """A previous life committed two intents and died: one reached the provider, one never did."""
    reached = harness.request("create_booking", "booking", book_args(guest="guest-reached"))
    lost = harness.request("create_booking", "booking", book_args(guest="guest-lost"))
    for request in (reached, lost):
        store = await ActionStore.open(harness.store_path("booking", request.key))
        assert await store.begin(request, stream_seq=1)
        await store.close()
    made = await harness.sandbox.post(
        "/bookings", json=reached.args, headers={"Idempotency-Key": reached.key}
    )
    assert made.status_code == 201

    await harness.start("booking")  # reconciles before it takes new work
    # A restarting executor may publish a fresh receipt more than once; JetStream keeps one (same msg id).
    found, *echoes = await harness.outcomes_for(reached.key)
    called, *echoes_too = await harness.outcomes_for(lost.key)

    def same(a: ActionOutcome, b: ActionOutcome) -> bool:
        return (a.status, a.via, a.provider_ref, a.result, a.attempts) == (
            b.status,
            b.via,
            b.provider_ref,
            b.result,
            b.attempts,
        )

    assert all(same(e, found) for e in echoes) and all(same(e, called) for e in echoes_too)
    assert (found.status, found.via, found.provider_ref) == (
        OutcomeStatus.SUCCEEDED,
        "provider_lookup",
        made.json()["booking_id"],
    )
    assert (called.status, called.via, called.attempts) == (OutcomeStatus.SUCCEEDED, "call", 2)
    ledger = await harness.world.ledger()
    assert sorted(e["key"] for e in ledger["entries"]) == sorted([reached.key, lost.key])
    for request in (reached, lost):
        assert (_row(harness.store_path("booking", request.key), request.key) or ("",))[0] == "succeeded"


# Reading providers' answers as a careful engineer would ---------------------------------------------------------
#
# The product's writes are slow to time out (a payment: 10 s, so a 20 s in-flight window); these tests run the
# same operations under contracts with a short timeout and window, so "after the window" comes in a second.

FAST_TIMEOUT_S, FAST_WINDOW_S = 0.5, 1.5


def fast(registry: Any) -> Any:
    """The registry with create_payment and create_booking timing out in half a second, in flight for 1.5 s."""
    tools = dict(registry.tools)
    for name in ("create_payment", "create_booking"):
        tool = tools[name]
        contract = msgspec.structs.replace(tool.contract, timeout_s=FAST_TIMEOUT_S, in_flight_s=FAST_WINDOW_S)
        tools[name] = dataclasses.replace(tool, contract=contract)
    return dataclasses.replace(registry, tools=tools)


FAST = fast(inprocess.REGISTRY)


def trail_of(outcome: ActionOutcome | OutcomeStillUnknown) -> list[tuple[str, str]]:
    return [(e.asked, e.answer) for e in outcome.evidence]


async def charges(harness: Harness) -> list[dict[str, Any]]:
    return [e for e in (await harness.world.ledger())["entries"] if e["kind"] == "charge"]


async def test_a_commit_landing_after_the_timeout_is_waited_out_and_found_never_failed(
    harness: Harness,
) -> None:
    """The provider commits a second after the caller gave up. Right after the timeout the lookup says it has no
    record: the executor waits out the in-flight window before calling again, and then finds the charge."""
    await harness.start("payment", registry=FAST)
    booking = await harness.booking()
    await harness.world.arm("payments", commit_delay_ms=1000)
    request = harness.request("create_payment", "payment", pay_args(booking))

    await inprocess.deliver(harness.executors["payment"], request, 1)

    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via, outcome.attempts) == (OutcomeStatus.SUCCEEDED, "provider_lookup", 2)
    assert trail_of(outcome) == [
        ("provider.call", "unknown"),
        ("provider.lookup", "absent"),
        ("provider.call", "unknown"),
        ("provider.lookup", "found"),
    ]
    first_call, absent, second_call, _ = outcome.evidence
    # The second call went out only once the first call's window had passed (not 50 ms after the absent).
    assert (second_call.at - first_call.at).total_seconds() >= FAST_WINDOW_S - 0.1
    (charge,) = await charges(harness)
    assert charge["key"] == request.key and charge["ref"] == outcome.provider_ref


async def test_absent_after_every_unknown_attempt_is_unknown_at_the_last_delivery_never_failed(
    harness: Harness,
) -> None:
    """Slow commits and a lookup that lags behind them: timeout, absent, timeout, absent. Today's rule said
    `failed` (and the run released the room the charge then landed on); the outcome is unknown, and settles
    as succeeded when the lookup catches up."""
    await harness.start("payment", registry=FAST, max_deliver=3)
    executor = harness.executors["payment"]
    booking = await harness.booking()
    await harness.world.arm("payments", commit_delay_ms=1000)
    await harness.world.arm("lookups", lookup_lag_ms=600_000)
    request = harness.request("create_payment", "payment", pay_args(booking))

    with pytest.raises(OutcomeStillUnknown) as comes_back:
        await inprocess.deliver(executor, request, 1)
    assert trail_of(comes_back.value) == [
        ("provider.call", "unknown"),
        ("provider.lookup", "absent"),
        ("provider.call", "unknown"),
        ("provider.lookup", "absent"),
    ]
    await inprocess.deliver(executor, request, inprocess.last_delivery(executor))
    (unknown,) = await harness.outcomes_for(request.key)
    assert (unknown.status, unknown.via) == (OutcomeStatus.UNKNOWN, "unresolved")
    assert len(await charges(harness)) == 1  # the charge landed: `failed` would have been a lie

    await harness.world.clear_faults()  # the lookup catches up; the reconciler's next ask settles it
    await inprocess.deliver(executor, request, 1)
    _, settled = await harness.outcomes_for(request.key, 2)
    assert (settled.status, settled.via) == (OutcomeStatus.SUCCEEDED, "provider_lookup")
    assert not [o for o in harness.outcomes if o.status == OutcomeStatus.FAILED]


async def test_a_key_still_in_flight_from_a_previous_life_answers_409_and_is_unknown_not_failed(
    harness: Harness,
) -> None:
    """A delivery died mid-call; the next one finds the intent: the lookup says absent (the provider is still
    processing, slower than the tool's declared in-flight window), the call with the same key answers 409
    idempotency_key_in_use. That is not a refusal: the outcome stays unknown until the provider has decided,
    and then it is found."""
    await harness.start("payment", registry=FAST, max_deliver=3)
    executor = harness.executors["payment"]
    booking = await harness.booking()
    request = harness.request("create_payment", "payment", pay_args(booking))
    store = executor._store_for(request.key)
    assert await store.begin(request, stream_seq=1)
    # The previous life's call was sent longer ago than the window: the next life may call again at once
    # (within the window it would not: test_a_call_of_a_previous_life_is_waited_out_not_called_over).
    await store.attempt(request.key, 1, time.time() - 60)
    await harness.world.arm("payments", commit_delay_ms=2000)
    previous_life = asyncio.create_task(
        harness.sandbox.post("/payments", json=request.args, headers={"Idempotency-Key": request.key})
    )
    await eventually(
        lambda: _in_flight(harness, request.key),
        what="the previous call in the provider's hands",
        every_s=0.02,
    )

    with pytest.raises(OutcomeStillUnknown) as comes_back:
        await inprocess.deliver(executor, request, 1)
    in_use = [e for e in comes_back.value.evidence if e.asked == "provider.call"]
    assert in_use, comes_back.value.evidence
    assert all(e.answer == "unknown" and "in progress" in e.detail for e in in_use)
    assert (await previous_life).status_code == 201
    await harness.world.clear_faults()
    await inprocess.deliver(executor, request, 2)
    found = [o for o in await harness.outcomes_for(request.key) if o.status == OutcomeStatus.SUCCEEDED]
    assert found and found[-1].via == "provider_lookup"
    assert not [o for o in harness.outcomes if o.status == OutcomeStatus.FAILED]
    assert len(await charges(harness)) == 1


async def test_a_call_of_a_previous_life_is_waited_out_not_called_over(harness: Harness) -> None:
    """Issue 17, item 7: a delivery died mid-call; the next life's lookup says absent while that call is still in
    the provider's hands. The time it was sent is on the intent row, so the key is called again only once the
    tool's in-flight window from then has passed, and the attempt count goes on from the row's."""
    await harness.start("payment", registry=FAST, max_deliver=3)
    executor = harness.executors["payment"]
    booking = await harness.booking()
    request = harness.request("create_payment", "payment", pay_args(booking))
    store = executor._store_for(request.key)
    assert await store.begin(request, stream_seq=1)
    sent = time.time()
    await harness.world.arm("payments", commit_delay_ms=1000)
    previous_life = asyncio.create_task(
        harness.sandbox.post("/payments", json=request.args, headers={"Idempotency-Key": request.key})
    )
    await eventually(
        lambda: _in_flight(harness, request.key),
        what="the previous call in the provider's hands",
        every_s=0.02,
    )

    await inprocess.deliver(executor, request, 2)

    (outcome,) = await harness.outcomes_for(request.key)
    assert outcome.status == OutcomeStatus.SUCCEEDED and outcome.attempts == 2, outcome
    assert trail_of(outcome)[:2] == [("provider.lookup", "absent"), ("provider.call", "unknown")]
    assert not [e for e in outcome.evidence if "in progress" in e.detail]  # never called over it (409)
    called = next(e.at for e in outcome.evidence if e.asked == "provider.call").timestamp()
    assert called - sent >= FAST_WINDOW_S, f"called again {called - sent:.2f}s after the previous life's call"
    assert (await previous_life).status_code == 201
    assert len(await charges(harness)) == 1


async def test_a_takeover_by_an_empty_store_counts_on_from_the_previous_stores_attempts(
    harness: Harness, tmp_path: Path
) -> None:
    """Issue 17, item 7: the previous holder spent both attempts of a charge on unknown answers and handed its
    partitions back; the replica that takes them over has an empty store. Its lookup says absent: it counts on
    from the two attempts in the key's facts, so the key's outcome stays unknown (the reconciler asks on), and
    it never sends a third call (with its count restarting at 0, it did)."""
    booking = await harness.booking()
    request = harness.request(
        "create_payment",
        "payment",
        pay_args(booking),
        key=business_key("charge", "t1", {"booking_id": booking["booking_id"]}),
    )
    async with inprocess.executor(harness.settings, "payment", registry=FAST, max_deliver=3) as previous:
        await harness.world.arm("payments", fail_5xx=2)
        with pytest.raises(OutcomeStillUnknown) as spent:
            await inprocess.deliver(previous, request, 1)
        assert [e.asked for e in spent.value.evidence].count("provider.call") == 2
    assert len(await charges(harness)) == 0

    moved = dataclasses.replace(
        harness.settings, data_dir=tmp_path / "new-volume", worker_id="test-executor-b"
    )
    async with inprocess.executor(moved, "payment", registry=FAST, max_deliver=3) as taking_over:
        await eventually(
            lambda: taking_over.partitions == list(range(PARTITIONS)) or None, what="the takeover"
        )
        with pytest.raises(OutcomeStillUnknown) as asked:
            await inprocess.deliver(taking_over, request, 1)
    assert trail_of(asked.value) == [("provider.lookup", "absent")]  # no third call
    assert len(await charges(harness)) == 0


async def test_a_stale_lease_holder_never_writes_a_keys_facts(harness: Harness) -> None:
    """The fence carried into the key-facts bucket: a value written under a newer lease token refuses a writer
    holding an older one (an old holder paused between its fence check and its write), and the value stays."""
    await ensure_streams(harness.broker, harness.ns)  # as the operator
    book = FactBook(harness.broker, harness.ns, "payment")
    request = harness.request("create_payment", "payment", {"booking_id": "bk_1"}, key="charge:abc")
    b, a = Holding(1, 9), Holding(1, 7)
    newer = first_asked(request, time.time(), b, store="store-b")
    assert await book.first(newer, lambda: None) is None
    with pytest.raises(PartitionNotOwned):
        await book.change(
            request.key, lambda f: attempted(f or newer, 2, time.time(), a, "store-a"), a, lambda: None, 0
        )
    assert (await book.read(request.key))[0] == newer
    await book.change(request.key, lambda f: attempted(f or newer, 2, 5.0, b, "store-b"), b, lambda: None, 0)
    stored, _ = await book.read(request.key)
    assert stored is not None and (stored.attempts, stored.sent_at) == (2, 5.0)


async def _in_flight(harness: Harness, key: str) -> bool:
    return key in await harness.world.in_flight()


async def test_a_429_is_unknown_and_its_retry_after_is_honoured(harness: Harness) -> None:
    await harness.start("payment", registry=FAST)
    booking = await harness.booking()
    await harness.world.arm("payments", throttle=1, retry_after_s=1)
    request = harness.request("create_payment", "payment", pay_args(booking))

    await inprocess.deliver(harness.executors["payment"], request, 1)

    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via, outcome.attempts) == (OutcomeStatus.SUCCEEDED, "call", 2)
    throttled, lookup, _ = outcome.evidence
    assert (throttled.answer, lookup.answer) == ("unknown", "absent") and "429" in throttled.detail
    assert (lookup.at - throttled.at).total_seconds() >= 0.9  # asked again only after Retry-After
    assert len(await charges(harness)) == 1


@pytest.mark.parametrize("fault", ["fail_5xx", "route_404"])
async def test_a_5xx_or_a_body_that_is_not_the_providers_is_unknown_and_never_a_refusal(
    harness: Harness, fault: str
) -> None:
    await harness.start("payment", registry=FAST)
    booking = await harness.booking()
    await harness.world.arm("payments", **{fault: 1})
    request = harness.request("create_payment", "payment", pay_args(booking))

    await inprocess.deliver(harness.executors["payment"], request, 1)

    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via, outcome.attempts) == (OutcomeStatus.SUCCEEDED, "call", 2)
    assert trail_of(outcome) == [
        ("provider.call", "unknown"),
        ("provider.lookup", "absent"),
        ("provider.call", "ok"),
    ]
    assert len(await charges(harness)) == 1


async def test_a_gateway_404_on_the_lookup_is_unknown_never_absent(harness: Harness) -> None:
    """The charge went through and its answer was lost; the lookup meets a load balancer's bare 404. Read as
    "absent" with the attempts spent, that was a `failed` charge (and a release); it is unknown."""
    await harness.start("payment", registry=FAST)
    booking = await harness.booking()
    await harness.world.arm("payments", drop_after_commit=1)
    await harness.world.arm("lookups", route_404=1)
    request = harness.request("create_payment", "payment", pay_args(booking))

    with pytest.raises(OutcomeStillUnknown) as comes_back:
        await inprocess.deliver(harness.executors["payment"], request, 1)
    assert trail_of(comes_back.value) == [("provider.call", "unknown"), ("provider.lookup", "unknown")]

    await inprocess.deliver(harness.executors["payment"], request, 2)  # the redelivery asks again
    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via) == (OutcomeStatus.SUCCEEDED, "provider_lookup")
    assert len(await charges(harness)) == 1


async def test_a_declined_card_is_a_definitive_failure_by_call_and_by_lookup(harness: Harness) -> None:
    await harness.start("payment", registry=FAST)
    await harness.world.arm("payments", decline=1)
    request = harness.request("create_payment", "payment", pay_args(await harness.booking()))
    await inprocess.deliver(harness.executors["payment"], request, 1)
    (declined,) = await harness.outcomes_for(request.key)
    assert (declined.status, declined.via) == (OutcomeStatus.FAILED, "call")
    assert declined.error is not None and declined.error.code == "card_declined"

    # A previous life's charge was declined and its answer lost: the lookup finds the record, declined.
    lost = harness.request("create_payment", "payment", pay_args(await harness.booking()))
    store = await ActionStore.open(harness.store_path("payment", lost.key))
    assert await store.begin(lost, stream_seq=1)
    await store.close()
    await harness.world.arm("payments", decline=1)
    made = await harness.sandbox.post("/payments", json=lost.args, headers={"Idempotency-Key": lost.key})
    assert made.status_code == 402
    await inprocess.deliver(harness.executors["payment"], lost, 2)
    found = [o for o in await harness.outcomes_for(lost.key) if o.via == "provider_lookup"]
    assert found and found[0].status == OutcomeStatus.FAILED
    assert found[0].error is not None and found[0].error.code == "declined"
    assert await charges(harness) == []  # nothing moved


async def test_a_pending_charge_is_unknown_until_the_provider_settles_it(harness: Harness) -> None:
    await harness.start("payment", registry=FAST)
    await harness.world.arm("payments", pending=1, pending_ms=1500)
    request = harness.request("create_payment", "payment", pay_args(await harness.booking()))
    executor = harness.executors["payment"]

    with pytest.raises(OutcomeStillUnknown) as comes_back:
        await inprocess.deliver(executor, request, 1)
    assert trail_of(comes_back.value) == [("provider.call", "unknown"), ("provider.lookup", "unknown")]
    assert "pending" in comes_back.value.evidence[0].detail

    async def settled() -> bool:
        try:
            await inprocess.deliver(executor, request, 2)
        except (OutcomeStillUnknown, PartitionNotOwned):
            # PartitionNotOwned: a starved lease loop let the fence close; the broker would redeliver, as here.
            return False
        return True

    await eventually(settled, what="the pending charge to settle", timeout_s=20, every_s=0.3)
    (outcome,) = await harness.outcomes_for(request.key)
    assert (outcome.status, outcome.via) == (OutcomeStatus.SUCCEEDED, "provider_lookup")
    assert outcome.result["status"] == "captured"


async def test_a_hold_whose_release_is_under_way_is_never_replayed_to_another_run_as_held(
    harness: Harness,
) -> None:
    """A business key's compensation committed its intent and the provider released the hold, but its receipt
    (and the key's 'undone' mark) is not written yet: the executor died in between, or the release is still in
    the provider's hands. Another run asking for the same hold must not be told it is held (a replay of the
    released booking): it is asked again later, told unknown at its last delivery, and `action_undone` once the
    release has settled. Before: the stored receipt was replayed as `succeeded`, the room already let go."""
    await harness.start("booking", max_deliver=3)
    executor = harness.executors["booking"]
    key = business_key("hold", "t1", book_args())
    first = harness.request("create_booking", "booking", book_args(), key=key)
    await inprocess.deliver(executor, first, 1)
    (made,) = await harness.outcomes_for(key)
    assert made.status == OutcomeStatus.SUCCEEDED
    booking_id = made.result["booking_id"]

    release = harness.request(
        "release_booking",
        "booking",
        {"booking_id": booking_id},
        key=compensation_key(key, CompensationKind.RELEASE),
    )
    store = executor.stores[partition_of(release.key, PARTITIONS)]
    assert await store.begin(release, stream_seq=2)  # the release's intent, committed
    released = await harness.sandbox.post(
        f"/bookings/{booking_id}/release", json={}, headers={"Idempotency-Key": release.key}
    )
    assert released.status_code < 300, released.text  # the provider let the room go; no receipt yet

    other_run = "run_" + uuid.uuid4().hex[:24]
    second = msgspec.structs.replace(first, run_id=other_run, step_no=4)
    with pytest.raises(OutcomeStillUnknown):
        await inprocess.deliver(executor, second, 1)
    assert [o for o in harness.outcomes if o.run_id == other_run] == []  # never "held"
    await inprocess.deliver(executor, second, inprocess.last_delivery(executor))
    unknown = await eventually(
        lambda: next((o for o in harness.outcomes if o.run_id == other_run), None),
        what="the second run's answer at its last delivery",
    )
    assert (unknown.status, unknown.attempts) == (OutcomeStatus.UNKNOWN, 0)

    # The release settles (its redelivery finds it by key); the hold is then undone for whoever asks.
    await inprocess.deliver(executor, release, 2, stream_seq=2)
    (settled,) = await harness.outcomes_for(release.key)
    assert (settled.status, settled.via) == (OutcomeStatus.SUCCEEDED, "provider_lookup")
    await inprocess.deliver(executor, msgspec.structs.replace(second, step_no=5), 1)
    undone = await eventually(
        lambda: next((o for o in harness.outcomes if (o.run_id, o.step_no) == (other_run, 5)), None),
        what="the second run's answer after the release settled",
    )
    assert (undone.status, undone.error and undone.error.code) == (OutcomeStatus.FAILED, "action_undone")
    ledger = await harness.world.ledger()
    assert ledger["counts"]["booking"] == 1


async def test_a_hold_whose_release_began_on_the_previous_store_is_not_replayed_as_held_after_a_move(
    harness: Harness, tmp_path: Path
) -> None:
    """The same window across a partition's move: the release began on the previous store (its key's facts say
    so) and the hold's facts are not marked undone. The store that takes the partition over learns the hold from
    its facts and must not replay it to another run as held while the release is open."""
    key = business_key("hold", "t1", book_args())
    first = harness.request("create_booking", "booking", book_args(), key=key)
    # Both replicas declare the partitions' durables alike: a durable is never redefined by the next holder.
    async with inprocess.executor(harness.settings, "booking", max_deliver=3) as previous:
        await inprocess.deliver(previous, first, 1)
        (made,) = await harness.outcomes_for(key)
        release = harness.request(
            "release_booking",
            "booking",
            {"booking_id": made.result["booking_id"]},
            key=compensation_key(key, CompensationKind.RELEASE),
        )
        partition = partition_of(release.key, PARTITIONS)
        store = previous.stores[partition]
        assert await store.begin(release, stream_seq=2)
        # What the release's first ask leaves beside the store, as `_learn` writes it, before its call.
        begun = first_asked(release, time.time(), previous.keeper.holding(partition), store.store_id)
        assert await previous.facts.first(begun, store.fence) is None

    moved = dataclasses.replace(
        harness.settings, data_dir=tmp_path / "new-volume", worker_id="test-executor-b"
    )
    async with inprocess.executor(moved, "booking", max_deliver=3) as taking_over:
        await eventually(
            lambda: taking_over.partitions == list(range(PARTITIONS)) or None, what="the takeover"
        )
        second = msgspec.structs.replace(first, run_id="run_" + uuid.uuid4().hex[:24], step_no=4)
        with pytest.raises(OutcomeStillUnknown):
            await inprocess.deliver(taking_over, second, 1)
    assert [o for o in harness.outcomes if o.run_id == second.run_id] == []  # never "held"
    assert (await harness.world.ledger())["counts"]["booking"] == 1


async def test_a_store_whose_commits_fsync_keeps_them_off_the_event_loop(tmp_path: Path) -> None:
    """`synchronous=FULL` waits for the disk at every commit: that store talks to SQLite from aiosqlite's thread, so
    a slow disk never stops the loop's heartbeats and lease renewals; only `NORMAL` (no wait) runs on the loop."""
    full = await store_connection.connect(tmp_path / "full.sqlite3", "FULL")
    normal = await store_connection.connect(tmp_path / "normal.sqlite3", "NORMAL")
    try:
        assert isinstance(full, aiosqlite.Connection) and isinstance(normal, store_connection.OnTheLoop)
    finally:
        await full.close()
        await normal.close()


async def test_recent_receipts_read_a_big_store_a_slice_at_a_time(tmp_path: Path) -> None:
    """What a new owner republishes from the store it takes over: the receipts of the last seconds only, read a
    slice of rows at a time with a turn of the event loop between (the store runs on the loop; its deliveries'
    heartbeats must not wait out a scan of every row it ever wrote)."""
    store = await ActionStore.open(tmp_path / "store.sqlite3")
    now = datetime.now(UTC)
    recent: list[ActionOutcome] = []
    try:
        for i in range(10):
            request = ActionRequest(
                run_id=f"run_{i}",
                step_no=1,
                tool="create_booking",
                family="booking",
                args=book_args(),
                key=f"run_{i}:1",
                input_hash="h",
                timeout_s=5.0,
                deadline_at=now,
                requested_at=now,
            )
            assert await store.begin(request, stream_seq=i + 1)
            if i % 3 == 0:
                continue  # an intent with no receipt
            outcome = ActionOutcome(
                run_id=request.run_id,
                step_no=1,
                tool=request.tool,
                key=request.key,
                status=OutcomeStatus.SUCCEEDED,
                result={"booking_id": f"bk_{i}"},
                provider_ref=f"bk_{i}",
                attempts=1,
            )
            await store.finish(outcome, stream_seq=None)
            if i < 4:  # written long ago
                await store._db.execute(
                    "UPDATE actions SET updated_at = ? WHERE key = ?", (time.time() - 3600, request.key)
                )
            else:
                recent.append(outcome)

        turns = 0
        scanning = True

        async def other_work() -> None:
            nonlocal turns
            while scanning:
                turns += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = turns
        found = await store.recent_receipts(since_s=60, rows_a_turn=3)
        scanning = False
        await beside
        assert sorted(found, key=lambda o: o.key) == sorted(recent, key=lambda o: o.key)
        assert turns - before >= 3  # 10 rows, 3 a turn: the loop ran between the slices
    finally:
        await store.close()


async def test_a_request_whose_executor_dies_on_every_delivery_is_dead_lettered_once_never_dropped(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, item 3: the executor's durables stop at `max_deliver` (0.1.0's shape, kept), and the loop used to
    dead-letter a never-settled request only on a delivery past it, which the server never makes: a request whose
    executor died on every delivery vanished with no dead letter. Its handler now sees `max_deliver - 1`
    deliveries, and the server's last one is dead-lettered (counted, logged as an error)."""

    def dies(seam: str) -> None:
        # The delivery ends as a SIGKILL ends it: never settled, no more "in progress"; it comes back after the
        # ack wait, on and on.
        if seam == "executor.after_provider_ack":
            raise asyncio.CancelledError

    monkeypatch.setattr(executor_service, "crash_point", dies)
    await harness.start("payment", registry=FAST, max_deliver=3)
    booking = await harness.booking()
    request = harness.request("create_payment", "payment", pay_args(booking))
    published = await harness.publish(request)

    async def letters() -> list[DeadLetter]:
        return [d for d in await dead_letters(harness.broker, harness.ns) if d.stream_seq == published.seq]

    (dead,) = await eventually(letters, what="the request's dead letter", timeout_s=30)
    assert (dead.code, dead.deliveries, dead.details["max_deliver"]) == (
        ErrorCode.DELIVERIES_EXHAUSTED.value,
        3,
        3,
    )
    spec = executor_consumer(harness.ns, "payment", partition_of(request.key, PARTITIONS))
    await eventually(
        lambda: consumer_settled(harness.broker, spec.stream, spec.durable, published.seq),
        what="the request settled (termed) on its consumer",
        timeout_s=10,
    )
    await asyncio.sleep(3 * harness.settings.ack_wait_s)  # nothing more comes back, nothing more is written
    assert len(await letters()) == 1
    assert len(await charges(harness)) == 1  # the two lives that ran called (then looked up) one charge
