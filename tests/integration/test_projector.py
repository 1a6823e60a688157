"""The projector against a real nats-server and the real sandbox over HTTP: a run's journal planned into its
email, CRM record and audit trail, each delivered once however often it is published, retried through outages
and throttling, dead (with its dead letter and operator event) when refused or out of time."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from contracts.dead_letters import DeadLetter
from contracts.projections import (
    AUDIT_TRAIL_TOOL,
    ProjectionFailed,
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
    failed_decoder,
    record_decoder,
    task_encoder,
)
from contracts.run_events import ActionRequested, RunCompleted, RunEvent
from contracts.streams import KvSpec, projections_spec
from contracts.subjects import Namespace, StreamKind
from services.agents import stayhub
from services.platform.jetstream import Broker, KvEntry
from services.platform.journal import RunJournal
from services.platform.natsd import NatsServer
from services.platform.settings import Settings
from services.projector.plan import plan
from services.runtime.core.fold import replay
from tests.support import inprocess
from tests.support.broker import consumer_idle, dead_letters
from tests.support.runs import BOOK, SEARCH, Run, call, started
from tests.support.waiting import eventually, unique
from tests.support.world import Sandbox

DATES = {"check_in": "2031-12-01", "check_out": "2031-12-03"}
EMAIL, CRM = "send_confirmation_email", "update_crm"
# The projection clock shortened a hundredfold: back-offs of 20-160 ms, a long retry every 3 s, dead after 72 s.
SCALE = 0.01
REGISTRY = stayhub()


@pytest.fixture
async def sandbox_url() -> AsyncIterator[str]:
    async with inprocess.sandbox_server() as url:
        yield url


@dataclass
class World:
    """The namespace's streams as the operator sees them, and the sandbox's receivers over HTTP."""

    nats_url: str
    ns: Namespace
    broker: Broker
    http: httpx.AsyncClient
    sandbox: Sandbox

    def settings(self, scale: float = SCALE, worker: str = "tests") -> Settings:
        base = inprocess.settings_for(self.nats_url, self.ns, sandbox_url=self.sandbox.url, worker_id=worker)
        return dataclasses.replace(base, projection_time_scale=scale)

    @property
    def records(self) -> KvSpec:
        return projections_spec(self.ns)

    async def booking(self, guest: str) -> dict[str, Any]:
        """A held booking made straight at the provider: what a confirmation email and a CRM record are about."""
        response = await self.http.post(
            "/bookings",
            json={"hotel_id": "lis-1", "guest_id": guest, **DATES},
            headers={"Idempotency-Key": unique("setup")},
        )
        assert response.status_code == 201, response.text
        return dict(response.json())

    def task(self, tool: str, booking_id: str, guest: str, *, key: str | None = None) -> ProjectionTask:
        return ProjectionTask(
            tool=tool,
            key=key or unique(tool),
            run_id="run_" + uuid.uuid4().hex[:24],
            tenant="acme",
            agent="booking",
            args={"booking_id": booking_id, "guest_id": guest},
            planned_at=datetime.now(UTC),
        )

    async def publish(self, task: ProjectionTask, msg_id: str | None = None) -> None:
        """As the planner publishes it (its key as message id), or under another id (a second planner, the
        reconciler long after the duplicate window)."""
        await self.broker.publish(
            self.ns.projection(task.tool, task.run_id), task_encoder.encode(task), msg_id=msg_id or task.key
        )

    async def record(self, task: ProjectionTask) -> ProjectionRecord | None:
        entry = await self.broker.kv_get(self.records, self.ns.projection_record_key(task.tool, task.key))
        return record_decoder.decode(entry.value) if entry is not None else None

    async def settled(self, task: ProjectionTask, status: ProjectionStatus) -> ProjectionRecord:
        async def check() -> ProjectionRecord | None:
            record = await self.record(task)
            return record if record is not None and record.status is status else None

        return await eventually(check, what=f"{task.key} {status.value}")

    async def idle(self, tool: str) -> None:
        stream = self.ns.stream(StreamKind.PROJECTIONS)
        await eventually(
            lambda: consumer_idle(self.broker, stream, self.ns.projection_consumer(tool)),
            what=f"{tool}'s worker holds nothing",
        )

    async def effects(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in (await self.sandbox.ledger())["entries"] if e["kind"] == kind]

    async def failures(self) -> list[ProjectionFailed]:
        stored = await self.broker.read_subject(self.ns.stream(StreamKind.OPS), self.ns.ops_all)
        return [failed_decoder.decode(m.data) for m in stored]

    async def projector_letters(self) -> list[DeadLetter]:
        return [d for d in await dead_letters(self.broker, self.ns) if d.service == "projector"]

    async def watch(self, task: ProjectionTask) -> list[ProjectionRecord]:
        """Every value the task's receipt takes from now on, in order (the bucket keeps only the last)."""
        seen: list[ProjectionRecord] = []

        async def on_value(entry: KvEntry) -> None:
            seen.append(record_decoder.decode(entry.value))

        await self.broker.kv_watch(self.records, self.ns.projection_record_key(task.tool, task.key), on_value)
        return seen


