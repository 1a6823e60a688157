"""Approvals and session lanes with a real runtime, real executors, the sandbox and the real nats-server.

Until the policy engine holds actions back by itself, a test journals the hold as the runtime would have (the
run's first model answer, then `run.approval_requested` for its call): everything after is the product's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_decoder, inbound_encoder
from crashsafe.contracts.keys import run_id_for, tool_input_hash
from crashsafe.contracts.memory import SessionTurn
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    Budget,
    JournalEvent,
    RunCompleted,
    RunHandedOff,
    RunNudged,
    RunStarted,
    TurnReceived,
)
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain import approval_flow as rules
from crashsafe.domain.call_plan import approval_id_for
from crashsafe.domain.fold import fold_run, replay
from crashsafe.domain.model_calls import model_answered
from crashsafe.domain.open_work import awaiting_runs
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from
from crashsafe.services.records.approval_records import ApprovalRecords
from crashsafe.services.records.run_asks import wake_run
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lane_records import SessionRecords
from crashsafe.services.runtime.model import ResponsesModel
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import dead_letters
from tests.support.inprocess import REGISTRY
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT

TENANT = "t1"


@dataclass
class World:
    runtime: Runtime
    journal: RunJournal
    model: ResponsesModel
    broker: Broker
    ns: Namespace
    settings: Settings
    records: ApprovalRecords
    sessions: SessionRecords


@pytest.fixture
async def world(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[World]:
    """One runtime consuming its streams (inbound, outcomes, fired timers), every booking executor, the sandbox."""
    async with inprocess.sandbox_server() as sandbox_url, AsyncExitStack() as running:
        settings = {
            name: inprocess.settings_for(
                nats_server.url,
                namespace,
                sandbox_url=sandbox_url,
                data_dir=tmp_path / "data",
                worker_id=name,
            )
            for name in ("runtime", "executors")
        }
        for family in ("booking", "payment", "notify"):
            await running.enter_async_context(inprocess.executor(settings["executors"], family))
        model = await running.enter_async_context(inprocess.scripted_model(settings["executors"]))
        worker = await running.enter_async_context(inprocess.runtime(settings["runtime"], model))
        await worker.start()
        yield World(
            worker,
            RunJournal(broker, namespace),
            model,
            broker,
            namespace,
            settings["runtime"],
            ApprovalRecords(broker, namespace),
            SessionRecords(broker, namespace),
        )
        worker.stop_timers()


@dataclass(frozen=True)
class Held:
    run_id: str
    session_id: str
    guest_id: str
    approval: ApprovalRequested


def _booking_started(run_id: str, key: str, session: str, guest: str, now: datetime) -> RunStarted:
    """A booking run's first event, as the runtime journals it for the guest message `key`."""
    return RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=session,
        guest_id=guest,
        event_id=key,
        idempotency_key=key,
        input_hash="0" * 64,
        text=BOOKING_TEXT,
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
        tenant=TENANT,
    )


async def _held_run(world: World, *, ttl_s: float = 3600, approver: str = Approver.GUEST.value) -> Held:
    """A booking run in its own session whose first model call (the hotel search) a rule held back for approval,
    journaled as the runtime journals it; then the run is woken and goes to wait (record and timer made)."""
    key = unique("ev")
    session = f"s-{key}"
    run_id = run_id_for(TENANT, key)
    assert await world.sessions.claim(TENANT, session, run_id) == run_id
    now = datetime.now(UTC)
    started = _booking_started(run_id, key, session, f"g-{key}", now)
    seq = await world.journal.append(started, 0)
    state = fold_run(None, started)
    reply = await world.model.answer(REGISTRY.agent("booking"), state.transcript)
    (search,) = reply.tool_calls
    answered = model_answered(state, reply, now)
    seq = await world.journal.append(answered, seq)
    args = json.loads(search.arguments)
    held = ApprovalRequested(
        run_id=run_id,
        at=now,
        step_no=2,
        approval_id=approval_id_for(run_id, 2),
        call=search,
        tool=search.name,
        args=args,
        input_hash=tool_input_hash(search.name, args),
        approver=approver,
        rule="rule.test_hold",
        reason="held by the test's rule",
        expires_at=now + timedelta(seconds=ttl_s),
        question="Shall I search hotels in Lisbon?",
    )
    await world.journal.append(held, seq)
    await wake_run(world.broker, world.settings, run_id, "the test held an action", "test")
    await eventually(lambda: world.records.get(held.approval_id), what="the approval's record")
    return Held(run_id, session, started.guest_id, held)


