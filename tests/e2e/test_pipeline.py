"""End to end through the gateway with the scripted model: effects counted in the provider's ledger, journals replayed."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ModelAnswered,
    RunCompleted,
    RunEvent,
    RunResumed,
    RunStarted,
)
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import plan
from crashsafe.natsd import NatsServer
from crashsafe.services.agents import stayhub
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from tests.support.journals import decision_steps, receipt_of
from tests.support.runs import (
    assert_replays,
)  # the same replay check the pure tests use, here on real journals
from tests.support.stack import StackClient, open_stack, operator_access, supervised
from tests.support.waiting import eventually
from tests.support.world import CONFIRMED, EFFECTS, projected

# The happy path and a clarifying question, on one stack -------------------------------------------------------


@pytest.fixture(scope="module")
async def world(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(
        tmp_path_factory.mktemp("pipeline"), nats_url=nats_server.url, reconciler=False
    ) as client:
        yield client


async def journal_of(broker: Broker, client: StackClient, run_id: str) -> list[RunEvent]:
    """The run's typed journal, read straight from the RUNS stream."""
    events, _ = await RunJournal(broker, client.ns).read(run_id)
    return events


async def test_a_booking_makes_each_effect_once(world: StackClient, broker: Broker) -> None:
    run_id, guest = await world.start_run()
    summary = await world.wait_terminal(run_id, timeout_s=30)
    assert summary["status"] == "completed" and summary["pending_actions"] == []

    # The run ends paid; its confirmation email and CRM record follow (the projector, off its critical path).
    await projected(lambda: world.counts(guest))
    books = await world.ledger(guest)
    assert {kind: books["counts"][kind] for kind in EFFECTS} == dict.fromkeys(EFFECTS, 1)
    assert books["counts"]["booking_release"] == books["counts"]["refund"] == 0

    events = await journal_of(broker, world, run_id)
    search, booked, paid = (
        receipt_of(events, t) for t in ("search_hotels", "create_booking", "create_payment")
    )
    rate = next(
        h["nightly_rate_cents"] for h in search.result["hotels"] if h["hotel_id"] == booked.result["hotel_id"]
    )
    charge = next(e for e in books["entries"] if e["kind"] == "charge")
    assert (
        booked.result["nights"] == 2
        and charge["amount_cents"] == booked.result["nights"] * rate == booked.result["total_cents"]
    )
    assert charge["ref"] == paid.provider_ref == paid.result["payment_id"]

    # Every effect carries the key of the step that asked for it, or of the projection planned from the journal
    # (the receiver's dedup key: the email's message key, the CRM record's (guest, booking)).
    requested = {e.tool: e.key for e in events if isinstance(e, ActionRequested)}
    registry = stayhub()
    state = replay(events)
    assert state is not None
    planned = {
        t.tool: t.key
        for t in plan(state, len(events), registry.agent("booking"), registry.tools, datetime.now(UTC))
    }
    assert set(requested) == {"search_hotels", "create_booking", "create_payment"}
    keys = requested | planned
    tool_of = {
        "booking": "create_booking",
        "charge": "create_payment",
        "email": "send_confirmation_email",
        "crm_update": "update_crm",
    }
    assert {e["kind"]: e["key"] for e in books["entries"]} == {kind: keys[tool_of[kind]] for kind in EFFECTS}

    assert decision_steps(events) == list(range(1, summary["steps"] + 1))
    assert isinstance(events[-1], RunCompleted) and booked.result["booking_id"] in events[-1].reply
    assert_replays(events)
    state = replay(events)
    assert state is not None and state.status == "completed" and state.tokens_used == summary["tokens_used"]


async def test_a_vague_message_gets_a_question_and_no_effects(world: StackClient, broker: Broker) -> None:
    run_id, guest = await world.start_run(text="hello")
    summary = await world.wait_terminal(run_id, timeout_s=30)
    assert (
        summary["status"] == "completed"
        and summary["reply"].rstrip().endswith(("?", "'"))
        and "?" in summary["reply"]
    )
    events = await journal_of(broker, world, run_id)
    assert [type(e) for e in events] == [RunStarted, ModelAnswered, RunCompleted]
    assert sum((await world.counts(guest)).values()) == 0


# A worker SIGKILLed at the worst moment -----------------------------------------------------------------------