@pytest.fixture
async def world(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, sandbox_url: str
) -> AsyncIterator[World]:
    async with httpx.AsyncClient(base_url=sandbox_url, timeout=10.0) as http:
        w = World(nats_server.url, namespace, broker, http, Sandbox(http, sandbox_url))
        await inprocess.provisioned(w.settings())
        yield w


# Retries ------------------------------------------------------------------------------------------------------


async def test_an_email_retried_through_503s_is_delivered_once(world: World) -> None:
    await world.sandbox.arm("emails", fail_5xx=3)
    booking = await world.booking("guest-503")
    task = world.task(EMAIL, booking["booking_id"], "guest-503")
    async with inprocess.projector(world.settings()):
        await world.publish(task)
        record = await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(EMAIL)
    assert record.attempts == 4  # three 503s, then the email
    assert record.provider_ref and record.provider_ref.startswith("em_")
    assert [e["key"] for e in await world.effects("email")] == [task.key]


async def test_a_429s_retry_after_is_waited_out_even_when_the_policy_would_try_sooner(world: World) -> None:
    await world.sandbox.arm("crm", throttle=1, retry_after_s=2)
    booking = await world.booking("guest-429")
    task = world.task(CRM, booking["booking_id"], "guest-429")
    seen = await world.watch(task)
    async with inprocess.projector(world.settings()):
        await world.publish(task)
        delivered = await world.settled(task, ProjectionStatus.DELIVERED)
    pending = [r for r in seen if r.status is ProjectionStatus.PENDING]
    assert len(pending) == 1 and pending[0].attempts == 1
    waited = pending[0].next_attempt_at
    assert waited is not None
    # The policy's own pause would be 20 ms at this scale; the receiver asked for 2 s.
    assert waited - pending[0].updated_at >= timedelta(seconds=2)
    assert delivered.attempts == 2 and delivered.updated_at >= waited
    assert len(await world.effects("crm_update")) == 1


# Dead ---------------------------------------------------------------------------------------------------------


async def test_a_typed_refusal_is_dead_at_once_with_its_dead_letter_and_operator_event(world: World) -> None:
    task = world.task(EMAIL, "bk_never_made", "guest-refused")
    async with inprocess.projector(world.settings()):
        await world.publish(task)
        record = await world.settled(task, ProjectionStatus.DEAD)
        await world.idle(EMAIL)  # termed: nothing left to redeliver
    assert record.attempts == 1
    (letter,) = await world.projector_letters()
    assert (letter.code, letter.details["key"], letter.details["tool"]) == (
        "provider_rejected",
        task.key,
        EMAIL,
    )
    assert letter.subject == world.ns.projection(EMAIL, task.run_id)
    (failed,) = await world.failures()
    assert (failed.key, failed.run_id, failed.tenant, failed.code, failed.attempts) == (
        task.key,
        task.run_id,
        "acme",
        "provider_rejected",
        1,
    )
    assert "404" in failed.reason
    assert await world.effects("email") == []


