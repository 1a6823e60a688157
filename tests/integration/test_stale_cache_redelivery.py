"""A redelivered guest message whose turn another replica journaled into a run that has since ended is never
started again as a run of its own, even when this replica still holds that run in memory as it was before (a run
waiting on an action or an approval stays in the cache). The real runtime on the real nats-server; the other
replica's appends are made on the journal and the session lane as it makes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from crashsafe.contracts.inbound import InboundEvent, InboundMessage
from crashsafe.contracts.keys import run_id_for
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.run_events import ActionRequested, Budget, RunCompleted, TurnReceived
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.fold import replay
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lane_records import SessionRecords, with_turn
from crashsafe.services.runtime.lanes import finished_turn
from tests.support import inprocess
from tests.support.broker import ensure_streams
from tests.support.runs import SEARCH, Run, started
from tests.support.waiting import unique

TENANT = "t1"


@pytest.fixture
def settings(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> Settings:
    return inprocess.settings_for(
        nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="rt-stale"
    )


@pytest.fixture
async def journal(broker: Broker, namespace: Namespace) -> AsyncIterator[RunJournal]:
    await ensure_streams(broker, namespace)
    yield RunJournal(broker, namespace)


async def test_a_redelivered_turn_of_a_run_ended_elsewhere_starts_no_second_run_despite_a_stale_cached_copy(
    settings: Settings, broker: Broker, journal: RunJournal, namespace: Namespace
) -> None:
    session, guest = unique("sess"), "guest-1"
    owner = run_id_for(TENANT, unique("ev"))
    first = msgspec.structs.replace(
        started(budget=Budget(deadline_s=300), at=datetime.now(UTC) - timedelta(seconds=5)),
        run_id=owner,
        tenant=TENANT,
        session_id=session,
        guest_id=guest,
    )
    run = Run(first)
    run.answer(SEARCH)
    (search,) = run.decide()
    assert isinstance(search, ActionRequested)
    seq = 0
    for event in run.events:
        seq = await journal.append(event, seq)
    sessions = SessionRecords(broker, namespace)
    assert await sessions.claim(TENANT, session, owner, guest) == owner

    # The guest's second message: its own run id, sent as a turn of the owner.
    event_id = unique("ev2")
    message = InboundMessage(event_id=event_id, session_id=session, guest_id=guest, text="and breakfast?")
    turn = InboundEvent(
        key=event_id,
        run_id=run_id_for(TENANT, event_id),
        input_hash="1" * 64,
        message=message,
        agent="booking",
        received_at=datetime.now(UTC),
        tenant=TENANT,
        turn_of=owner,
    )
    async with inprocess.runtime(settings) as worker:
        # This replica holds the owner, waiting on its search (a wake drives it there and keeps it cached).
        await inprocess.wake(worker, owner, "test: hold it in memory")
        held = inprocess.held_state(worker, owner)
        assert held is not None and not held.terminal

        # Another replica took the message, journaled it as the owner's turn, ended the run, handed the session
        # back, and died before its ack: the message comes here again.
        events, seq = await journal.read(owner)
        seq = await journal.append(
            TurnReceived(run_id=owner, at=datetime.now(UTC), event_id=event_id, text=message.text), seq
        )
        seq = await journal.append(RunCompleted(run_id=owner, at=datetime.now(UTC), reply="done"), seq)
        events, _ = await journal.read(owner)
        ended = replay(events)
        assert ended is not None and ended.terminal

        def give_back(lane: SessionLane) -> SessionLane:
            assert ended is not None
            lane = with_turn(lane, finished_turn(ended))
            return msgspec.structs.replace(lane, run_id="", guest_id="", turns=0)

        await sessions.change(TENANT, session, give_back)

        # Before the fix the stale cached copy (not ended, without the turn) said the message was nobody's yet:
        # it took the free session and started a second run answering a message already answered.
        await worker.admit(turn, context_from(None), redelivered=True)

    second, _ = await journal.read(turn.run_id)
    assert second == [], "the message was answered twice: a second run was started from it"
    lane, _ = await sessions.get(TENANT, session)
    assert lane.run_id == ""
