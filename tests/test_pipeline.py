"""End to end through the gateway with the scripted model: effects counted in the provider's ledger, journals replayed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_fold import assert_replays  # the same replay check the pure tests use, here on real journals

from contracts.errors import ErrorCode, RetryClass, RunVersionConflict
from contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    Event,
    ModelAnswered,
    RunCompleted,
    RunResumed,
    RunStarted,
    ToolRejected,
)
from contracts.streams import stream_specs
from contracts.subjects import Namespace
from services.platform.jetstream import Broker
from services.platform.journal import RunJournal
from services.platform.natsd import NatsServer
from services.runtime.core.fold import replay
from crashsafe.stack import Stack

BOOK_LISBON = "Book a room in Lisbon from 2026-12-01 to 2026-12-03"
EFFECTS = ("booking", "charge", "email", "crm_update")


async def submit(http: httpx.AsyncClient, text: str, guest: str) -> str:
    response = await http.post(
        "/v1/events",
        json={
            "event_id": f"evt-{uuid.uuid4().hex[:12]}",
            "session_id": f"sess-{guest}",
            "guest_id": guest,
            "text": text,
        },
    )
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


async def wait_terminal(
    http: httpx.AsyncClient, run_id: str, deadline_s: float = 30.0, must: bool = True
) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = await http.get(f"/v1/runs/{run_id}")
        if response.status_code == 200:
            last = response.json()
            if last["status"] != "running":
                return last
        await asyncio.sleep(0.05)
    if must:
        raise AssertionError(f"run {run_id} did not end within {deadline_s}s: {last}")
    return last


async def ledger(stack: Stack, guest: str | None = None) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.sandbox_url) as sandbox:
        response = await sandbox.get("/_ledger", params={"guest_id": guest} if guest else None)
    return dict(response.json())


def decision_steps(events: list[Event]) -> list[int]:
    return [e.step_no for e in events if isinstance(e, ModelAnswered | ActionRequested | ToolRejected)]


def receipt_of(events: list[Event], tool: str) -> ActionCompleted:
    request = next(e for e in events if isinstance(e, ActionRequested) and e.tool == tool)
    return next(e for e in events if isinstance(e, ActionCompleted) and e.step_no == request.step_no)


def start_stack(nats_server: NatsServer, directory: Path, **kwargs: Any) -> Stack:
    return Stack(directory, nats_url=nats_server.url, namespace=f"p{uuid.uuid4().hex[:10]}", **kwargs).start()


# The happy path and a clarifying question, on one stack ------------------------------------------------------


@pytest.fixture(scope="module")
def stack(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = start_stack(nats_server, tmp_path_factory.mktemp("pipeline"), reconciler=False)
    yield running
    running.stop()


@pytest.fixture
async def journal_of(stack: Stack) -> AsyncIterator[Callable[[str], Any]]:
    broker = await Broker.connect(stack.nats_url, "tests-journal")
    journal = RunJournal(broker, Namespace(stack.namespace))

    async def read(run_id: str) -> list[Event]:
        events, _ = await journal.read(run_id)
        return events

    yield read
    await broker.close()


async def test_a_booking_makes_each_effect_once(stack: Stack, journal_of: Callable[[str], Any]) -> None:
    guest = f"guest-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
        run_id = await submit(http, BOOK_LISBON, guest)
        summary = await wait_terminal(http, run_id)
    assert summary["status"] == "completed" and summary["pending_actions"] == []

    books = await ledger(stack, guest)
    assert {kind: books["counts"][kind] for kind in EFFECTS} == dict.fromkeys(EFFECTS, 1)
    assert books["counts"]["booking_release"] == books["counts"]["refund"] == 0

    events: list[Event] = await journal_of(run_id)
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

    # Every effect carries the key of the step that asked for it.
    requested = {e.tool: e.key for e in events if isinstance(e, ActionRequested)}
    tool_of = {
        "booking": "create_booking",
        "charge": "create_payment",
        "email": "send_confirmation_email",
        "crm_update": "update_crm",
    }
    assert {e["kind"]: e["key"] for e in books["entries"]} == {
        kind: requested[tool_of[kind]] for kind in EFFECTS
    }

    assert decision_steps(events) == list(range(1, summary["steps"] + 1))
    assert isinstance(events[-1], RunCompleted) and booked.result["booking_id"] in events[-1].reply
    assert_replays(events)
    state = replay(events)
    assert state is not None and state.status == "completed" and state.tokens_used == summary["tokens_used"]


async def test_a_vague_message_gets_a_question_and_no_effects(
    stack: Stack, journal_of: Callable[[str], Any]
) -> None:
    guest = f"guest-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
        run_id = await submit(http, "hello", guest)
        summary = await wait_terminal(http, run_id)
    assert (
        summary["status"] == "completed"
        and summary["reply"].rstrip().endswith(("?", "'"))
        and "?" in summary["reply"]
    )
    events: list[Event] = await journal_of(run_id)
    assert [type(e) for e in events] == [RunStarted, ModelAnswered, RunCompleted]
    assert sum((await ledger(stack, guest))["counts"].values()) == 0


# A worker SIGKILLed at the worst moment ----------------------------------------------------------------------


async def test_payment_executor_killed_after_the_charge_charges_once(
    make_stack: Callable[..., Stack], namespace: Namespace, broker: Broker
) -> None:
    """Killed after the provider charged and before the receipt was written: the restart finds the charge by key."""
    stack = make_stack(crash={"executor-payment": "executor.after_provider_ack"}, reconciler=False)
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    guest = f"guest-{uuid.uuid4().hex[:8]}"
    try:
        async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
            run_id = await submit(http, BOOK_LISBON, guest)
            summary = await wait_terminal(http, run_id, deadline_s=60)
    finally:
        stop.set()
        await supervisor

    assert summary["status"] == "completed"
    assert stack.services["executor-payment"].restarts == 1
    assert b"crashpoint executor.after_provider_ack" in (stack.logs_dir / "executor-payment.log").read_bytes()
    assert all(stack.services[name].restarts == 0 for name in stack.services if name != "executor-payment")

    books = await ledger(stack, guest)
    assert {kind: books["counts"][kind] for kind in EFFECTS} == dict.fromkeys(EFFECTS, 1)
    events, _ = await RunJournal(broker, namespace).read(run_id)
    paid = receipt_of(events, "create_payment")
    assert (paid.status, paid.via) == ("succeeded", "provider_lookup")
    assert paid.provider_ref == next(e["ref"] for e in books["entries"] if e["kind"] == "charge")
    assert sum(1 for e in events if isinstance(e, ActionRequested) and e.tool == "create_payment") == 1
    assert_replays(events)  # a recorded, crashed-and-recovered journal decides the same on replay


# Two runtime workers racing for the same runs ----------------------------------------------------------------


@dataclass
class Race:
    run_ids: list[str]
    summaries: dict[str, dict[str, Any]]
    journals: dict[str, list[Event]]
    effects: dict[str, Counter[str]]


async def settle(
    http: httpx.AsyncClient, run_ids: list[str], quiet_s: float = 4.0, deadline_s: float = 40.0
) -> list[dict[str, Any]]:
    """Wait until every run ended, or until no journal moved for `quiet_s`: a healthy step takes milliseconds,
    so a run that sits still that long is stuck, and waiting longer would only make a failing test slow."""
    deadline = time.monotonic() + deadline_s
    progress, moved_at = None, time.monotonic()
    while True:
        summaries = [(await http.get(f"/v1/runs/{r}")).json() for r in run_ids]
        if all(s.get("status") not in (None, "running") for s in summaries):
            return summaries
        now_progress = [s.get("last_seq") for s in summaries]
        if now_progress != progress:
            progress, moved_at = now_progress, time.monotonic()
        if time.monotonic() - moved_at > quiet_s or time.monotonic() > deadline:
            return summaries
        await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
async def race(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Race]:
    """Six bookings at once through two runtime workers sharing the durable consumers: outcomes land on either."""
    stack = await asyncio.to_thread(
        start_stack, nats_server, tmp_path_factory.mktemp("race"), runtimes=2, reconciler=False
    )
    broker = await Broker.connect(stack.nats_url, "tests-race")
    try:
        async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
            run_ids = await asyncio.gather(*(submit(http, BOOK_LISBON, f"guest-{i}") for i in range(6)))
            summaries = await settle(http, run_ids)
        journal = RunJournal(broker, Namespace(stack.namespace))
        journals = {r: (await journal.read(r))[0] for r in run_ids}
        effects: dict[str, Counter[str]] = {r: Counter() for r in run_ids}
        for entry in (await ledger(stack))["entries"]:
            effects[entry["key"].split(":")[0]][entry["kind"]] += 1
        yield Race(list(run_ids), dict(zip(run_ids, summaries, strict=True)), journals, effects)
    finally:
        await broker.close()
        await asyncio.to_thread(stack.stop)


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


# Optimistic append -------------------------------------------------------------------------------------------


async def test_appends_at_the_same_version_one_wins(broker: Broker, namespace: Namespace) -> None:
    for spec in stream_specs(namespace):
        await broker.ensure_stream(spec)
    journal = RunJournal(broker, namespace)
    run_id = "run_" + uuid.uuid4().hex[:24]
    now = datetime.now(UTC)
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id="s",
        guest_id="g",
        event_id="e",
        idempotency_key="e",
        input_hash="0" * 64,
        text="hello",
        budget=Budget(),
        deadline_at=now + timedelta(seconds=90),
    )
    seq = await journal.append(started, 0)
    with pytest.raises(RunVersionConflict):
        await journal.append(started, 0)  # a second start for the same run

    for step in range(1, 6):
        contenders = [
            ModelAnswered(
                run_id=run_id,
                at=now,
                step_no=step,
                model="m",
                response_id=f"resp_{step}_{writer}",
                reply=f"writer {writer}",
            )
            for writer in range(3)
        ]
        results = await asyncio.gather(*(journal.append(c, seq) for c in contenders), return_exceptions=True)
        wins = [(c, r) for c, r in zip(contenders, results, strict=True) if isinstance(r, int)]
        losses = [r for r in results if isinstance(r, RunVersionConflict)]
        assert len(wins) == 1 and len(losses) == 2, results
        for loss in losses:
            assert (loss.code, loss.retry) == (ErrorCode.RUN_VERSION_CONFLICT, RetryClass.RETRY_LATER)
            assert loss.expected_seq == seq and loss.details()["expected_seq"] == seq
        winner, seq = wins[0]
        events, last = await journal.read(run_id)
        assert last == seq and events[-1] == winner and len(events) == step + 1

    state = replay(events)
    assert state is not None and state.model_steps == 5 and state.next_step == 6
