"""The reconciler in this process on the real nats-server: it reads the journals of runs it follows, and its own request to
resolve a key is what settles an unknown outcome that nothing else will ever ask about again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from nats.aio.msg import Msg

from crashsafe.contracts.errors import BrokerUnavailable, CrashsafeError
from crashsafe.contracts.inbound import InboundEvent, inbound_encoder
from crashsafe.contracts.journal_bus import request_for
from crashsafe.contracts.keys import action_key, input_hash, run_id_for
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    HandOffReason,
    JournalEvent,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunStarted,
    TurnReceived,
)
from crashsafe.contracts.subjects import EventClass, Namespace
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.fold import replay
from crashsafe.domain.open_work import unsettled_unknowns
from crashsafe.natsd import NatsServer
from crashsafe.services.executor.service import Executor
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.reconciler.service import Reconciler
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.runs import inbound_of
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT, Sandbox


@dataclass
class World:
    reconciler: Reconciler
    payments: Executor
    journal: RunJournal
    sandbox: Sandbox


@pytest.fixture
async def world(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[World]:
    """A runtime, a payment executor and a reconciler in this process, in front of the in-process sandbox."""
    async with inprocess.sandbox_server() as sandbox_url, AsyncExitStack() as running:
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=sandbox_url, data_dir=tmp_path / "data", worker_id="r"
        )
        runtime = await running.enter_async_context(inprocess.runtime(settings))
        await runtime.start()  # journals outcomes; the runs here never ask the model
        payments = await running.enter_async_context(inprocess.executor(settings, "payment"))
        reconciler = await running.enter_async_context(inprocess.reconciler(settings))
        http = await running.enter_async_context(httpx.AsyncClient(base_url=sandbox_url, timeout=10))
        yield World(reconciler, payments, RunJournal(broker, namespace), Sandbox(http, sandbox_url))


async def _journal_a_payment_intent(journal: RunJournal, booking: dict[str, Any]) -> ActionRequested:
    """A booking run that journaled its intent to charge for a held booking (the steps before are not needed)."""
    key = unique("ev")
    run_id, now = run_id_for("", key), datetime.now(UTC)
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=f"s-{key}",
        guest_id=booking["guest_id"],
        event_id=key,
        idempotency_key=key,
        input_hash="0" * 64,
        text=BOOKING_TEXT,
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
    )
    args = {
        "booking_id": booking["booking_id"],
        "guest_id": booking["guest_id"],
        "amount_cents": booking["total_cents"],
        "currency": "EUR",
    }
    intent = ActionRequested(
        run_id=run_id,
        at=now,
        step_no=1,
        call_id="call_pay",
        tool="create_payment",
        family="payment",
        args=args,
        key=action_key(run_id, 1),
        input_hash=input_hash({"tool": "create_payment", "args": args}),
        timeout_s=10.0,
        deadline_at=now + timedelta(seconds=10),
    )
    await journal.append(intent, await journal.append(started, 0))
    return intent


async def _events(world: World, run_id: str) -> list[RunEvent]:
    events, _ = await world.journal.read(run_id)
    return events


async def test_the_reconcilers_resolve_request_settles_an_unknown_outcome_of_a_handed_off_run(
    world: World,
) -> None:
    held = await world.sandbox.http.post(
        "/bookings",
        json={
            "hotel_id": "lis-1",
            "guest_id": unique("guest"),
            "check_in": "2031-12-01",
            "check_out": "2031-12-03",
        },
        headers={"Idempotency-Key": unique("setup")},
    )
    assert held.status_code == 201, held.text
    intent = await _journal_a_payment_intent(world.journal, held.json())
    request = request_for(intent)
    unknown_calls = _sample("crashsafe_provider_calls_total", tool=intent.tool, outcome="unknown")
    found = _sample("crashsafe_lookups_total", tool=intent.tool, answer="found")

    # The charge goes through but its answer is lost, and every lookup by key is refused, until the executor's
    # last delivery: the run is told `unknown` and hands off. No message for the key is left anywhere.
    await world.sandbox.arm("payments", drop_after_commit=1)
    await world.sandbox.arm("lookups", fail_5xx=100)
    with pytest.raises(CrashsafeError):
        await inprocess.deliver(world.payments, request, 1)
    await inprocess.deliver(world.payments, request, inprocess.last_delivery(world.payments))

    async def handed_off() -> list[RunEvent] | None:
        events = await _events(world, intent.run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    events = await eventually(handed_off, what="the run to hand off")
    state = replay(events)
    assert state is not None and (state.status, state.handoff_reason) == ("handed_off", "outcome_unknown")
    assert [d.status for r, d in state.completed if r.key == intent.key] == ["unknown"]
    assert _sample("crashsafe_provider_calls_total", tool=intent.tool, outcome="unknown") > unknown_calls

    def counted_open() -> bool:
        world.reconciler.report_unknowns()  # what each tick ends with, without asking anything yet
        return _sample("crashsafe_unknown_outcomes_open", tool=intent.tool) == 1

    await eventually(counted_open, what="the reconciler to count the open unknown outcome")
    await world.sandbox.clear_faults()

    # An ended run is never woken to republish its requests: only the reconciler's own ask can reach the executor.
    now = datetime.now(UTC)

    async def settled() -> ActionCompleted | None:
        await world.reconciler.tick(now)
        done = [
            e
            for e in await _events(world, intent.run_id)
            if isinstance(e, ActionCompleted) and e.key == intent.key and e.status == "succeeded"
        ]
        return done[0] if done else None

    late = await eventually(settled, what="the unknown payment to settle by key", timeout_s=30)

    (charge,) = [e for e in (await world.sandbox.ledger())["entries"] if e["kind"] == "charge"]
    assert (late.via, late.provider_ref) == ("provider_lookup", charge["ref"])
    assert ("provider.lookup", "found") in [(e.asked, e.answer) for e in late.evidence]
    assert world.reconciler.resolutions >= 1
    state = replay(await _events(world, intent.run_id))
    assert (
        state is not None and state.status == "handed_off"
    )  # the journal learns the truth; the run stays ended
    assert [d.status for r, d in state.completed if r.key == intent.key] == ["succeeded"]
    assert (await world.sandbox.ledger())["replays"]["charge"] == 0  # found by key, never charged again
    assert _sample("crashsafe_lookups_total", tool=intent.tool, answer="found") > found

    # And the reconciler stops asking about it.
    async def forgotten() -> bool:
        return not unsettled_unknowns(
            world.reconciler.work, now + timedelta(hours=1), world.reconciler.reask_s
        )

    assert await eventually(forgotten, what="the reconciler to drop the settled key")
    await world.reconciler.tick(now)
    assert _sample("crashsafe_unknown_outcomes_open", tool=intent.tool) == 0


def _sample(name: str, **labels: str) -> float:
    """This process's metric (the in-process services share its registry)."""
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_run_is_judged_only_on_its_journal_read_to_now(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """The reconciler follows an accepted run's inbound message and reads its journal only when something in it
    may be due: an action past its deadline is asked about only once a read shows it still pending, and one
    whose completion the read finds is left alone. (No runtime here: it would take the inbound messages.)"""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="j")
    journal = RunJournal(broker, namespace)
    async with inprocess.reconciler(settings) as reconciler:
        # The first look before the payments' deadlines (10 s): the runs are read while still pending.
        reconciler.cadence = replace(reconciler.cadence, first_s=3.0)
        settled = await _journal_a_payment_intent(
            journal, {"booking_id": "b1", "guest_id": "g1", "total_cents": 1}
        )
        pending = await _journal_a_payment_intent(
            journal, {"booking_id": "b2", "guest_id": "g2", "total_cents": 1}
        )
        for intent in (settled, pending):
            await _accept(broker, namespace, journal, intent)
        await eventually(
            lambda: {settled.run_id, pending.run_id} <= set(reconciler.work.looks),
            what="the accepted runs followed",
        )
        assert not reconciler.work.runs  # not read yet: nothing in them can be due so soon

        # Read once before their deadlines: both pending. Then one's completion is journaled, and nobody says so.
        await reconciler.tick(settled.at + timedelta(seconds=reconciler.cadence.first_s + 0.5))
        assert set(reconciler.work.runs) == {settled.run_id, pending.run_id}
        seq = (await journal.read(settled.run_id))[1]
        completion = ActionCompleted(
            run_id=settled.run_id,
            at=datetime.now(UTC),
            step_no=1,
            key=settled.key,
            status=OutcomeStatus.FAILED,
        )
        await journal.append(completion, seq)

        overdue_at = max(settled.deadline_at, pending.deadline_at) + timedelta(seconds=reconciler.grace_s + 1)
        reconciler.looks_per_tick = 0  # no read this tick: neither run is judged on what was read before
        await reconciler.tick(overdue_at)
        assert reconciler.resolutions == 0

        reconciler.looks_per_tick = 500
        await reconciler.tick(
            overdue_at
        )  # read to now: only the run still pending past its deadline is asked
        assert reconciler.resolutions == 1
        assert not reconciler.work.runs[settled.run_id].pending
        assert [r.key for r in reconciler.work.runs[pending.run_id].pending.values()] == [pending.key]


