"""A turn or a receipt that loses every append race is retried later (nak), never acknowledged unjournaled: the real
runtime on the real nats-server, with a concurrent writer appending to the run's journal before each of its tries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from crashsafe.contracts.errors import RunVersionConflict
from crashsafe.contracts.inbound import InboundEvent, InboundMessage
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    RunEvent,
    RunNudged,
    TurnReceived,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus, tool_encoder
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime import append_path
from tests.support import inprocess
from tests.support.broker import dead_letters, ensure_streams
from tests.support.runs import SEARCH, Run, started
from tests.support.waiting import eventually

RETRIES = 2  # the runtime's conflict retries, lowered so the race is lost in a few appends


class RacingJournal:
    """The runtime's journal, with another writer that appends to the run just before each of the runtime's first
    `races` appends of a `kind`: each of those meets a real conflict at the broker."""

    def __init__(self, journal: RunJournal, kind: type[RunEvent], races: int) -> None:
        self._journal = journal
        self.kind = kind
        self.races = races
        self.tries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)

    async def append(
        self,
        event: RunEvent,
        expected_seq: int,
        headers: dict[str, str] | None = None,
        *,
        after_end: bool = False,
        subject: str | None = None,
    ) -> int:
        if isinstance(event, self.kind):
            self.tries += 1
            if self.tries <= self.races:
                _, last = await self._journal.read(event.run_id)
                other = RunNudged(
                    run_id=event.run_id, at=datetime.now(UTC), by="racer", reason="a concurrent writer"
                )
                await self._journal.append(other, last)
        return await self._journal.append(event, expected_seq, headers, after_end=after_end, subject=subject)


@pytest.fixture
def settings(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> Settings:
    return inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="rt-race")


@pytest.fixture
async def journal(broker: Broker, namespace: Namespace) -> AsyncIterator[RunJournal]:
    await ensure_streams(broker, namespace)
    yield RunJournal(broker, namespace)


@pytest.fixture(autouse=True)
def few_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(append_path, "MAX_CONFLICT_RETRIES", RETRIES)


async def _searching(journal: RunJournal) -> tuple[str, ActionRequested]:
    """A run (journaled) waiting on its search."""
    run = Run(started(budget=Budget(deadline_s=300), at=datetime.now(UTC) - timedelta(seconds=5)))
    run.answer(SEARCH)
    (search,) = run.decide()
    assert isinstance(search, ActionRequested)
    seq = 0
    for event in run.events:
        seq = await journal.append(event, seq)
    return run.events[0].run_id, search


async def test_a_receipt_that_loses_every_race_is_retried_later_and_journaled_never_acked_unjournaled(
    settings: Settings, broker: Broker, journal: RunJournal, namespace: Namespace
) -> None:
    run_id, search = await _searching(journal)
    async with inprocess.runtime(settings) as worker:
        racing = RacingJournal(worker.journal, ActionCompleted, races=RETRIES + 1)
        worker.journal = racing  # type: ignore[assignment]
        await worker.start()
        outcome = ActionOutcome(
            run_id=run_id,
            step_no=search.step_no,
            tool=search.tool,
            key=search.key,
            status=OutcomeStatus.SUCCEEDED,
            result={"hotels": []},
        )
        await broker.publish(namespace.outcomes(search.family, run_id), tool_encoder.encode(outcome))

        async def journaled() -> list[ActionCompleted]:
            events, _ = await journal.read(run_id)
            return [e for e in events if isinstance(e, ActionCompleted)]

        # Before the fix the message was acked after the lost races: the receipt never reached the journal.
        (done,) = await eventually(journaled, what="the receipt journaled after a redelivery", timeout_s=30)
    assert done.key == search.key
    assert (
        racing.tries == RETRIES + 2
    )  # a whole delivery lost (nak), then the redelivery lost one race and won
    assert await dead_letters(broker, namespace) == []


async def test_a_turn_that_loses_every_race_raises_retry_later_instead_of_returning_joined(
    settings: Settings, journal: RunJournal
) -> None:
    run_id, _ = await _searching(journal)
    message = InboundMessage(event_id="evt-2", session_id="sess-1", guest_id="guest-1", text="and breakfast?")
    turn = InboundEvent(
        key="evt-2",
        run_id="run_ffffffffffffffffffffffff",
        input_hash="1" * 64,
        message=message,
        agent="booking",
        received_at=datetime.now(UTC),
        turn_of=run_id,
    )
    async with inprocess.runtime(settings) as worker:
        worker.journal = RacingJournal(worker.journal, TurnReceived, races=RETRIES + 1)  # type: ignore[assignment]
        # Before the fix `join` returned True (so the message was acked) with no turn in the journal.
        with pytest.raises(RunVersionConflict) as raised:
            await worker.join(run_id, turn, context_from(None))
        assert raised.value.retry.value == "retry_later"
        # The next delivery's try is not raced: the turn is journaled once.
        assert await worker.join(run_id, turn, context_from(None))
    events, _ = await journal.read(run_id)
    assert [e.event_id for e in events if isinstance(e, TurnReceived)] == ["evt-2"]