async def _events(world: World, run_id: str) -> list[JournalEvent]:
    events, _ = await world.journal.read(run_id)
    return events


async def _ended(world: World, run_id: str) -> list[JournalEvent]:
    async def done() -> list[JournalEvent] | None:
        events = await _events(world, run_id)
        state = replay(events)
        return events if state is not None and state.terminal and not state.pending else None

    return await eventually(done, what=f"run {run_id} ended", timeout_s=90)


async def _released(world: World, session_id: str) -> bool:
    lane, _ = await world.sessions.get(TENANT, session_id)
    return lane.run_id == ""


def _decisions(events: list[JournalEvent]) -> list[ApprovalDecided]:
    return [e for e in events if isinstance(e, ApprovalDecided)]


async def _say(world: World, held: Held, text: str, guest: str | None = None) -> str:
    """A further guest message of `session`, as the gateway publishes it; returns its event id."""
    key = unique("turn")
    event = InboundEvent(
        key=key,
        run_id=run_id_for(TENANT, key),
        input_hash="1" * 64,
        message=InboundMessage(key, held.session_id, guest or held.guest_id, text),
        received_at=datetime.now(UTC),
        tenant=TENANT,
    )
    await world.broker.publish(
        world.ns.inbound(event.run_id), inbound_encoder.encode(event), msg_id=event.run_id
    )
    return key


async def test_a_waiting_run_holds_a_record_and_a_durable_timer_and_no_worker(world: World) -> None:
    held = await _held_run(world)
    stored = await world.records.get(held.approval.approval_id)
    assert stored is not None and stored.record.status == ApprovalStatus.PENDING
    assert stored.record.input_hash == held.approval.input_hash and stored.record.tenant == TENANT
    schedule = await world.broker.last_on_subject(
        world.ns.stream(StreamKind.TIMERS), world.ns.approval_timer(held.approval.approval_id)
    )
    assert schedule is not None and schedule.headers["Nats-Schedule"].startswith("@at ")
    # No handler is held while it waits; its folded state stays in the bounded run cache, so the guest's messages
    # meanwhile are journaled without folding the journal again (issue 17: a flood re-folded it per message).
    await eventually(lambda: not world.runtime.deliveries._tasks, what="no handler held while the run waits")
    assert held.run_id in world.runtime.runs


async def test_a_managers_approval_lets_the_exact_call_run(world: World) -> None:
    held = await _held_run(world, approver=Approver.MANAGER.value)
    now = datetime.now(UTC)
    moved, ours = await world.records.move(
        held.approval.approval_id, lambda r: rules.decide(r, "approved", "manager:ana", "fine", now)
    )
    assert ours and moved is not None
    await wake_run(world.broker, world.settings, held.run_id, "approval decided", "test")
    events = await _ended(world, held.run_id)
    (decided,) = _decisions(events)
    assert (decided.decision, decided.decided_by, decided.input_hash) == (
        "approved",
        "manager:ana",
        held.approval.input_hash,
    )
    after = events[events.index(decided) :]
    searches = [e for e in after if isinstance(e, ActionRequested) and e.tool == "search_hotels"]
    assert [s.input_hash for s in searches] == [held.approval.input_hash]
    assert isinstance(events[-1], RunCompleted)
    # The decided approval's schedule is purged: it will never fire a needless wake.
    assert (
        await world.broker.last_on_subject(
            world.ns.stream(StreamKind.TIMERS), world.ns.approval_timer(held.approval.approval_id)
        )
        is None
    )


