"""Runtime workers in this process on the real nats-server: two replicas deciding the same run at the same moment
append each decision once, because every append carries the version it was decided at."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from crashsafe.contracts.keys import run_id_for
from crashsafe.contracts.run_events import (
    ActionRequested,
    Budget,
    JournalEvent,
    ModelAnswered,
    RunEvent,
    RunStarted,
    UnknownEvent,
)
from crashsafe.contracts.subjects import EventClass, Namespace
from crashsafe.domain.fold import fold_run, replay
from crashsafe.domain.model_calls import model_answered
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_asks import wake_run
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.model import ResponsesModel
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.inprocess import REGISTRY
from tests.support.journals import decision_steps
from tests.support.runs import assert_replays
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKED_AND_PAID, BOOKING_TEXT, Sandbox, effects_per_run


@dataclass
class Workers:
    first: Runtime
    second: Runtime
    journal: RunJournal
    sandbox: Sandbox
    model: ResponsesModel


@pytest.fixture
async def workers(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[Workers]:
    """Two runtime workers (not yet consuming), every tool executor, and the sandbox with its scripted model."""
    async with inprocess.sandbox_server() as sandbox_url, AsyncExitStack() as running:
        settings = {
            name: inprocess.settings_for(
                nats_server.url,
                namespace,
                sandbox_url=sandbox_url,
                data_dir=tmp_path / "data",
                worker_id=name,
            )
            for name in ("runtime-a", "runtime-b", "executors")
        }
        for family in ("booking", "payment", "notify"):
            await running.enter_async_context(inprocess.executor(settings["executors"], family))
        model = await running.enter_async_context(inprocess.scripted_model(settings["executors"]))
        first = await running.enter_async_context(inprocess.runtime(settings["runtime-a"], model))
        second = await running.enter_async_context(inprocess.runtime(settings["runtime-b"], model))
        http = await running.enter_async_context(httpx.AsyncClient(timeout=10))
        yield Workers(first, second, RunJournal(broker, namespace), Sandbox(http, sandbox_url), model)


async def _a_run_whose_model_has_answered(workers: Workers, guest: str) -> str:
    """A booking run whose journal ends with the model's first answer (search hotels), journaled by a worker that
    then died: the next worker to touch the run must decide the search request."""
    key = unique("ev")
    now = datetime.now(UTC)
    started = RunStarted(
        run_id=run_id_for("", key),
        at=now,
        agent="booking",
        session_id=f"s-{key}",
        guest_id=guest,
        event_id=key,
        idempotency_key=key,
        input_hash="0" * 64,
        text=BOOKING_TEXT,
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
    )
    seq = await workers.journal.append(started, 0)
    state = fold_run(None, started)
    reply = await workers.model.answer(REGISTRY.agent("booking"), state.transcript)
    assert [c.name for c in reply.tool_calls] == ["search_hotels"]
    await workers.journal.append(model_answered(state, reply, now), seq)
    return started.run_id


async def _journal(workers: Workers, run_id: str) -> list[JournalEvent]:
    events, _ = await workers.journal.read(run_id)
    return events


async def test_two_workers_deciding_the_same_run_at_once_journal_one_decision(workers: Workers) -> None:
    guest = unique("guest")
    run_id = await _a_run_whose_model_has_answered(workers, guest)

    # Both workers are woken for the run at once (a reconciler and an operator, say) and hold it at the same
    # version; each decides "request the search" and appends it carrying the version it decided at.
    with inprocess.decide_together([workers.first, workers.second]) as contention:
        await asyncio.gather(
            inprocess.wake(workers.first, run_id, "test: two workers at once"),
            inprocess.wake(workers.second, run_id, "test: two workers at once"),
        )

    assert len(contention.arrived) == 2, "both workers must have decided the run"
    assert [type(e) for e in contention.won] == [ActionRequested], contention.won
    assert contention.conflicts == 1, "the second append must be refused: the run moved past its version"
    events = await _journal(workers, run_id)
    requested = [e for e in events if isinstance(e, ActionRequested)]
    assert [(r.step_no, r.tool) for r in requested] == [(2, "search_hotels")]
    assert decision_steps(events) == [1, 2]

    # The loser re-folded and moved on: both now take work from the streams and the run finishes.
    for worker in (workers.first, workers.second):
        await worker.start()

    async def ended() -> list[RunEvent] | None:
        events = await _journal(workers, run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    events = await eventually(ended, what=f"run {run_id} to end")
    state = replay(events)
    assert state is not None and state.status == "completed", state
    steps = decision_steps(events)
    assert steps == list(range(1, len(steps) + 1)), steps
    requested = [e for e in events if isinstance(e, ActionRequested)]
    assert len({r.step_no for r in requested}) == len(requested) == 3  # search, hold, pay
    assert_replays(events)
    ledger = await workers.sandbox.ledger(guest)
    assert ledger["counts"] == BOOKED_AND_PAID  # the email and CRM record are the projector's, not the run's
    assert effects_per_run(ledger["entries"], {guest: run_id}) == {
        run_id: {k: 1 for k in ("booking", "charge")}
    }
    assert sorted(e["key"] for e in ledger["entries"]) == sorted(
        r.key for r in requested if r.tool != "search_hotels"
    )


class _NewerJournal:
    """The journal of a newer runtime replica: after each model answer it journals an event type only it knows."""

    def __init__(self, journal: RunJournal) -> None:
        self._journal = journal
        self.wrote = 0

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
        seq = await self._journal.append(event, expected_seq, headers, after_end=after_end, subject=subject)
        if isinstance(event, ModelAnswered):
            future = {"type": "run.reflection.v2", "run_id": event.run_id, "at": event.at.isoformat()}
            published = await self._journal.broker.publish(
                self._journal.ns.run_event(event.run_id, EventClass.STEP),
                json.dumps(future).encode(),
                expected_subject_seq=seq,
                sequence_subject=self._journal.ns.run_events(event.run_id),
            )
            self.wrote += 1
            seq = published.seq
        return seq


async def test_an_old_and_a_new_replica_side_by_side_finish_a_booking_once(
    workers: Workers, broker: Broker, namespace: Namespace
) -> None:
    """A rolling upgrade: the new replica journals an event type the old one does not know; the old one keeps
    folding the run (skipping it), journals the outcomes it takes, and nothing is dead-lettered."""
    newer = _NewerJournal(workers.second.journal)
    workers.second.journal = newer  # type: ignore[assignment]
    for worker in (workers.first, workers.second):
        await worker.start()
    event_id = unique("ev")
    run_ids = [
        await submit_inbound(broker, namespace, f"{event_id}-{i}", agent="booking", text=BOOKING_TEXT)
        for i in range(4)
    ]

    async def ended() -> list[list[JournalEvent]] | None:
        journals = [(await workers.journal.read(run_id))[0] for run_id in run_ids]
        states = [replay(events) for events in journals]
        return journals if all(s is not None and s.terminal for s in states) else None

    journals = await eventually(ended, what="every run to end")
    assert newer.wrote > 0, "the new replica never answered a step"
    for run_id, events in zip(run_ids, journals, strict=True):
        state = replay(events)
        assert state is not None and state.status == "completed", (run_id, state)
        assert {e.type for e in events if isinstance(e, UnknownEvent)} <= {"run.reflection.v2"}
        ledger = await workers.sandbox.ledger(f"guest-{event_id}-{run_ids.index(run_id)}")
        assert ledger["counts"] == BOOKED_AND_PAID, (run_id, ledger["counts"])
    unknown = sum(isinstance(e, UnknownEvent) for events in journals for e in events)
    assert unknown == newer.wrote
    assert await dead_letters(broker, namespace) == []


async def test_a_worker_keeps_nothing_of_runs_that_ended_not_even_after_a_late_wake(
    workers: Workers, broker: Broker, namespace: Namespace
) -> None:
    """Ended runs leave no folded state, no lock and no deadline timer behind: each once stayed for every run the
    worker ever saw (a timer until the run's deadline, whose wake then read the finished run back into memory for
    good: 700 MB after 60,000 steps5 runs). A wake of an ended run reads it and lets it go again."""
    worker = workers.first
    await worker.start()
    event_id = unique("ev")
    run_ids = [
        await submit_inbound(broker, namespace, f"{event_id}-{i}", agent="booking", text=BOOKING_TEXT)
        for i in range(4)
    ]

    async def ended() -> bool:
        states = [replay((await workers.journal.read(run_id))[0]) for run_id in run_ids]
        return all(s is not None and s.terminal for s in states)

    await eventually(ended, what="every run to end")

    async def let_go() -> bool:
        return len(worker.runs) == 0 and worker.runs.locks == 0 and worker.deadlines.armed == 0

    await eventually(let_go, what="the worker to let every ended run go")

    woken = asyncio.Event()
    heed = worker.wake

    async def wake_noted(wake: Any, ctx: Any) -> None:
        await heed(wake, ctx)
        woken.set()

    worker.wake = wake_noted  # type: ignore[method-assign]
    await wake_run(broker, worker.settings, run_ids[0], "deadline passed with actions pending", "test")
    await asyncio.wait_for(woken.wait(), 10)
    assert (len(worker.runs), worker.runs.locks, worker.deadlines.armed) == (0, 0, 0)
    assert await dead_letters(broker, namespace) == []