async def test_a_projection_whose_policy_is_spent_is_dead_and_nothing_was_sent(world: World) -> None:
    # Down for good: at a thousandth of the clock the policy's two hours are 7.2 s of 503s.
    await world.sandbox.arm("emails", fail_5xx=1_000_000)
    booking = await world.booking("guest-down")
    task = world.task(EMAIL, booking["booking_id"], "guest-down")
    async with inprocess.projector(world.settings(scale=0.001)):
        await world.publish(task)
        record = await world.settled(task, ProjectionStatus.DEAD)
        await world.idle(EMAIL)
    assert record.attempts > 5  # the quick attempts, then the long-term ones
    (failed,) = await world.failures()
    assert (failed.code, failed.attempts) == ("projection_exhausted", record.attempts)
    (letter,) = await world.projector_letters()
    assert letter.code == "projection_exhausted" and letter.details["key"] == task.key
    await world.sandbox.clear_faults()
    assert await world.effects("email") == []


async def test_a_task_that_does_not_decode_is_dead_lettered_and_the_worker_goes_on(world: World) -> None:
    booking = await world.booking("guest-after-junk")
    task = world.task(CRM, booking["booking_id"], "guest-after-junk")
    async with inprocess.projector(world.settings()):
        await world.broker.publish(
            world.ns.projection(CRM, "run_junk"), b'{"type": "projection.task", "tool": 7}'
        )
        await world.publish(task)
        await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(CRM)
    (letter,) = await world.projector_letters()
    assert letter.code == "poison_message" and letter.subject == world.ns.projection(CRM, "run_junk")


# Receivers deduplicate ----------------------------------------------------------------------------------------


async def test_email_and_crm_tasks_published_twice_under_other_ids_make_one_effect_each(world: World) -> None:
    booking = await world.booking("guest-twice")
    tasks = [world.task(tool, booking["booking_id"], "guest-twice") for tool in (EMAIL, CRM)]
    async with inprocess.projector(world.settings()):
        for task in tasks:
            await world.publish(task)
            await world.publish(task, msg_id=unique("again"))  # past the stream's duplicate window
        for task in tasks:
            await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(EMAIL)
        await world.idle(CRM)
    assert [e["key"] for e in await world.effects("email")] == [tasks[0].key]
    assert [e["key"] for e in await world.effects("crm_update")] == [tasks[1].key]


async def test_two_projectors_on_one_stream_deliver_each_task_once_per_receiver(world: World) -> None:
    guests = [f"guest-pair-{n}" for n in range(6)]
    tasks = []
    for guest in guests:
        booking = await world.booking(guest)
        tasks += [world.task(tool, booking["booking_id"], guest) for tool in (EMAIL, CRM)]
    async with (
        inprocess.projector(world.settings(worker="a"), name="tests-projector-a"),
        inprocess.projector(world.settings(worker="b"), name="tests-projector-b"),
    ):
        for task in tasks:
            await world.publish(task)
            await world.publish(task, msg_id=unique("again"))
        for task in tasks:
            await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(EMAIL)
        await world.idle(CRM)
    emails = sorted(e["key"] for e in await world.effects("email"))
    crm = sorted(e["key"] for e in await world.effects("crm_update"))
    assert emails == sorted(t.key for t in tasks if t.tool == EMAIL)
    assert crm == sorted(t.key for t in tasks if t.tool == CRM)


# Planning from the journal ------------------------------------------------------------------------------------


async def paid_run(world: World) -> tuple[list[RunEvent], str]:
    """A booking run that held a room at the provider, paid it and completed, journaled as the runtime would."""
    run = Run(started())
    run.answer(SEARCH)
    run.decide()
    run.complete(2)
    run.answer(BOOK)
    (hold,) = run.decide()
    assert isinstance(hold, ActionRequested)
    booking = await world.booking(run.state.guest_id)
    run.complete(hold.step_no, result=booking)
    run.answer(call("create_payment", {"booking_id": booking["booking_id"]}, "call_pay"))
    (pay,) = run.decide()
    assert isinstance(pay, ActionRequested)
    payment = {
        "payment_id": f"pay_{uuid.uuid4().hex[:12]}",
        "booking_id": booking["booking_id"],
        "amount_cents": pay.args["amount_cents"],
        "currency": "EUR",
        "status": "captured",
    }
    run.complete(pay.step_no, result=payment)
    run.add(RunCompleted(run_id=run.state.run_id, at=run.tick(), reply="Booked and paid."))
    return run.events, booking["booking_id"]