async def test_an_approval_nobody_decides_expires_by_the_durable_timer(world: World) -> None:
    held = await _held_run(world, ttl_s=2)
    events = await _ended(world, held.run_id)
    (decided,) = _decisions(events)
    assert (decided.decision, decided.decided_by) == ("expired", "timer")
    # What woke the run was the fired schedule (its body is a wake `by` the timer), not the test or a reconciler.
    assert any(isinstance(e, RunNudged) and e.by == "timer" for e in events)
    assert not any(isinstance(e, ActionRequested) and e.tool == "search_hotels" for e in events)
    last = events[-1]
    assert isinstance(last, RunCompleted) and "not given in time" in last.reply
    stored = await world.records.get(held.approval.approval_id)
    assert stored is not None and stored.record.status == ApprovalStatus.EXPIRED


async def test_the_guests_yes_in_the_same_session_reaches_the_run_that_asked(world: World) -> None:
    held = await _held_run(world)
    said = await _say(world, held, "yes please")
    events = await _ended(world, held.run_id)
    (decided,) = _decisions(events)
    assert decided.decision == "approved" and decided.decided_by.startswith("guest:")
    assert decided.turn_event_id == said
    assert [e.event_id for e in events if isinstance(e, TurnReceived)] == [said]
    # The "yes" started no run of its own.
    assert await _events(world, run_id_for(TENANT, said)) == []
    lane, _ = await world.sessions.get(TENANT, held.session_id)
    assert lane.run_id == "" and [t.run_id for t in lane.history] == [held.run_id]


async def test_the_guests_no_rejects_and_goes_to_the_model(world: World) -> None:
    held = await _held_run(world)
    await _say(world, held, "no, Porto instead")
    events = await _ended(world, held.run_id)
    (decided,) = _decisions(events)
    assert (decided.decision, decided.reason, decided.turn_event_id) == ("rejected", "no, Porto instead", "")
    state = replay(events)
    assert state is not None
    assert {"role": "user", "content": "no, Porto instead"} in state.transcript
    stored = await world.records.get(held.approval.approval_id)
    assert stored is not None and stored.record.decided_by.startswith("guest:")


async def test_a_decision_after_the_record_was_decided_changes_nothing(world: World) -> None:
    held = await _held_run(world)
    now = datetime.now(UTC)
    await world.records.move(
        held.approval.approval_id, lambda r: rules.decide(r, "rejected", "manager:ana", "", now)
    )
    # The guest's "yes" comes after the manager's "no": the record is the authority.
    said = await _say(world, held, "yes")
    events = await _ended(world, held.run_id)
    (decided,) = _decisions(events)
    assert (decided.decision, decided.decided_by) == ("rejected", "manager:ana")
    state = replay(events)
    assert state is not None and said in state.turn_ids


async def test_concurrent_messages_of_one_session_are_each_journaled_once_by_one_owner_at_a_time(
    world: World,
) -> None:
    session = unique("s")
    keys = [unique("m") for _ in range(8)]

    async def post(key: str, index: int) -> None:
        event = InboundEvent(
            key=key,
            run_id=run_id_for(TENANT, key),
            input_hash=f"{index}" * 64,
            message=InboundMessage(key, session, "g-1", BOOKING_TEXT if index == 0 else f"and also {index}"),
            received_at=datetime.now(UTC),
            tenant=TENANT,
        )
        await world.broker.publish(
            world.ns.inbound(event.run_id), inbound_encoder.encode(event), msg_id=event.run_id
        )

    await asyncio.gather(*(post(k, i) for i, k in enumerate(keys)))

    async def settled() -> dict[str, list[JournalEvent]] | None:
        journals = {k: await _events(world, run_id_for(TENANT, k)) for k in keys}
        runs = {k: e for k, e in journals.items() if e}
        seen = [e.event_id for ev in runs.values() for e in ev if isinstance(e, (RunStarted, TurnReceived))]
        ended = all((s := replay(ev)) is not None and s.terminal for ev in runs.values())
        return runs if sorted(seen) == sorted(keys) and ended else None

    runs = await eventually(settled, what="every message journaled and every run ended", timeout_s=120)
    seen = [e.event_id for ev in runs.values() for e in ev if isinstance(e, (RunStarted, TurnReceived))]
    assert sorted(seen) == sorted(keys) and len(seen) == len(set(seen))  # each message exactly once

    # One owner at a time: a run of the session starts only after the one before it ended.
    def span(events: list[JournalEvent]) -> tuple[datetime, datetime]:
        end = next(e.at for e in events if isinstance(e, (RunCompleted, RunHandedOff)))
        return events[0].at, end

    spans = sorted(span(ev) for ev in runs.values())
    for (_, ended), (begun, _) in zip(spans, spans[1:], strict=False):
        assert begun >= ended
    # In order: the session's messages are taken in the order the inbound stream holds them.
    arrived = {
        k: (
            await world.broker.last_on_subject(
                world.ns.stream(StreamKind.INBOUND), world.ns.inbound(run_id_for(TENANT, k))
            )
        )
        for k in keys
    }
    by_stream = sorted(keys, key=lambda k: arrived[k].seq if arrived[k] else 0)
    taken = [
        e.event_id
        for ev in sorted(runs.values(), key=lambda ev: ev[0].at)
        for e in ev
        if isinstance(e, (RunStarted, TurnReceived))
    ]
    assert taken == by_stream
    turns = sum(isinstance(e, TurnReceived) for ev in runs.values() for e in ev)
    print(f"8 messages: {len(runs)} run(s), {turns} turn(s)")
    lane, _ = await world.sessions.get(TENANT, session)
    assert lane.run_id == ""


