"""Every message delivered twice is harmless: one run, one effect per key, and a journal a duplicate cannot move."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from crashsafe.contracts.inbound import inbound_decoder
from crashsafe.contracts.keys import partition_of, run_id_for
from crashsafe.contracts.run_events import ActionCompleted, decode_event
from crashsafe.contracts.subjects import DEFAULT_ACTION_PARTITIONS, StreamKind
from crashsafe.contracts.tool_messages import ActionOutcome, RunWake, runtime_message_decoder, tool_encoder
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker, Published, SubjectFull
from crashsafe.stack_keys import STACK_TENANT
from tests.support.broker import consumer_idle, consumer_settled, dead_letters
from tests.support.journals import action_outcome_from, action_request_from, of_type, step
from tests.support.stack import StackClient, cli_env, crashsafe, open_stack
from tests.support.waiting import eventually, unique
from tests.support.world import CONFIRMED, projected


@pytest.fixture(scope="module")
async def shared(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(tmp_path_factory.mktemp("dups"), nats_url=nats_server.url) as client:
        yield client


@pytest.fixture
async def world(shared: StackClient) -> AsyncIterator[StackClient]:
    await shared.clear_faults()
    yield shared
    await shared.clear_faults()


async def _completed_run(world: StackClient) -> tuple[str, str, list[dict[str, Any]]]:
    run_id, guest = await world.start_run()
    summary = await world.wait_terminal(run_id)
    assert summary["status"] == "completed", summary
    return run_id, guest, await world.events(run_id)


async def _runtime_took(broker: Broker, world: StackClient, seq: int) -> bool:
    """The runtime has handled (and acknowledged) everything on the outcomes stream up to `seq`."""
    ns = world.ns
    return await consumer_settled(broker, ns.stream(StreamKind.OUTCOMES), ns.runtime_outcomes_consumer, seq)


# (a) The same guest event twice -------------------------------------------------------------------------------


async def test_inbound_event_republished_with_a_new_msg_id_is_refused_by_the_run_subject(
    world: StackClient, broker: Broker
) -> None:
    run_id, guest, events = await _completed_run(world)
    subject = world.ns.inbound(run_id)
    original = await broker.last_on_subject(world.ns.stream(StreamKind.INBOUND), subject)
    assert original is not None and inbound_decoder.decode(original.data).run_id == run_id

    # Past the duplicate window only the one-message-per-run-subject limit guards the run; a new msg id
    # stands in for "the window has passed".
    with pytest.raises(SubjectFull):
        await broker.publish(subject, original.data, msg_id=unique("again"))

    assert await world.events(run_id) == events
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


async def test_inbound_event_republished_with_its_msg_id_is_a_broker_duplicate(
    world: StackClient, broker: Broker
) -> None:
    run_id, _, events = await _completed_run(world)
    original = await broker.last_on_subject(world.ns.stream(StreamKind.INBOUND), world.ns.inbound(run_id))
    assert original is not None

    published = await broker.publish(
        world.ns.inbound(run_id), original.data, msg_id=run_id
    )  # the gateway's msg id

    assert published.duplicate and published.seq == original.seq
    assert await world.events(run_id) == events


async def test_same_guest_event_posted_twice_makes_one_run(world: StackClient) -> None:
    event_id, guest = unique("ev"), unique("g")
    first = await world.post_event(event_id, guest)
    summary = await world.wait_terminal(first.json()["run_id"])
    second = await world.post_event(event_id, guest)

    assert first.status_code == second.status_code == 202
    assert first.json() == {"run_id": first.json()["run_id"], "duplicate": False}
    assert second.json() == {"run_id": first.json()["run_id"], "duplicate": True}
    assert summary["status"] == "completed"
    events = await world.events(first.json()["run_id"])
    assert len(of_type(events, "run.started")) == 1
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


async def test_same_guest_event_posted_twice_at_once_makes_one_run(world: StackClient) -> None:
    event_id, guest = unique("ev"), unique("g")
    responses = await asyncio.gather(*(world.post_event(event_id, guest) for _ in range(2)))

    assert [r.status_code for r in responses] == [202, 202]
    assert len({r.json()["run_id"] for r in responses}) == 1
    assert sorted(r.json()["duplicate"] for r in responses) == [False, True]
    run_id = responses[0].json()["run_id"]
    assert (await world.wait_terminal(run_id))["status"] == "completed"
    assert len(of_type(await world.events(run_id), "run.started")) == 1
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


# (b) The same action request twice ----------------------------------------------------------------------------


async def test_action_request_redelivered_after_completion_is_answered_from_the_receipt(
    world: StackClient, broker: Broker
) -> None:
    run_id, guest, events = await _completed_run(world)
    requested, completed = step(events, "create_payment")
    assert completed is not None
    request = action_request_from(requested)
    ns = world.ns
    partition = partition_of(request.key, DEFAULT_ACTION_PARTITIONS)
    replays_before = (await world.ledger())["replays"]["charge"]

    seen: list[ActionOutcome] = []

    async def collect(msg: Msg) -> None:
        message = runtime_message_decoder.decode(msg.data)
        if isinstance(message, ActionOutcome):
            seen.append(message)

    # A plain subscription sees the executor's answer even if the outcomes stream drops it as a duplicate.
    sub = await broker.nc.subscribe(ns.outcomes(request.family, run_id), cb=collect)
    try:
        published = await broker.publish(
            ns.actions(request.family, partition), tool_encoder.encode(request), msg_id=unique("again")
        )
        replayed = await eventually(
            lambda: _first(seen, lambda o: o.key == request.key and o.via == "replay"),
            what="the executor's replayed receipt",
        )
    finally:
        await sub.unsubscribe()

    assert replayed.status == "succeeded"
    assert replayed.result == completed["result"]
    assert replayed.provider_ref == completed["provider_ref"]
    assert [(e.asked, e.answer) for e in replayed.evidence][-1] == ("store.receipt", "replayed")
    assert await eventually(
        lambda: consumer_settled(
            broker,
            ns.stream(StreamKind.ACTIONS),
            ns.executor_consumer(request.family, partition),
            published.seq,
        ),
        what="the payment executor to settle the second request",
    )
    assert await eventually(lambda: _outcomes_idle(broker, world), what="the runtime to take every outcome")
    assert await projected(lambda: world.counts(guest)) == CONFIRMED
    assert (await world.ledger())["replays"]["charge"] == replays_before, "the provider was called again"
    assert await world.events(run_id) == events


async def _outcomes_idle(broker: Broker, world: StackClient) -> bool:
    ns = world.ns
    return await consumer_idle(broker, ns.stream(StreamKind.OUTCOMES), ns.runtime_outcomes_consumer)


def _first(items: list[ActionOutcome], match: Any) -> ActionOutcome | None:
    return next((i for i in items if match(i)), None)


# (c) The same outcome twice -----------------------------------------------------------------------------------


async def test_outcome_redelivered_after_completion_leaves_the_journal_unchanged(
    world: StackClient, broker: Broker
) -> None:
    run_id, guest, events = await _completed_run(world)
    requested, completed = step(events, "create_payment")
    assert completed is not None
    outcome = action_outcome_from(requested, completed)

    subject = world.ns.outcomes(requested["family"], run_id)
    published = await broker.publish(subject, tool_encoder.encode(outcome), msg_id=unique("again"))
    assert not published.duplicate

    assert await eventually(
        lambda: _runtime_took(broker, world, published.seq), what="the runtime to take the outcome"
    )
    assert await world.events(run_id) == events
    assert await projected(lambda: world.counts(guest)) == CONFIRMED
    assert not [
        d
        for d in await dead_letters(broker, world.ns)
        if d.stream_seq == published.seq and d.subject == subject
    ]


async def test_outcome_delivered_again_while_the_run_is_in_flight_is_journaled_once(
    world: StackClient, broker: Broker
) -> None:
    event_id, guest = unique("ev"), unique("g")
    run_id = run_id_for(STACK_TENANT, event_id)
    copies: list[asyncio.Task[Published]] = []

    outcomes = world.ns.outcomes("payment", run_id)

    async def echo(msg: Msg) -> None:
        # The moment the executor answers the payment (its receipt appended into the journal, the journal as the
        # bus; or an outcome message, when something followed the intent), deliver the same answer twice more as
        # outcome messages, as a request sent again would.
        if copies:
            return
        if msg.subject == outcomes:
            message = runtime_message_decoder.decode(msg.data)
            if not (isinstance(message, ActionOutcome) and message.tool == "create_payment"):
                return
            body = msg.data
        else:
            receipt = decode_event(msg.data)
            if not (isinstance(receipt, ActionCompleted) and receipt.tool == "create_payment"):
                return
            answer = ActionOutcome(
                run_id=receipt.run_id,
                step_no=receipt.step_no,
                tool=receipt.tool,
                key=receipt.key,
                status=receipt.status,
                result=receipt.result,
                provider_ref=receipt.provider_ref,
            )
            body = tool_encoder.encode(answer)
        for _ in range(2):
            copies.append(asyncio.create_task(broker.publish(outcomes, body, msg_id=unique("copy"))))

    subs = [
        await broker.nc.subscribe(subject, cb=echo)
        for subject in (world.ns.run_receipt(run_id, "payment"), outcomes)
    ]
    try:
        response = await world.post_event(event_id, guest)
        assert response.json()["run_id"] == run_id
        summary = await world.wait_terminal(run_id)
        await eventually(lambda: _all_done(copies), what="the copies to be published")
    finally:
        for sub in subs:
            await sub.unsubscribe()
    seqs = [task.result().seq for task in copies]
    assert await eventually(
        lambda: _runtime_took(broker, world, max(seqs)), what="the runtime to take both copies"
    )
    events = await world.events(run_id)
    requested, _ = step(events, "create_payment")  # asserts one completion for the step

    assert summary["status"] == "completed", summary
    assert [e["step_no"] for e in of_type(events, "run.action_completed")].count(requested["step_no"]) == 1
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


async def _all_done(tasks: list[asyncio.Task[Published]]) -> bool:
    return len(tasks) == 2 and all(t.done() for t in tasks)


# (d, e) Wake-ups ----------------------------------------------------------------------------------------------


async def test_wake_for_a_completed_run_leaves_the_journal_unchanged(
    world: StackClient, broker: Broker
) -> None:
    run_id, guest, events = await _completed_run(world)
    wake = RunWake(run_id=run_id, reason="test: duplicate wake", at=datetime.now(UTC), by="test")

    published = await broker.publish(world.ns.wakes(run_id), tool_encoder.encode(wake), msg_id=unique("wake"))

    assert await eventually(
        lambda: _runtime_took(broker, world, published.seq), what="the runtime to take the wake"
    )
    assert await world.events(run_id) == events
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


async def test_wake_for_a_run_in_flight_is_journaled_and_the_run_still_pays_once(
    world: StackClient, broker: Broker
) -> None:
    await world.arm("payments", latency_ms=3000)  # holds the run on its payment step
    run_id, guest = await world.start_run()
    requested = await eventually(
        lambda: world.requested(run_id, "create_payment"), what="the payment to be requested"
    )
    wake = RunWake(
        run_id=run_id, reason="test: wake in flight", at=datetime.now(UTC), by="test", keys=[requested["key"]]
    )

    for _ in range(2):  # and the same wake twice
        await broker.publish(world.ns.wakes(run_id), tool_encoder.encode(wake), msg_id=unique("wake"))
    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)

    nudges = [e for e in of_type(events, "run.nudged") if e["by"] == "test"]
    assert nudges and all(
        n["keys"] == [requested["key"]] and n["reason"] == "test: wake in flight" for n in nudges
    )
    assert summary["status"] == "completed", summary
    _, payment = step(events, "create_payment")
    assert payment is not None and payment["status"] == "succeeded"
    assert await projected(lambda: world.counts(guest)) == CONFIRMED


# Manual reconciliation re-sends requests and wakes: the same harmless duplicates ------------------------------


async def test_manual_reconcile_of_a_run_in_flight_pays_once(world: StackClient) -> None:
    replays_before = (await world.ledger())["replays"]["charge"]
    await world.arm(
        "payments", latency_ms=5000
    )  # the payment is at the provider when the operator reconciles
    run_id, guest = await world.start_run()
    requested = await eventually(
        lambda: world.requested(run_id, "create_payment"), what="the payment to be requested"
    )

    response = await world.reconcile(run_id)
    summary = await world.wait_terminal(run_id)
    events = await world.events(run_id)

    # The request went to the executor again (fresh msg id) while the first was at the provider, and the run was woken.
    assert response.status_code == 202, response.text
    assert response.json() == {"run_id": run_id, "status": "running", "asked": [requested["key"]]}
    nudges = [e for e in of_type(events, "run.nudged") if e["by"] == "operator:http"]
    assert len(nudges) == 1 and nudges[0]["keys"] == [requested["key"]]
    assert summary["status"] == "completed", summary
    step(events, "create_payment")  # one request, one completion
    assert await projected(lambda: world.counts(guest)) == CONFIRMED
    assert (await world.ledger())["replays"]["charge"] == replays_before, "the provider saw the key twice"


async def test_cli_reconcile_of_a_completed_run_asks_nothing(world: StackClient, tmp_path: Path) -> None:
    run_id, guest, events = await _completed_run(world)

    done = await crashsafe("reconcile", run_id, "--state-dir", str(tmp_path), env=cli_env(world.stack))

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{run_id}: completed; asked to resolve: nothing open" in done.stdout
    assert await world.events(run_id) == events
    assert await projected(lambda: world.counts(guest)) == CONFIRMED