async def journal(world: World, events: list[RunEvent]) -> None:
    runs = RunJournal(world.broker, world.ns)
    seq = 0
    for event in events:
        seq = await runs.append(event, seq)


async def test_a_completed_run_is_planned_into_its_email_and_crm_record_delivered_once(world: World) -> None:
    events, booking_id = await paid_run(world)
    state = replay(events)
    assert state is not None
    expected = plan(state, len(events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC))
    assert sorted(t.tool for t in expected) == sorted([AUDIT_TRAIL_TOOL, CRM, EMAIL])
    async with inprocess.projector(world.settings()):
        await journal(world, events)
        for task in (t for t in expected if t.tool != AUDIT_TRAIL_TOOL):
            record = await world.settled(task, ProjectionStatus.DELIVERED)
            assert record.run_id == state.run_id
        await world.idle(EMAIL)
        await world.idle(CRM)
    (email,) = await world.effects("email")
    (crm,) = await world.effects("crm_update")
    assert email["key"] == next(t.key for t in expected if t.tool == EMAIL)
    assert crm["key"] == next(t.key for t in expected if t.tool == CRM)
    assert email["guest_id"] == crm["guest_id"] == state.guest_id
    sent = await world.http.get(f"/emails/by-key/{email['key']}")
    assert sent.json()["booking_id"] == booking_id


async def test_a_journal_that_does_not_fold_is_dead_lettered_and_planning_goes_on(world: World) -> None:
    hostile = "run_" + "h" * 24
    async with inprocess.projector(world.settings()):
        # A run whose journal opens with its end, and bytes that are no event at all.
        await world.broker.publish(
            world.ns.run_events(hostile),
            b'{"type": "run.completed", "run_id": "%s", "at": "2026-12-01T09:00:00Z", "reply": "x"}'
            % hostile.encode(),
        )
        await world.broker.publish(world.ns.run_events("run_garbage"), b"\xff not json")
        events, _ = await paid_run(world)
        await journal(world, events)
        state = replay(events)
        assert state is not None
        expected = plan(
            state, len(events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC)
        )
        for task in (t for t in expected if t.tool == EMAIL):
            await world.settled(task, ProjectionStatus.DELIVERED)
    letters = [d for d in await world.projector_letters() if ".run." in d.subject]
    assert sorted(d.subject for d in letters) == sorted(
        [world.ns.run_events(hostile), world.ns.run_events("run_garbage")]
    )
    assert len(await world.effects("email")) == 1


# The audit trail ----------------------------------------------------------------------------------------------


async def test_the_audit_trail_delivered_twice_stores_each_event_once_in_journal_order(world: World) -> None:
    events, _ = await paid_run(world)
    state = replay(events)
    assert state is not None
    async with inprocess.projector(world.settings()) as projector:
        await journal(world, events)
        expected = plan(
            state, len(events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC)
        )
        (audit,) = [t for t in expected if t.tool == AUDIT_TRAIL_TOOL]
        await world.settled(audit, ProjectionStatus.DELIVERED)
        await world.publish(audit, msg_id=unique("again"))  # the same task again, long after
        await projector.plan_run(state.run_id)  # and planned again from the journal
        await world.idle(AUDIT_TRAIL_TOOL)
    response = await world.http.get("/audit/records", params={"run_id": state.run_id})
    assert response.status_code == 200, response.text
    records = response.json()["records"]
    assert [r["event_id"] for r in records] == [f"{state.run_id}/{n}" for n in range(1, len(events) + 1)]
    assert [r["type"] for r in records] == [type(e).__struct_config__.tag for e in events]