async def test_a_decision_whose_wake_was_lost_is_journaled_by_the_reconcilers_backstop(world: World) -> None:
    async with inprocess.reconciler(world.settings) as reconciler:
        held = await _held_run(world, approver=Approver.MANAGER.value)
        now = datetime.now(UTC)
        # The gateway's compare-and-set landed, and the gateway died before it woke the run.
        await world.records.move(
            held.approval.approval_id, lambda r: rules.decide(r, "approved", "manager:ana", "", now)
        )

        async def seen() -> bool:
            return any(w.approval_id == held.approval.approval_id for w in awaiting_runs(reconciler.work))

        await eventually(seen, what="the reconciler follows the waiting run")
        # Quiet for an hour: a waiting run is not stalled, and it is woken once for its decided record.
        await reconciler.tick(datetime.now(UTC) + timedelta(hours=1))
        events = await _ended(world, held.run_id)
    (decided,) = _decisions(events)
    assert (decided.decision, decided.decided_by) == ("approved", "manager:ana")
    # The test's own wake put the run to wait; the reconciler's is the one that found the decision.
    assert [e.by for e in events if isinstance(e, RunNudged)] == ["test", reconciler.worker]


async def test_another_guests_yes_in_the_session_never_answers_the_run(world: World, broker: Broker) -> None:
    """Past the gateway's check (the session changed hands after its 202), another guest's message never answers
    the run: it becomes its own run, outside the lane. It was a dead letter (`session_of_another_guest`) before:
    an accepted message lost."""
    held = await _held_run(world)
    # The lane as a gateway now claims it (with the owner's guest), and something the owner said earlier.
    earlier = SessionTurn(
        run_id="run_earlier", text="my card ends in 4242", reply="noted", guest_id=held.guest_id
    )
    await world.sessions.change(
        TENANT,
        held.session_id,
        lambda lane: msgspec.structs.replace(lane, guest_id=held.guest_id, history=[earlier]),
    )
    said = await _say(world, held, "yes", guest="mallory")
    own = run_id_for(TENANT, said)

    async def started() -> list[JournalEvent]:
        return await _events(world, own)

    first, *_ = await eventually(started, what="the stranger's message started its own run")
    assert isinstance(first, RunStarted) and (first.guest_id, first.event_id) == ("mallory", said)
    assert first.history == []  # nothing of the session's owner is shown to another guest's run
    state = replay(await _events(world, held.run_id))
    assert state is not None and state.awaiting is not None and state.turn_ids == ()
    stored = await world.records.get(held.approval.approval_id)
    assert stored is not None and stored.record.status == ApprovalStatus.PENDING
    lane, _ = await world.sessions.get(TENANT, held.session_id)
    assert (lane.run_id, lane.guest_id, lane.history) == (held.run_id, held.guest_id, [earlier])
    assert await dead_letters(broker, world.ns) == []


