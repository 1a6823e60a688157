"""Runs that never wedge, against the real runtime on the real nats-server: a journal holding an event type this
version does not know, a deadline passing while a payment is pending (then failing late), pathological answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.errors import ErrorCode, ModelUnavailable
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    JournalEvent,
    ModelAnswered,
    ModelAsked,
    ModelRejected,
    Origin,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunStarted,
    ToolCall,
    ToolRejected,
    UnknownEvent,
    event_encoder,
)
from crashsafe.contracts.subjects import EventClass, Namespace
from crashsafe.contracts.tool_messages import ActionOutcome, OutcomeStatus, tool_encoder
from crashsafe.domain.agent import Agent
from crashsafe.domain.effect_audit import unknown_events
from crashsafe.domain.fold import replay
from crashsafe.domain.model_calls import ModelReply
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.run_asks import reconcile_run, wake_run
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import dead_letters, ensure_streams, submit_inbound
from tests.support.runs import SEARCH, Run, booked_run, call, started
from tests.support.waiting import eventually, unique


class Answers:
    """A model port that answers from a list, then says "done"; counts its calls."""

    def __init__(self, *replies: ModelReply) -> None:
        self.replies = list(replies)
        self.calls = 0

    async def answer(
        self, agent: Agent, items: tuple[dict[str, Any], ...], config: Any = None, deadline_at: Any = None
    ) -> ModelReply:
        self.calls += 1
        if self.replies:
            return self.replies.pop(0)
        return ModelReply("m", f"resp_{self.calls}", (), "done", 10, 5)


@pytest.fixture
def settings(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> Settings:
    return inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="rt-new")


@pytest.fixture
async def journal(broker: Broker, namespace: Namespace) -> AsyncIterator[RunJournal]:
    await ensure_streams(broker, namespace)
    yield RunJournal(broker, namespace)


async def _write(journal: RunJournal, events: list[RunEvent], future_after: int | None = None) -> str:
    """Journal hand-built events (a run another replica drove); optionally a newer writer's event after #n."""
    seq = 0
    for i, event in enumerate(events):
        seq = await journal.append(event, seq)
        if future_after == i:
            future = {
                "type": "run.reflection.v2",  # a tag only a newer runtime knows
                "run_id": event.run_id,
                "at": event.at.isoformat(),
                "step_no": 3,  # the step the newer writer took
                "thoughts": "written during a rolling upgrade",
            }
            published = await journal.broker.publish(
                journal.ns.run_event(event.run_id, EventClass.STEP),
                json.dumps(future).encode(),
                expected_subject_seq=seq,
                sequence_subject=journal.ns.run_events(event.run_id),
            )
            seq = published.seq
    return events[0].run_id


async def _events(journal: RunJournal, run_id: str) -> list[JournalEvent]:
    events, _ = await journal.read(run_id)
    return events


def _now_run(deadline_s: float = 90.0) -> Run:
    now = datetime.now(UTC)
    return Run(started(budget=Budget(deadline_s=deadline_s), at=now - timedelta(seconds=10)))


def _outcome(request: ActionRequested, status: OutcomeStatus, result: dict[str, Any]) -> bytes:
    return tool_encoder.encode(
        ActionOutcome(
            run_id=request.run_id,
            step_no=request.step_no,
            tool=request.tool,
            key=request.key,
            status=status,
            result=result,
        )
    )


async def test_an_unknown_event_type_is_kept_skipped_and_never_dead_letters_an_outcome(
    settings: Settings, broker: Broker, journal: RunJournal, namespace: Namespace
) -> None:
    run = _now_run()
    run.answer(SEARCH)
    (search,) = run.decide()
    assert isinstance(search, ActionRequested)
    run_id = await _write(journal, run.events, future_after=len(run.events) - 1)

    async with inprocess.runtime(settings, Answers()) as worker:
        await worker.start()
        # The receipt for the pending search arrives after the unknown event: it must be journaled, not dead-lettered.
        await broker.publish(
            namespace.outcomes(search.family, run_id),
            _outcome(search, OutcomeStatus.SUCCEEDED, {"hotels": []}),
        )

        async def ended() -> list[JournalEvent] | None:
            events = await _events(journal, run_id)
            state = replay(events)
            return events if state is not None and state.terminal else None

        events = await eventually(ended, what="the run to end")
    state = replay(events)
    assert state is not None and state.status == "completed", state
    assert state.unknown_events == ("run.reflection.v2",)
    assert [e.type for e in events if isinstance(e, UnknownEvent)] == [
        "run.reflection.v2"
    ]  # still in the journal
    assert any(isinstance(e, ActionCompleted) and e.key == search.key for e in events)
    # The unknown event took step 3: the runtime never reuses that step number (nor so its action key).
    answered = [e for e in events if isinstance(e, ModelAnswered)]
    assert [a.step_no for a in answered] == [1, 4]
    assert await dead_letters(broker, namespace) == []
    # The audit reads every journal tolerantly and names the run instead of failing.
    assert unknown_events(await journal.read_all()) == {run_id: ["run.reflection.v2"]}


