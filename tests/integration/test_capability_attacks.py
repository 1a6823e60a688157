"""The attack list, against the real nats-server, a real payment executor and runtime consuming their streams,
and the sandbox provider: forged, altered, expired and wrong-origin requests are refused before anything is
done with them (no intent row, no provider call, no outcome) and dead-lettered with their reason; forged
outcomes are never journaled and are dead-lettered with theirs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import msgspec
import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from crashsafe.contracts.capabilities import GRACE_S, CapabilityOrigin
from crashsafe.contracts.dead_letters import DeadLetter
from crashsafe.contracts.keys import (
    CompensationKind,
    action_key,
    compensation_key,
    partition_of,
    run_id_for,
    tool_input_hash,
)
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, Budget, JournalEvent, RunStarted
from crashsafe.contracts.streams import runtime_consumers
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, EventClass, Namespace, StreamKind
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.natsd import NatsServer
from crashsafe.services.executor.service import Executor
from crashsafe.services.platform.jetstream import Broker, Published
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import dead_letters
from tests.support.capabilities import OTHER_ISSUER, signed
from tests.support.nats_users import access
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT, Sandbox

DATES = {"check_in": "2031-12-01", "check_out": "2031-12-03"}


@dataclass
class World:
    ns: Namespace
    broker: Broker
    sandbox: Sandbox
    payments: Executor
    journal: RunJournal
    outcomes: list[ActionOutcome] = field(default_factory=list)

    async def held_booking(self) -> dict[str, Any]:
        """A booking held at the provider and not paid: what an attacker would like marked as paid, or charged."""
        made = await self.sandbox.http.post(
            "/bookings",
            json={"hotel_id": "lis-1", "guest_id": unique("guest"), **DATES},
            headers={"Idempotency-Key": unique("setup")},
        )
        assert made.status_code == 201, made.text
        return dict(made.json())

    def payment(self, booking: dict[str, Any], amount: int | None = None) -> ActionRequest:
        args = {
            "booking_id": booking["booking_id"],
            "guest_id": booking["guest_id"],
            "amount_cents": booking["total_cents"] if amount is None else amount,
            "currency": "EUR",
        }
        return _request("create_payment", args, action_key(run_id_for("", unique("ev")), 6))

    async def publish(self, request: ActionRequest) -> tuple[str, Published]:
        subject = self.ns.actions(request.family, partition_of(request.key, DEFAULT_ACTION_PARTITIONS))
        return subject, await self.broker.publish(subject, tool_encoder.encode(request), msg_id=unique("atk"))

    async def letter(self, subject: str, published: Published) -> DeadLetter:
        async def found() -> DeadLetter | None:
            letters = [
                d
                for d in await dead_letters(self.broker, self.ns)
                if d.subject == subject and d.stream_seq == published.seq
            ]
            return letters[0] if letters else None

        return await eventually(found, what=f"a dead letter for {subject} seq {published.seq}")

    async def nothing_done(self, key: str) -> None:
        """No provider effect, no intent row in the executor's store, no outcome on the wire for the key."""
        assert not [e for e in (await self.sandbox.ledger())["entries"] if e["key"] == key]
        store = self.payments.stores[partition_of(key, DEFAULT_ACTION_PARTITIONS)]
        assert await store.get(key) is None, "an intent row was committed for a refused request"
        assert not [o for o in self.outcomes if o.key == key], "a refused request produced an outcome"


def _request(tool: str, args: dict[str, Any], key: str, deadline_s: float = 30.0) -> ActionRequest:
    now = datetime.now(UTC)
    return ActionRequest(
        run_id=key.split(":")[0],
        step_no=int(key.split(":")[1]),
        tool=tool,
        family="payment",
        args=args,
        key=key,
        input_hash=tool_input_hash(tool, args),
        timeout_s=10.0,
        deadline_at=now + timedelta(seconds=deadline_s),
        requested_at=now,
    )