async def test_a_turn_that_comes_again_after_its_run_ended_starts_no_second_run(world: World) -> None:
    held = await _held_run(world)
    said = await _say(world, held, "yes")
    await _ended(world, held.run_id)
    stored = await world.broker.last_on_subject(
        world.ns.stream(StreamKind.INBOUND), world.ns.inbound(run_id_for(TENANT, said))
    )
    assert stored is not None
    # The handler that journaled the turn died before its ack: the message comes again, after the run ended.
    event = inbound_decoder.decode(stored.data)
    await world.runtime.admit(event, context_from(None), redelivered=True)
    assert await _events(world, run_id_for(TENANT, said)) == []
    await eventually(lambda: _released(world, held.session_id), what="the session is free, not the turn's")


async def test_a_turn_that_comes_again_joins_no_later_run_of_its_session(world: World) -> None:
    """The run that took the turn ended, and the guest's next message started a run that is still active: the
    turn delivered again belongs to the ended run, not as a second turn of the active one (it was, once the check
    moved past the lane's read, until it was asked on every path)."""
    held = await _held_run(world)
    said = await _say(world, held, "yes")
    await _ended(world, held.run_id)
    # The run's end is journaled before its lane is let go (a KV write after the append).
    await eventually(lambda: _released(world, held.session_id), what="the ended run let go of its session")
    key = unique("later")
    later = run_id_for(TENANT, key)
    assert await world.sessions.claim(TENANT, held.session_id, later) == later
    await world.journal.append(
        _booking_started(later, key, held.session_id, held.guest_id, datetime.now(UTC)), 0
    )
    stored = await world.broker.last_on_subject(
        world.ns.stream(StreamKind.INBOUND), world.ns.inbound(run_id_for(TENANT, said))
    )
    assert stored is not None
    await world.runtime.admit(inbound_decoder.decode(stored.data), context_from(None), redelivered=True)
    assert [e for e in await _events(world, later) if isinstance(e, TurnReceived)] == []
    assert await _events(world, run_id_for(TENANT, said)) == []


@pytest.mark.parametrize("redelivered", [True, False], ids=["redelivered", "first-delivery-that-stalled"])
async def test_a_turn_that_comes_again_after_many_runs_of_its_session_is_found_by_its_mark(
    world: World, redelivered: bool
) -> None:
    """The run that took the turn ended, and the session has had more runs since than its lane remembers (each
    message after it became a run of its own, as a guest's burst does once the first run ends), and the gateway's
    answer named no run: the turn delivered again is found by its turn mark, not joined to the session's run. Also
    as its first delivery, whose handler stalled past the ack wait while another replica took it."""
    held = await _held_run(world)
    said = await _say(world, held, "yes")
    await _ended(world, held.run_id)
    await eventually(lambda: _released(world, held.session_id), what="the ended run let go of its session")
    message_run = run_id_for(TENANT, said)
    assert await world.sessions.turn_mark(TENANT, message_run) == held.run_id
    since = [
        SessionTurn(run_id=run_id_for(TENANT, unique("since")), text="and?", reply="ok") for _ in range(6)
    ]
    later_key = unique("later")
    later = run_id_for(TENANT, later_key)
    await world.sessions.change(
        TENANT,
        held.session_id,
        lambda lane: msgspec.structs.replace(lane, run_id=later, guest_id=held.guest_id, history=since[-5:]),
    )
    await world.journal.append(
        _booking_started(later, later_key, held.session_id, held.guest_id, datetime.now(UTC)), 0
    )
    stored = await world.broker.last_on_subject(
        world.ns.stream(StreamKind.INBOUND), world.ns.inbound(message_run)
    )
    assert stored is not None and inbound_decoder.decode(stored.data).turn_of == ""
    await world.runtime.admit(
        inbound_decoder.decode(stored.data), context_from(None), redelivered=redelivered
    )
    assert [e for e in await _events(world, later) if isinstance(e, TurnReceived)] == []
    assert await _events(world, message_run) == []
    turns = [e for e in await _events(world, held.run_id) if isinstance(e, TurnReceived)]
    assert [t.event_id for t in turns] == [said]


