"""The journal as the bus (issue 33) on a real nats-server: an intent the runtime journals on its executor's subject
is pulled by that partition's owner straight from the journal and its receipt appended into the same journal,
with nothing on ACTIONS or OUTCOMES and nothing journaled twice; a receipt appended by another family, or for
another request, never completes a step: the runtime dead-letters it and the run goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from crashsafe.contracts.headers import Header
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    event_encoder,
)
from crashsafe.contracts.subjects import JournalPart, Namespace, StreamKind
from crashsafe.domain.fold import replay
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKED_AND_PAID, BOOKING_TEXT, Sandbox


@dataclass
class Bus:
    runtime: Runtime
    journal: RunJournal
    sandbox: Sandbox


@pytest.fixture
async def bus(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[Bus]:
    """A runtime and every executor of this release, on the bus."""
    async with (
        inprocess.serving(nats_server.url, namespace, tmp_path / "data") as (runtime, sandbox_url),
        httpx.AsyncClient(timeout=10) as http,
    ):
        yield Bus(runtime, RunJournal(broker, namespace), Sandbox(http, sandbox_url))


async def _ended(journal: RunJournal, run_id: str) -> list[JournalEvent]:
    async def ended() -> list[JournalEvent] | None:
        events, _ = await journal.read(run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    return await eventually(ended, what=f"run {run_id} to end")


async def test_an_intent_journaled_for_the_bus_is_served_from_the_journal(
    bus: Bus, broker: Broker, namespace: Namespace
) -> None:
    event_id = unique("ev")
    run_id = await submit_inbound(broker, namespace, event_id, agent="booking", text=BOOKING_TEXT)
    events = await _ended(bus.journal, run_id)
    state = replay(events)
    assert state is not None and state.status == "completed", state
    intents = await broker.read_subject(
        namespace.stream(StreamKind.RUNS), f"{namespace.name}.run.{run_id}.{JournalPart.INTENT}.*.*"
    )
    requested = [e for e in events if isinstance(e, ActionRequested)]
    assert len(intents) == len(requested) == 3  # search, hold, pay: each on its executor's subject, signed
    assert all(r.capability is not None and r.capability.key == r.key for r in requested)
    receipts = await broker.read_subject(
        namespace.stream(StreamKind.RUNS), f"{namespace.name}.run.{run_id}.{JournalPart.RECEIPT}.*"
    )
    completed = [e for e in events if isinstance(e, ActionCompleted)]
    # Each receipt once, as its executor appended it, right after its intent (no second append by the runtime).
    assert len(receipts) == len(completed) == 3
    assert [(c.family, c.key) for c in completed] == [(r.family, r.key) for r in requested]
    assert all(m.headers.get(Header.FOLLOWS) == str(i.seq) for m, i in zip(receipts, intents, strict=True))
    for kind in (StreamKind.ACTIONS, StreamKind.OUTCOMES):
        assert (await broker.js.stream_info(namespace.stream(kind))).state.messages == 0, kind
    ledger = await bus.sandbox.ledger(f"guest-{event_id}")
    assert ledger["counts"] == BOOKED_AND_PAID
    assert await dead_letters(broker, namespace) == []


async def test_a_receipt_from_another_family_or_for_another_request_is_refused(
    bus: Bus, broker: Broker, namespace: Namespace
) -> None:
    event_id = unique("ev")
    run_id = await submit_inbound(broker, namespace, event_id, agent="booking", text=BOOKING_TEXT)
    events = await _ended(bus.journal, run_id)
    search = next(e for e in events if isinstance(e, ActionRequested) and e.tool == "search_hotels")
    # Forged after the run: the notify family claims the search, and booking's own subject a key never asked.
    for family, forged_family, key in (
        ("notify", "notify", search.key),
        (search.family, search.family, f"{run_id}:99"),
    ):
        forged = ActionCompleted(
            run_id=run_id,
            at=datetime.now(UTC),
            step_no=search.step_no,
            key=key,
            tool=search.tool,
            status="failed",  # type: ignore[arg-type]
            family=forged_family,
        )
        await broker.publish(namespace.run_receipt(run_id, family), event_encoder.encode(forged))

    async def refused() -> list[str] | None:
        letters = [d.details.get("reason") for d in await dead_letters(broker, namespace)]
        return letters if len(letters) == 2 else None

    reasons = await eventually(refused, what="both forged receipts to be dead-lettered")
    assert sorted(map(str, reasons)) == ["unrequested", "wrong_family"], reasons
    after, _ = await bus.journal.read(run_id)
    state = replay(after)
    assert state is not None and state.status == "completed"
    completed = {r.step_no: d for r, d in state.completed}
    assert completed[search.step_no].status == "succeeded"  # the executor's real receipt stands