@pytest.fixture
async def world(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Any
) -> AsyncIterator[World]:
    async with inprocess.sandbox_server() as url, AsyncExitStack() as running:
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=url, data_dir=tmp_path / "data", worker_id="attacks"
        )
        # The scripted model, so that a run the control test moves on can go on deciding.
        model = await running.enter_async_context(inprocess.scripted_model(settings))
        runtime = await running.enter_async_context(inprocess.runtime(settings, model))
        await runtime.start()
        payments = await running.enter_async_context(inprocess.executor(settings, "payment"))
        http = await running.enter_async_context(httpx.AsyncClient(base_url=url, timeout=10))
        w = World(namespace, broker, Sandbox(http, url), payments, RunJournal(broker, namespace))

        async def collect(msg: Msg) -> None:
            message = runtime_message_decoder.decode(msg.data)
            if isinstance(message, ActionOutcome):
                w.outcomes.append(message)

        sub = await broker.nc.subscribe(namespace.outcomes_all, cb=collect)
        try:
            yield w
        finally:
            await sub.unsubscribe()


# Forged requests ----------------------------------------------------------------------------------------------


def _no_capability(w: World, booking: dict[str, Any]) -> ActionRequest:
    return w.payment(booking, amount=1)  # a chosen amount, no capability at all


def _another_key(w: World, booking: dict[str, Any]) -> ActionRequest:
    return signed(w.payment(booking), issuer=OTHER_ISSUER)  # well signed, by a key no executor trusts


def _altered_amount(w: World, booking: dict[str, Any]) -> ActionRequest:
    good = signed(w.payment(booking))  # what the runtime signed, with the amount changed on the way
    return msgspec.structs.replace(good, args={**good.args, "amount_cents": 1})


def _another_tool(w: World, booking: dict[str, Any]) -> ActionRequest:
    refund = _request("refund_payment", {"payment_id": "pay_x"}, f"{run_id_for('', unique('ev'))}:6:refund")
    good = signed(refund)  # a genuine capability, for a refund, moved onto a payment request
    return msgspec.structs.replace(w.payment(booking), capability=good.capability)


def _another_key_of_the_run(w: World, booking: dict[str, Any]) -> ActionRequest:
    request = w.payment(booking)
    step_7 = msgspec.structs.replace(request, key=f"{request.run_id}:7", step_no=7)
    return msgspec.structs.replace(request, capability=signed(step_7).capability)


def _expired(w: World, booking: dict[str, Any]) -> ActionRequest:
    request = w.payment(booking)
    return signed(request, expires_at=datetime.now(UTC) - timedelta(seconds=1))


def _replayed_after_expiry(w: World, booking: dict[str, Any]) -> ActionRequest:
    """A legitimate request, signed by the runtime ten minutes ago with the usual grace past its deadline, replayed
    (captured off the wire, or left in a queue) a second after its capability expired. Judged by its own
    `requested_at` it was in time; only the executor's clock now says it is not."""
    now = datetime.now(UTC)
    asked_at = now - timedelta(minutes=10)
    request = msgspec.structs.replace(
        w.payment(booking), requested_at=asked_at, deadline_at=now - timedelta(seconds=1 + GRACE_S)
    )
    replayed = signed(request)  # expires at its deadline plus the grace: a second ago
    assert replayed.capability is not None and replayed.capability.expires_at < now
    assert replayed.requested_at < replayed.capability.expires_at
    return replayed


def _refund_with_a_plan_capability(w: World, booking: dict[str, Any]) -> ActionRequest:
    key = compensation_key(action_key(run_id_for("", unique("ev")), 6), CompensationKind.REFUND)
    refund = _request("refund_payment", {"payment_id": "pay_anyone"}, key)
    return signed(refund, origin=CapabilityOrigin.PLAN)


def _refund_for_a_booking_run(w: World, booking: dict[str, Any]) -> ActionRequest:
    """A plan capability bound to the booking agent: its model may never ask for a refund."""
    refund = _request("refund_payment", {"payment_id": "pay_anyone"}, f"{run_id_for('', unique('ev'))}:6")
    return signed(refund, origin=CapabilityOrigin.PLAN, agent="booking")


def _refund_relabelled_as_support(w: World, booking: dict[str, Any]) -> ActionRequest:
    """The booking run's capability with its agent changed on the way: the agent is signed."""
    good = _refund_for_a_booking_run(w, booking)
    assert good.capability is not None
    return msgspec.structs.replace(good, capability=msgspec.structs.replace(good.capability, agent="support"))