async def test_a_turn_that_overtakes_its_owners_first_message_starts_the_owner_first(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """The gateway claimed the session for message A and published it, and B (a turn of A) is handled first:
    the runtime starts A from its inbound message, then journals B as A's turn (a runtime not consuming, driven
    by hand, so the order is the test's)."""
    async with inprocess.sandbox_server() as sandbox_url:
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=sandbox_url, data_dir=tmp_path / "data", worker_id="rt"
        )
        async with inprocess.scripted_model(settings) as model, inprocess.runtime(settings, model) as worker:
            session = unique("s")

            def message(key: str, text: str, turn_of: str = "") -> InboundEvent:
                return InboundEvent(
                    key=key,
                    run_id=run_id_for(TENANT, key),
                    input_hash="2" * 64,
                    message=InboundMessage(key, session, "g-1", text),
                    received_at=datetime.now(UTC),
                    tenant=TENANT,
                    turn_of=turn_of,
                )

            first = message(unique("a"), BOOKING_TEXT)
            sessions = SessionRecords(broker, namespace)
            assert await sessions.claim(TENANT, session, first.run_id) == first.run_id
            await broker.publish(namespace.inbound(first.run_id), inbound_encoder.encode(first))
            second = message(unique("b"), "a quiet room, please", turn_of=first.run_id)
            await worker.admit(second, context_from(None))
            journal = RunJournal(broker, namespace)
            events, _ = await journal.read(first.run_id)
            assert isinstance(events[0], RunStarted) and events[0].event_id == first.message.event_id
            assert [e.event_id for e in events if isinstance(e, TurnReceived)] == [second.message.event_id]
            assert (await journal.read(second.run_id))[0] == []
            # A's own message, handled now, joins the run it already is.
            await worker.admit(first, context_from(None))
            events, _ = await journal.read(first.run_id)
            assert sum(isinstance(e, RunStarted) for e in events) == 1


async def _first_run_in(world: World, session: str, guest: str, text: str) -> RunStarted:
    """A guest's message in a free session, as the gateway publishes it; the run.started it is journaled as."""
    key = unique("ev")
    event = InboundEvent(
        key=key,
        run_id=run_id_for(TENANT, key),
        input_hash="3" * 64,
        message=InboundMessage(key, session, guest, text),
        received_at=datetime.now(UTC),
        tenant=TENANT,
    )
    await world.broker.publish(
        world.ns.inbound(event.run_id), inbound_encoder.encode(event), msg_id=event.run_id
    )

    async def started() -> list[JournalEvent]:
        return await _events(world, event.run_id)

    first, *_ = await eventually(started, what=f"{guest}'s run started")
    assert isinstance(first, RunStarted) and first.guest_id == guest
    return first


async def test_turns_recorded_before_turns_carried_their_guest_are_given_only_to_their_runs_guest(
    world: World,
) -> None:
    """A lane an older runtime wrote has turns with no guest on them: each is attributed by its run's run.started,
    so the new guest of a reused session id is given none of them, the guest who said them is given theirs, and
    a turn whose journal is gone is given to nobody."""
    ana, bob = unique("ana"), unique("bob")
    key = unique("ev")
    anas_run = run_id_for(TENANT, key)
    now = datetime.now(UTC)
    await world.journal.append(
        RunStarted(
            run_id=anas_run,
            at=now,
            agent="booking",
            session_id="s-earlier",
            guest_id=ana,
            event_id=key,
            idempotency_key=key,
            input_hash="0" * 64,
            text="my card ends in 4242",
            budget=Budget(),
            deadline_at=now + timedelta(seconds=Budget().deadline_s),
            tenant=TENANT,
        ),
        0,
    )
    older = [
        SessionTurn(run_id=anas_run, text="my card ends in 4242", reply="noted"),
        SessionTurn(run_id=run_id_for(TENANT, unique("gone")), text="door code 7781", reply="ok"),
    ]
    sessions = {guest: unique("s") for guest in (ana, bob)}
    for session in sessions.values():
        await world.sessions.change(
            TENANT, session, lambda lane: msgspec.structs.replace(lane, history=older)
        )
    bobs = await _first_run_in(world, sessions[bob], bob, "hello")
    assert bobs.history == []
    anas = await _first_run_in(world, sessions[ana], ana, "a quiet room, please")
    assert anas.history == [msgspec.structs.replace(older[0], guest_id=ana)]