async def test_payment_executor_killed_after_the_charge_charges_once(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    """Killed after the provider charged and before the receipt was written: the restart finds the charge by key."""
    client = await start_stack(crash={"executor-payment": "executor.after_provider_ack"}, reconciler=False)
    stack = client.stack
    async with supervised(stack):
        run_id, guest = await client.start_run()
        summary = await client.wait_terminal(run_id, timeout_s=60)
        confirmed = await projected(lambda: client.counts(guest))  # the email and CRM record follow the run

    assert summary["status"] == "completed" and confirmed == CONFIRMED
    assert stack.services["executor-payment"].restarts == 1
    assert b"crashpoint executor.after_provider_ack" in (stack.logs_dir / "executor-payment.log").read_bytes()
    assert all(stack.services[name].restarts == 0 for name in stack.services if name != "executor-payment")

    books = await client.ledger(guest)
    assert {kind: books["counts"][kind] for kind in EFFECTS} == dict.fromkeys(EFFECTS, 1)
    events = await journal_of(broker, client, run_id)
    paid = receipt_of(events, "create_payment")
    assert (paid.status, paid.via) == ("succeeded", "provider_lookup")
    assert paid.provider_ref == next(e["ref"] for e in books["entries"] if e["kind"] == "charge")
    assert sum(1 for e in events if isinstance(e, ActionRequested) and e.tool == "create_payment") == 1
    assert_replays(events)  # a recorded, crashed-and-recovered journal decides the same on replay


# Two runtime workers racing for the same runs -----------------------------------------------------------------


@dataclass
class Race:
    run_ids: list[str]
    summaries: dict[str, dict[str, Any]]
    journals: dict[str, list[RunEvent]]
    effects: dict[str, Counter[str]]


async def settle(
    client: StackClient, run_ids: list[str], quiet_s: float = 4.0, deadline_s: float = 40.0
) -> list[dict[str, Any]]:
    """Every run's summary once all ended, or once no journal moved for `quiet_s`: a healthy step takes
    milliseconds, so a run that sits still that long is stuck, and waiting longer would only make a failing test
    slow (the test then names the runs that did not complete)."""
    deadline = time.monotonic() + deadline_s
    seen: dict[str, Any] = {"progress": None, "moved_at": time.monotonic(), "summaries": []}

    async def ended_or_stuck() -> bool:
        summaries = [(await client.gateway.get(f"/v1/runs/{r}")).json() for r in run_ids]
        seen["summaries"] = summaries
        if all(s.get("status") not in (None, "running") for s in summaries):
            return True
        progress = [s.get("last_seq") for s in summaries]
        if progress != seen["progress"]:
            seen["progress"], seen["moved_at"] = progress, time.monotonic()
        return time.monotonic() - seen["moved_at"] > quiet_s or time.monotonic() > deadline

    await eventually(ended_or_stuck, what="the raced runs to end or stall", timeout_s=deadline_s + quiet_s)
    return list(seen["summaries"])


@pytest.fixture(scope="module")
async def race(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Race]:
    """Six bookings at once through two runtime workers sharing the durable consumers: outcomes land on either."""
    async with open_stack(
        tmp_path_factory.mktemp("race"), nats_url=nats_server.url, runtimes=2, reconciler=False
    ) as client:
        broker = await Broker.connect(
            client.stack.nats_url, "tests-race", access=operator_access(client.stack)
        )
        try:
            guests = [f"guest-{i}" for i in range(6)]
            run_ids = list(await asyncio.gather(*(client.submit(guest_id=g) for g in guests)))
            summaries = await settle(client, run_ids)
            for guest, summary in zip(guests, summaries, strict=True):
                if summary.get("status") == "completed":  # a paid run's email and CRM record follow it
                    await projected(lambda guest=guest: client.counts(guest))
            journals = {r: await journal_of(broker, client, r) for r in run_ids}
            effects: dict[str, Counter[str]] = {r: Counter() for r in run_ids}
            run_of = dict(zip(guests, run_ids, strict=True))  # keys name business actions; guests name runs
            for entry in (await client.ledger())["entries"]:
                effects[run_of[entry["guest_id"]]][entry["kind"]] += 1
            yield Race(run_ids, dict(zip(run_ids, summaries, strict=True)), journals, effects)
        finally:
            await broker.close()


async def test_racing_workers_never_decide_a_step_twice(race: Race) -> None:
    assert any(isinstance(e, RunResumed) for events in race.journals.values() for e in events), (
        "the workers never shared a run"
    )
    for run_id, events in race.journals.items():
        steps = decision_steps(events)
        assert steps == list(range(1, len(steps) + 1)), (run_id, steps)
        requested = [e.step_no for e in events if isinstance(e, ActionRequested)]
        completed = [e.step_no for e in events if isinstance(e, ActionCompleted)]
        assert len(requested) == len(set(requested)) and len(completed) == len(set(completed)), run_id
        assert set(completed) <= set(requested)
        assert all(count <= 1 for count in race.effects[run_id].values()), (run_id, race.effects[run_id])
        assert_replays(events)


async def test_racing_workers_complete_every_run(race: Race) -> None:
    """A worker whose cached copy of a run is stale must re-read it, never drop an outcome as a duplicate."""
    assert {r: s.get("status") for r, s in race.summaries.items()} == dict.fromkeys(race.run_ids, "completed")
    for run_id in race.run_ids:
        assert {kind: race.effects[run_id][kind] for kind in EFFECTS} == dict.fromkeys(EFFECTS, 1), run_id