async def _accept(
    broker: Broker, namespace: Namespace, journal: RunJournal, intent: ActionRequested
) -> InboundEvent:
    """The run's inbound message, as the gateway publishes it when it accepts the run."""
    started = (await journal.read(intent.run_id))[0][0]
    assert isinstance(started, RunStarted)
    accepted = inbound_of(started)
    await broker.publish(namespace.inbound(started.run_id), inbound_encoder.encode(accepted))
    return accepted


async def test_a_run_that_ends_while_its_journal_is_being_read_is_not_brought_back_open(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """A tick's look at a run and the run's end (a milestone, followed at the same time) race: the look's read
    was answered before the end was journaled, and is observed after the end was. The run must stay ended: an
    open run brought back from a stale read would have no look left, be judged quiet forever and woken every
    quiet period (and its pending actions asked about) until the reconciler restarts."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="z")
    journal = RunJournal(broker, namespace)
    async with inprocess.reconciler(settings) as reconciler:
        intent = await _followed_payment(reconciler, broker, namespace, journal)

        answered, release = asyncio.Event(), asyncio.Event()
        read_after = reconciler.journal.read_after

        async def slow_read(run_id: str, after_seq: int) -> list[tuple[int, JournalEvent]]:
            stored = await read_after(run_id, after_seq)
            if not answered.is_set():  # the tick's read: answered now, observed only once the end is followed
                answered.set()
                await release.wait()
            return stored

        reconciler.journal.read_after = slow_read  # type: ignore[method-assign]
        now = intent.at + timedelta(seconds=reconciler.cadence.first_s + 0.5)
        ticking = asyncio.create_task(reconciler.tick(now))
        await eventually(answered.is_set, what="the tick reading the run")
        seq = (await journal.read(intent.run_id))[1]
        seq = await journal.append(
            ActionCompleted(
                run_id=intent.run_id,
                at=datetime.now(UTC),
                step_no=1,
                key=intent.key,
                status=OutcomeStatus.SUCCEEDED,
            ),
            seq,
        )
        await journal.append(RunCompleted(run_id=intent.run_id, at=datetime.now(UTC), reply="done"), seq)
        await eventually(lambda: intent.run_id not in reconciler.work.looks, what="the run's end followed")
        release.set()
        await ticking

        later = now + timedelta(seconds=reconciler.quiet_s + 1)
        await reconciler.tick(later)
        await reconciler.tick(intent.deadline_at + timedelta(seconds=reconciler.quiet_s * 2))
        assert intent.run_id not in reconciler.work.runs
        assert reconciler.wakes == 0 and reconciler.resolutions == 0


async def test_a_hand_off_whose_read_fails_is_read_on_the_next_tick_and_its_projections_still_checked(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """A hand-off is followed as a milestone and the run's journal read to it there and then. NATS not answering
    that read must not lose the hand-off: the run is read on the next tick (not judged on the older read until
    then), and its projections are checked later all the same."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="f")
    journal = RunJournal(broker, namespace)
    async with inprocess.reconciler(settings) as reconciler:
        intent = await _followed_payment(reconciler, broker, namespace, journal)
        await reconciler.tick(intent.at + timedelta(seconds=reconciler.cadence.first_s + 0.5))
        assert intent.run_id in reconciler.work.runs  # read once: its payment pending, due at its deadline

        failed = asyncio.Event()
        read_after = reconciler.journal.read_after

        async def unavailable(run_id: str, after_seq: int) -> list[tuple[int, JournalEvent]]:
            if not failed.is_set():
                failed.set()
                raise BrokerUnavailable("journal read refused (test)")
            return await read_after(run_id, after_seq)

        reconciler.journal.read_after = unavailable  # type: ignore[method-assign]
        handed = RunHandedOff(
            run_id=intent.run_id, at=datetime.now(UTC), reason=HandOffReason.DEADLINE, detail="test"
        )
        await journal.append(handed, (await journal.read(intent.run_id))[1])
        await eventually(failed.is_set, what="the hand-off's read refused")
        await asyncio.sleep(0.2)  # the follower's handler has returned (or raised)

        await reconciler.tick(datetime.now(UTC) + timedelta(seconds=1))
        assert intent.run_id not in reconciler.work.runs
        assert (intent.run_id, intent.key) in reconciler.work.unknown
        assert intent.run_id in reconciler.projection_checks.ended.runs


async def test_a_turns_own_id_is_let_go_once_its_run_journaled_it_and_kept_while_it_did_not(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """A message sent as a turn of a running run: its own id starts a run only if the session's lane moved by the
    time the runtime takes it, however late that is. So the reconciler lets the id go once the run it was sent to
    journaled it as a turn, and keeps reading it until then."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="t")
    journal = RunJournal(broker, namespace)
    async with inprocess.reconciler(settings) as reconciler:
        owner = await _journal_a_payment_intent(
            journal, {"booking_id": "b", "guest_id": "g", "total_cents": 1}
        )
        first = await _accept(broker, namespace, journal, owner)
        turns = {}
        for name in ("joined", "queued"):
            turn = msgspec.structs.replace(
                first,
                key=unique(name),
                run_id=run_id_for("", unique(name)),
                message=msgspec.structs.replace(first.message, event_id=unique(name)),
                turn_of=owner.run_id,
            )
            await broker.publish(namespace.inbound(turn.run_id), inbound_encoder.encode(turn))
            turns[name] = turn
        await eventually(
            lambda: {t.run_id for t in turns.values()} <= set(reconciler.work.looks),
            what="the turns accepted",
        )
        joined = TurnReceived(
            run_id=owner.run_id, at=datetime.now(UTC), event_id=turns["joined"].message.event_id, text="more"
        )
        await journal.append(joined, (await journal.read(owner.run_id))[1])

        await reconciler.tick(datetime.now(UTC) + timedelta(seconds=reconciler.cadence.first_s + 0.5))
        assert turns["joined"].run_id not in reconciler.work.looks
        assert turns["queued"].run_id in reconciler.work.looks


async def test_a_restarted_reconciler_reads_no_journal_of_a_run_that_ended_in_its_look_back_window(
    nats_server: NatsServer,
    namespace: Namespace,
    broker: Broker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reconciler that starts replays the window's inbound messages and milestones with two followers, in no
    set order between them. A run whose end it followed first must not be read when its message comes after:
    at 85 runs/s a day of ended runs is millions of reads at 500 a tick, served oldest first, ahead of the runs
    that may be due."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="s")
    await inprocess.provisioned(settings)
    journal = RunJournal(broker, namespace)
    for n in range(30):
        intent = await _journal_a_payment_intent(
            journal, {"booking_id": f"b{n}", "guest_id": "g", "total_cents": 1}
        )
        await _accept(broker, namespace, journal, intent)
        seq = (await journal.read(intent.run_id))[1]
        completion = ActionCompleted(
            run_id=intent.run_id,
            at=datetime.now(UTC),
            step_no=1,
            key=intent.key,
            status=OutcomeStatus.SUCCEEDED,
        )
        ended = RunCompleted(run_id=intent.run_id, at=datetime.now(UTC), reply="done")
        await journal.append(ended, await journal.append(completion, seq))
    on_inbound, followed = Reconciler._on_inbound, list[Msg]()

    async def behind(self: Reconciler, msg: Msg) -> None:
        # The order the followers' replays happened to take in a trial run here: every end before any message.
        await eventually(lambda: len(self.projection_checks.ended.runs) == 30, what="the milestones replayed")
        await on_inbound(self, msg)
        followed.append(msg)

    monkeypatch.setattr(Reconciler, "_on_inbound", behind)
    async with inprocess.reconciler(settings) as reconciler:
        await eventually(
            lambda: len(followed) == 30 and not reconciler.work.looks,
            what="every replayed run's message followed, and no run left to read",
            timeout_s=15,
        )
        await reconciler.tick(datetime.now(UTC) + timedelta(seconds=reconciler.cadence.first_s + 1))
        assert reconciler.looks_read == 0
        assert not reconciler.work.ended_first  # each message came, and took its run's end along


async def test_a_journal_that_does_not_decode_is_left_alone_and_every_other_run_still_judged(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> None:
    """A journal event of a known type that does not decode (corrupt, or a newer writer's value this version does
    not know) used to cost the reconciler one event of its follower. Now that it reads journals on its tick, the
    read must not raise out of the tick: the reconciler would die on it, and again on every restart."""
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="c")
    journal = RunJournal(broker, namespace)
    async with inprocess.reconciler(settings) as reconciler:
        corrupt, healthy = [
            await _journal_a_payment_intent(
                journal, {"booking_id": f"b{n}", "guest_id": "g", "total_cents": 1}
            )
            for n in range(2)
        ]
        accepted = [await _accept(broker, namespace, journal, intent) for intent in (corrupt, healthy)]
        # A turn sent to the corrupt run: looking whether that run took it reads the corrupt journal too.
        turn = msgspec.structs.replace(
            accepted[0], key=unique("turn"), run_id=run_id_for("", unique("turn")), turn_of=corrupt.run_id
        )
        await broker.publish(namespace.inbound(turn.run_id), inbound_encoder.encode(turn))
        bad = {"type": "run.action_completed", "run_id": corrupt.run_id, "at": datetime.now(UTC).isoformat()}
        await broker.publish(namespace.run_event(corrupt.run_id, EventClass.STEP), msgspec.json.encode(bad))
        await eventually(
            lambda: {corrupt.run_id, healthy.run_id, turn.run_id} <= set(reconciler.work.looks),
            what="the runs and the turn accepted",
        )
        reconciler.looks_per_tick = 1  # the corrupt run and its turn are the older: read first
        overdue_at = healthy.deadline_at + timedelta(seconds=reconciler.grace_s + 1)
        for n in range(4):
            await reconciler.tick(overdue_at + timedelta(seconds=n * 2))
        assert healthy.run_id in reconciler.work.runs
        assert reconciler.resolutions == 1  # the healthy run's overdue payment asked about
        assert corrupt.run_id not in reconciler.work.looks and corrupt.run_id not in reconciler.work.runs
        assert turn.run_id not in reconciler.work.looks


async def _followed_payment(
    reconciler: Reconciler, broker: Broker, namespace: Namespace, journal: RunJournal
) -> ActionRequested:
    """A run with a payment pending, accepted, and followed by the reconciler (not read yet)."""
    intent = await _journal_a_payment_intent(journal, {"booking_id": "b", "guest_id": "g", "total_cents": 1})
    await _accept(broker, namespace, journal, intent)
    await eventually(lambda: intent.run_id in reconciler.work.looks, what="the accepted run followed")
    return intent