ATTACKS = {
    "create_payment, chosen amount, no capability": (_no_capability, "missing"),
    "capability signed by another key": (_another_key, "unknown_key"),
    "valid capability, amount altered": (_altered_amount, "input_mismatch"),
    "valid capability for another tool": (_another_tool, "altered"),
    "valid capability for another key": (_another_key_of_the_run, "altered"),
    "expired capability": (_expired, "expired"),
    "a request of ten minutes ago, replayed a second after its capability expired": (
        _replayed_after_expiry,
        "expired",
    ),
    "refund_payment with a plan capability": (_refund_with_a_plan_capability, "wrong_origin"),
    "refund_payment with a plan capability of a booking run": (_refund_for_a_booking_run, "wrong_origin"),
    "refund_payment, capability relabelled to another agent": (
        _refund_relabelled_as_support,
        "bad_signature",
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_forged_request_is_refused_dead_lettered_and_never_reaches_the_provider(
    world: World, attack: str
) -> None:
    build, reason = ATTACKS[attack]
    booking = await world.held_booking()
    request = build(world, booking)
    before = (await world.sandbox.ledger())["counts"]

    subject, published = await world.publish(request)
    letter = await world.letter(subject, published)

    assert letter.service == "executor_payment"
    assert letter.code == "capability_refused"
    assert letter.details["reason"] == reason, letter
    assert letter.details["key"] == request.key and letter.details["tool"] == request.tool
    assert f"({reason})" in letter.reason
    assert letter.deliveries == 1  # poison: refused at the first delivery, never retried
    await world.nothing_done(request.key)
    assert (await world.sandbox.ledger())["counts"] == before


async def test_the_same_payment_signed_by_the_runtime_is_charged(world: World) -> None:
    """The control: the harness would see a charge, so the refusals above really stopped one."""
    booking = await world.held_booking()
    request = signed(world.payment(booking))

    await world.publish(request)

    (outcome,) = await eventually(
        lambda: [o for o in world.outcomes if o.key == request.key] or None, what="the payment's outcome"
    )
    assert outcome.status == OutcomeStatus.SUCCEEDED
    assert [e["kind"] for e in (await world.sandbox.ledger())["entries"] if e["key"] == request.key] == [
        "charge"
    ]


# Forged outcomes ----------------------------------------------------------------------------------------------


async def _booking_run_waiting_on_its_booking(world: World) -> tuple[str, ActionRequested]:
    """A run whose journal holds a pending `create_booking` (booking family): nothing paid."""
    event = unique("ev")
    run_id, now = run_id_for("", event), datetime.now(UTC)
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=f"s-{event}",
        guest_id="guest-1",
        event_id=event,
        idempotency_key=event,
        input_hash="0" * 64,
        text=BOOKING_TEXT,
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
    )
    args = {"hotel_id": "lis-1", "guest_id": "guest-1", **DATES}
    intent = ActionRequested(
        run_id=run_id,
        at=now,
        step_no=2,
        call_id="call_book",
        tool="create_booking",
        family="booking",
        args=args,
        key=action_key(run_id, 2),
        input_hash=tool_input_hash("create_booking", args),
        timeout_s=10.0,
        deadline_at=now + timedelta(seconds=10),
    )
    await world.journal.append(intent, await world.journal.append(started, 0))
    return run_id, intent


async def _journal(world: World, run_id: str) -> list[JournalEvent]:
    events, _ = await world.journal.read(run_id)
    return events


@pytest.mark.parametrize(
    ("forged", "reason"),
    [
        # The "payment executor" answers for the run's booking: the key is the run's, the family is not.
        ("booking_key_from_payment", "wrong_family"),
        # A paid booking the run never asked for.
        ("unrequested_key", "unrequested"),
        # An outcome posing as a wake-up.
        ("outcome_on_wake_subject", "wrong_subject"),
    ],
)
async def test_a_forged_outcome_is_never_journaled_and_is_dead_lettered(
    world: World, forged: str, reason: str
) -> None:
    run_id, booking = await _booking_run_waiting_on_its_booking(world)
    before = await _journal(world, run_id)
    key, tool, step = {
        "booking_key_from_payment": (booking.key, booking.tool, booking.step_no),
        "unrequested_key": (action_key(run_id, 9), "create_payment", 9),
        "outcome_on_wake_subject": (booking.key, booking.tool, booking.step_no),
    }[forged]
    outcome = ActionOutcome(
        run_id=run_id,
        step_no=step,
        tool=tool,
        key=key,
        status=OutcomeStatus.SUCCEEDED,
        result={"booking_id": "bk_forged", "status": "paid", "payment_id": "pay_forged"},
        provider_ref="pay_forged",
    )
    subject = (
        world.ns.wakes(run_id)
        if forged == "outcome_on_wake_subject"
        else world.ns.outcomes("payment", run_id)
    )

    published = await world.broker.publish(subject, tool_encoder.encode(outcome), msg_id=unique("forged"))
    letter = await world.letter(subject, published)

    assert letter.service == "runtime"
    assert letter.code == "outcome_refused"
    assert letter.details["reason"] == reason, letter
    assert letter.details["key"] == key
    assert await _journal(world, run_id) == before, "a forged outcome changed the journal"
    assert (await world.sandbox.ledger())["counts"]["charge"] == 0


async def test_the_booking_familys_own_outcome_for_the_same_key_is_journaled(world: World) -> None:
    """The control: the same outcome from the family that owns the tool is what the runtime journals."""
    run_id, booking = await _booking_run_waiting_on_its_booking(world)
    outcome = ActionOutcome(
        run_id=run_id,
        step_no=booking.step_no,
        tool=booking.tool,
        key=booking.key,
        status=OutcomeStatus.FAILED,
        result={},
    )
    await world.broker.publish(
        world.ns.outcomes("booking", run_id), tool_encoder.encode(outcome), msg_id=str(uuid.uuid4())
    )

    async def completed() -> list[JournalEvent] | None:
        events = await _journal(world, run_id)
        return events if any(isinstance(e, ActionCompleted) for e in events) else None

    events = await eventually(completed, what="the booking's outcome to be journaled")
    assert [e.key for e in events if isinstance(e, ActionCompleted)] == [booking.key]


async def test_an_outcome_id_reserved_by_another_publisher_does_not_silence_the_real_outcome(
    world: World,
) -> None:
    """JetStream deduplicates message ids per stream: anyone who may publish on the outcomes stream (another
    family's executor, a waker) could reserve a predictable id and have the real outcome dropped. Outcomes carry
    none, so the payment's outcome is stored whatever was published before it."""
    booking = await world.held_booking()
    request = signed(world.payment(booking))
    for status in OutcomeStatus:  # as a notify executor may: on its own subject, with the ids one would guess
        await world.broker.publish(
            world.ns.outcomes("notify", request.run_id), b"{}", msg_id=f"outcome:{request.key}:{status}"
        )

    await world.publish(request)

    await eventually(
        lambda: [o for o in world.outcomes if o.key == request.key] or None, what="the payment's outcome"
    )
    # It reached the runtime (which refuses it: this run never asked, the harness plays the run): had the
    # reserved id dropped it, the runtime would never have seen it and there would be no such dead letter.
    refused = await eventually(
        lambda: _refusals_of(world, request.key), what="the runtime to receive the real outcome"
    )
    assert refused[0].code == "outcome_refused"


async def _refusals_of(world: World, key: str) -> list[DeadLetter]:
    return [d for d in await dead_letters(world.broker, world.ns) if (d.details or {}).get("key") == key]


async def test_a_consumer_pointed_at_the_runtimes_deliver_subject_is_dropped_unread(
    world: World, nats_server: NatsServer
) -> None:
    """The runtime's push consumers deliver to a predictable subject; `analytics` may create consumers on the
    runs stream. One aimed at the runtime's deliveries must not become a flood of dead letters (copying every
    journal into the dead-letter stream): the runtime takes only its own consumers' deliveries."""
    marker = unique("journal-text")
    await world.broker.publish(
        world.ns.run_event("run_" + "0" * 24, EventClass.STEP), msgspec.json.encode({"text": marker})
    )
    analytics = await Broker.connect(
        nats_server.url, "attacks-analytics", access=access(nats_server.url, Role.ANALYTICS)
    )
    try:
        inbound, outcomes = runtime_consumers(world.ns)
        for target in (inbound, outcomes):
            await analytics.js.add_consumer(
                world.ns.stream(StreamKind.RUNS),
                ConsumerConfig(
                    deliver_subject=target.deliver_subject,
                    deliver_group=target.durable,
                    ack_policy=AckPolicy.NONE,
                ),
            )
        # The control: a real outcome on the runtime's own consumer still reaches it (and is refused: no such run).
        booking = await world.held_booking()
        request = signed(world.payment(booking))
        await world.publish(request)
        await eventually(
            lambda: _refusals_of(world, request.key), what="the runtime to take its own deliveries"
        )
    finally:
        await analytics.close()
    letters = await dead_letters(world.broker, world.ns)
    assert not [d for d in letters if marker in d.payload], "a foreign delivery was dead-lettered"