async def test_past_its_deadline_a_run_hands_off_and_a_late_failed_payment_releases_the_hold(
    settings: Settings, broker: Broker, journal: RunJournal, namespace: Namespace
) -> None:
    run, booking_id = booked_run()
    # Rebase the journal on the real clock: the run's deadline is 3 seconds away.
    shift = datetime.now(UTC) + timedelta(seconds=3) - run.state.deadline_at
    run.answer(call("create_payment", {"booking_id": booking_id}))
    (pay,) = run.decide()
    assert isinstance(pay, ActionRequested)
    events = [_shifted(e, shift) for e in run.events]
    run_id = await _write(journal, events)

    async with inprocess.runtime(settings, Answers()) as worker:
        await worker.start()
        # No payment executor is running: the payment stays pending. Wake the run once, as a resume would.
        await wake_run(broker, settings, run_id, "test: pick the run up", "test")

        async def handed_off() -> list[JournalEvent] | None:
            events = await _events(journal, run_id)
            return events if any(isinstance(e, RunHandedOff) for e in events) else None

        # Nobody wakes it again: the runtime's own deadline wake does, and it hands off.
        events = await eventually(handed_off, timeout_s=15, what="the deadline hand-off")
        (handed,) = [e for e in events if isinstance(e, RunHandedOff)]
        assert handed.reason == "deadline" and pay.key in handed.detail
        assert not any(isinstance(e, ActionRequested) and e.origin == Origin.COMPENSATION for e in events)

        # An operator's `crashsafe reconcile` still asks about the key the ended run left pending, and the
        # runtime journals the nudge as evidence of who asked.
        done = await reconcile_run(broker, settings, run_id, by="operator:test")
        assert (done.status, done.asked) == ("handed_off", [pay.key])

        async def nudged() -> bool:
            events = await _events(journal, run_id)
            after = events[events.index(handed) + 1 :]
            return any(isinstance(e, RunNudged) and e.by == "operator:test" for e in after)

        await eventually(nudged, what="the nudge after the hand-off")

        # The reconciler's ask by key settles the payment late, as failed: the hold is released.
        await broker.publish(namespace.outcomes(pay.family, run_id), _outcome(pay, OutcomeStatus.FAILED, {}))

        async def released() -> list[JournalEvent] | None:
            events = await _events(journal, run_id)
            hit = [e for e in events if isinstance(e, ActionRequested) and e.tool == "release_booking"]
            return events if hit else None

        events = await eventually(released, what="the release of the hold")
    (release,) = [e for e in events if isinstance(e, ActionRequested) and e.tool == "release_booking"]
    assert release.origin == Origin.COMPENSATION and release.key.endswith(":release")
    failed = [e for e in events if isinstance(e, ActionCompleted) and e.key == pay.key]
    assert [e.status for e in failed] == [OutcomeStatus.FAILED]
    assert await dead_letters(broker, namespace) == []


def _shifted(event: RunEvent, by: timedelta) -> RunEvent:
    fields = {f: getattr(event, f) for f in event.__struct_fields__}
    for name, value in fields.items():
        if isinstance(value, datetime):
            fields[name] = value + by
    return msgspec.structs.replace(event, **fields)


async def test_oversized_arguments_and_an_answer_too_large_for_the_journal_never_wedge_the_run(
    settings: Settings, broker: Broker, journal: RunJournal, namespace: Namespace
) -> None:
    huge = ToolCall(call_id="c1", name="search_hotels", arguments=json.dumps({"city": "L" * 600_000}))
    model = Answers(
        ModelReply("m", "r1", (huge,), None, 100, 50),
        ModelReply("m", "r2", (), "x" * 1_200_000, 100, 300_000 // 1000),
        ModelReply("m", "r3", (), "Sorry, I can only answer briefly.", 100, 10),
    )
    async with inprocess.runtime(settings, model) as worker:
        await worker.start()
        run_id = await submit_inbound(broker, namespace, unique("ev"), agent="booking", text="Lisbon please")

        async def ended() -> list[JournalEvent] | None:
            events = await _events(journal, run_id)
            state = replay(events)
            return events if state is not None and state.terminal else None

        events = await eventually(ended, what="the run to end")
    kinds = [type(e) for e in events]
    assert kinds == [
        RunStarted,
        ModelAnswered,
        ToolRejected,
        ModelRejected,
        ModelAnswered,
        RunCompleted,
    ], kinds
    rejected = next(e for e in events if isinstance(e, ToolRejected))
    assert rejected.error.code == ErrorCode.TOOL_ARGUMENTS_TOO_LARGE
    refused = next(e for e in events if isinstance(e, ModelRejected))
    assert refused.error.code == ErrorCode.MODEL_ANSWER_TOO_LARGE and refused.answer_bytes > 1_000_000
    assert all(len(event_encoder.encode(e)) < 1024 * 1024 for e in events if not isinstance(e, UnknownEvent))
    assert model.calls == 3
    state = replay(events)
    assert state is not None and state.steps_used == 4  # answer, rejection, refused answer, final answer
    assert await dead_letters(broker, namespace) == []


class Failing(Answers):
    """A model that fails its first `n` calls, as an unavailable provider does."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    async def answer(
        self, agent: Agent, items: tuple[dict[str, Any], ...], config: Any = None, deadline_at: Any = None
    ) -> ModelReply:
        if self.calls < self.n:
            self.calls += 1
            raise ModelUnavailable("model m did not answer: 503", model="m")
        return await super().answer(agent, items)


async def test_every_failed_model_call_is_journaled_and_counts_against_the_step_budget(
    settings: Settings, broker: Broker, journal: RunJournal, namespace: Namespace
) -> None:
    model = Failing(3)
    async with inprocess.runtime(settings, model) as worker:
        await worker.start()
        run_id = await submit_inbound(broker, namespace, unique("ev"), agent="booking", text="hello")

        async def ended() -> list[JournalEvent] | None:
            events = await _events(journal, run_id)
            state = replay(events)
            return events if state is not None and state.terminal else None

        events = await eventually(ended, what="the run to end")
    state = replay(events)
    assert state is not None and state.status == "completed"
    assert model.calls == 4
    failed = [e for e in events if isinstance(e, ModelAsked) and e.failed]
    assert len(failed) == 3 and all("did not answer" in e.failed for e in failed)
    assert state.lost_asks == 3 and state.steps_used == 4  # three lost calls and the answer
