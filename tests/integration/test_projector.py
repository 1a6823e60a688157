"""The projector against a real nats-server and the real sandbox over HTTP: a run's journal planned into its
email, CRM record and audit trail, each delivered once however often it is published, retried through outages
and throttling, dead (with its dead letter and operator event) when refused or out of time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bench import workloads
from crashsafe.contracts.dead_letters import DeadLetter
from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.headers import Header
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.projections import (
    AUDIT_TRAIL_TOOL,
    ProjectionFailed,
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
    failed_decoder,
    plan_decoder,
    record_decoder,
    task_encoder,
)
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalRequested,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    event_encoder,
)
from crashsafe.contracts.streams import KvSpec, projections_spec
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import audit_key, plan
from crashsafe.natsd import NatsServer
from crashsafe.services.agents import stayhub
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker, KvEntry
from crashsafe.services.platform.settings import Settings
from crashsafe.services.projector.service import Projector
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.broker import consumer_idle, dead_letters
from tests.support.nats_users import access
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

    def attempts(result: str) -> float:
        return (
            metrics.REGISTRY.get_sample_value(
                "crashsafe_projections_total", {"tool": EMAIL, "result": result}
            )
            or 0
        )

    before = {result: attempts(result) for result in ("retry", "delivered")}
    async with inprocess.projector(world.settings()):
        await world.publish(task)
        record = await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(EMAIL)
    assert record.attempts == 4  # three 503s, then the email
    assert {r: attempts(r) - n for r, n in before.items()} == {"retry": 3, "delivered": 1}
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
        # A task that decodes but names a run no subject can: it must not circle through the worker for hours.
        nowhere = msgspec.structs.replace(world.task(AUDIT_TRAIL_TOOL, "bk_0", "g"), run_id="run.*", upto=3)
        await world.broker.publish(
            world.ns.projection(AUDIT_TRAIL_TOOL, "run_nowhere"), task_encoder.encode(nowhere)
        )
        await world.publish(task)
        await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(CRM)
        await world.idle(AUDIT_TRAIL_TOOL)
    letters = sorted(await world.projector_letters(), key=lambda d: d.subject)
    assert [(d.code, d.subject) for d in letters] == [
        ("poison_message", world.ns.projection(AUDIT_TRAIL_TOOL, "run_nowhere")),
        ("poison_message", world.ns.projection(CRM, "run_junk")),
    ]


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
    # The plan on record, beside the receipts: what the reconciler judges the run by without its journal.
    entry = await world.broker.kv_get(world.records, world.ns.projection_plan_key(state.run_id))
    assert entry is not None, "an ended run's plan is on record once its tasks are published"
    recorded = plan_decoder.decode(entry.value)
    last_seq = (await RunJournal(world.broker, world.ns).read(state.run_id))[1]
    assert (recorded.run_id, recorded.events, recorded.last_seq) == (state.run_id, len(events), last_seq)
    assert sorted((t.tool, t.key) for t in recorded.tasks) == sorted((t.tool, t.key) for t in expected)


async def test_a_journal_that_does_not_fold_is_dead_lettered_and_planning_goes_on(world: World) -> None:
    hostile = "run_" + "h" * 24
    async with inprocess.projector(world.settings()):
        # A run whose journal opens with its end, and bytes that are no event at all.
        await world.broker.publish(
            world.ns.run_event(hostile, EventClass.MILESTONE),
            b'{"type": "run.completed", "run_id": "%s", "at": "2026-12-01T09:00:00Z", "reply": "x"}'
            % hostile.encode(),
        )
        await world.broker.publish(world.ns.run_event("run_garbage", EventClass.MILESTONE), b"\xff not json")
        # A journal on one run's subject that opens another run: planned as neither.
        impostor = msgspec.structs.replace(started(), run_id="run_" + "i" * 24)
        await world.broker.publish(
            world.ns.run_event("run_" + "j" * 24, EventClass.MILESTONE), event_encoder.encode(impostor)
        )
        await world.broker.publish(
            world.ns.run_event("run_" + "j" * 24, EventClass.MILESTONE),
            event_encoder.encode(RunCompleted(run_id="run_" + "j" * 24, at=datetime.now(UTC), reply="x")),
        )
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
        world.ns.run_event(r, EventClass.MILESTONE) for r in (hostile, "run_garbage", "run_" + "j" * 24)
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


# Crash seams: the projector as its own process, SIGKILLed at the worst moments --------------------------------


@dataclass
class ProjectorProcess:
    """`crashsafe serve projector` as a deployment runs it (its NATS user's credential, the sandbox's URL)."""

    world: World
    logs: Path
    started: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    def env(self, crash_at: str | None) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("CRASHSAFE_CRASH_AT", "CRASHSAFE_NATS_CREDS", "CRASHSAFE_REGISTRY"):
            env.pop(name, None)
        creds = access(self.world.nats_url, Role.PROJECTOR).creds
        env.update(
            {
                "CRASHSAFE_NATS_URL": self.world.nats_url,
                "CRASHSAFE_NAMESPACE": self.world.ns.name,
                "CRASHSAFE_SANDBOX_URL": self.world.sandbox.url,
                "CRASHSAFE_DATA_DIR": str(self.logs),
                "CRASHSAFE_PROJECTION_TIME_SCALE": str(SCALE),
                "CRASHSAFE_WORKER_ID": f"projector-{len(self.started)}",
                "CRASHSAFE_OPS_PORT": "0",
                **({"CRASHSAFE_NATS_CREDS": str(creds)} if creds else {}),
                **({"CRASHSAFE_CRASH_AT": crash_at} if crash_at else {}),
            }
        )
        return env

    async def start(self, crash_at: str | None = None) -> subprocess.Popen[bytes]:
        log_path = self.logs / f"projector-{len(self.started)}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "crashsafe.cli", "serve", "projector"],
                env=self.env(crash_at),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.started.append(process)
        await eventually(
            lambda: b"ready: projector" in log_path.read_bytes() or process.poll() is not None,
            what="the projector says it is ready",
        )
        assert b"ready: projector" in log_path.read_bytes(), log_path.read_text()
        return process

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.fixture
async def projector_process(world: World, tmp_path: Path) -> AsyncIterator[ProjectorProcess]:
    processes = ProjectorProcess(world, tmp_path)
    try:
        yield processes
    finally:
        processes.stop()


async def killed(process: subprocess.Popen[bytes]) -> None:
    await eventually(lambda: process.poll() is not None, what="the projector killed itself at its seam")
    assert process.returncode == -signal.SIGKILL


async def test_killed_after_the_email_was_sent_the_redelivery_finds_it_by_key_and_sends_none(
    world: World, projector_process: ProjectorProcess
) -> None:
    booking = await world.booking("guest-seam-call")
    task = world.task(EMAIL, booking["booking_id"], "guest-seam-call")
    first = await projector_process.start(crash_at="projector.after_provider_call")
    await world.publish(task)
    await killed(first)
    assert await world.record(task) is None  # sent, never receipted
    await projector_process.start()
    record = await world.settled(task, ProjectionStatus.DELIVERED)
    await world.idle(EMAIL)
    assert record.attempts == 2  # the redelivery, answered by the lookup
    assert [e["key"] for e in await world.effects("email")] == [task.key]
    assert (await world.sandbox.ledger())["replays"].get("email", 0) == 0  # no second POST at all


async def test_killed_after_the_receipt_the_redelivery_is_acknowledged_from_it(
    world: World, projector_process: ProjectorProcess
) -> None:
    booking = await world.booking("guest-seam-ack")
    task = world.task(CRM, booking["booking_id"], "guest-seam-ack")
    first = await projector_process.start(crash_at="projector.before_ack")
    await world.publish(task)
    await killed(first)
    record = await world.settled(task, ProjectionStatus.DELIVERED)
    await projector_process.start()
    await world.idle(CRM)  # the redelivery was settled from the receipt
    assert await world.record(task) == record  # untouched: not delivered again
    assert [e["key"] for e in await world.effects("crm_update")] == [task.key]
    assert (await world.sandbox.ledger())["replays"].get("crm_update", 0) == 0


async def test_killed_after_planning_the_run_is_planned_again_and_each_projection_delivered_once(
    world: World, projector_process: ProjectorProcess
) -> None:
    events, _ = await paid_run(world)
    state = replay(events)
    assert state is not None
    first = await projector_process.start(crash_at="projector.after_plan_publish")
    await journal(world, events)
    await killed(first)
    await projector_process.start()
    expected = plan(state, len(events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC))
    for task in (t for t in expected if t.tool in (EMAIL, CRM)):
        await world.settled(task, ProjectionStatus.DELIVERED)
    await world.idle(EMAIL)
    await world.idle(CRM)
    stream = world.ns.stream(StreamKind.RUNS)
    await eventually(
        lambda: consumer_idle(world.broker, stream, world.ns.projector_planner_consumer),
        what="the run's events settled by the planner",
    )
    assert len(await world.effects("email")) == 1 and len(await world.effects("crm_update")) == 1


# Receivers answering what cannot be trusted, and a long wait --------------------------------------------------


@pytest.mark.parametrize("fault", ["malformed", "drop_after_commit"])
async def test_an_email_sent_whose_answer_was_lost_is_found_by_key_not_sent_again(
    world: World, fault: str
) -> None:
    await world.sandbox.arm("emails", **{fault: 1})
    booking = await world.booking(f"guest-{fault}")
    task = world.task(EMAIL, booking["booking_id"], f"guest-{fault}")
    async with inprocess.projector(world.settings()):
        await world.publish(task)
        record = await world.settled(task, ProjectionStatus.DELIVERED)
        await world.idle(EMAIL)
    assert record.attempts == 2 and record.provider_ref and record.provider_ref.startswith("em_")
    assert [e["key"] for e in await world.effects("email")] == [task.key]
    assert (await world.sandbox.ledger())["replays"].get("email", 0) == 0  # attempt 2 asked, did not send


async def test_a_run_waiting_for_an_approval_flushes_its_audit_trail_and_nothing_else(world: World) -> None:
    events, _ = await paid_run(world)
    run = Run(started())
    for event in events[1:-1]:  # paid, not completed: a refund now waits for the guest's yes
        run.add(event)
    refund = call("refund_payment", {"payment_id": "pay_1"}, "call_refund")
    run.answer(refund)
    waiting = ApprovalRequested(
        run_id=run.state.run_id,
        at=run.tick(),
        step_no=run.state.next_step,
        approval_id="apr_" + uuid.uuid4().hex[:12],
        call=refund,
        tool="refund_payment",
        args={"payment_id": "pay_1"},
        input_hash="0" * 64,
        approver="guest",
        rule="approval_above",
        reason="refunds wait for the guest",
        expires_at=run.tick(3600),
    )
    run.add(waiting)
    state = replay(run.events)
    assert state is not None and state.awaiting is not None
    async with inprocess.projector(world.settings()):
        await journal(world, run.events)
        audit = ProjectionTask(
            tool=AUDIT_TRAIL_TOOL,
            key=audit_key(state.run_id, len(run.events)),
            run_id=state.run_id,
            tenant="",
            agent="booking",
            planned_at=datetime.now(UTC),
            upto=len(run.events),
        )
        await world.settled(audit, ProjectionStatus.DELIVERED)
        stream = world.ns.stream(StreamKind.RUNS)
        await eventually(
            lambda: consumer_idle(world.broker, stream, world.ns.projector_planner_consumer),
            what="every run event settled by the planner",
        )
        for tool in (EMAIL, CRM, AUDIT_TRAIL_TOOL):
            await world.idle(tool)
    records = (await world.http.get("/audit/records", params={"run_id": state.run_id})).json()["records"]
    assert [r["type"] for r in records][-1] == "run.approval_requested"
    assert len(records) == len(run.events)
    # The booking is paid, but the run may yet undo it: no email, no CRM record until it ends, and no plan on
    # record (a run not ended is never judged by one).
    assert await world.effects("email") == [] and await world.effects("crm_update") == []
    assert await world.broker.kv_get(world.records, world.ns.projection_plan_key(state.run_id)) is None


async def test_a_replica_paused_mid_delivery_loses_its_claim_and_the_email_is_still_sent_once(
    world: World, projector_process: ProjectorProcess
) -> None:
    # The email provider takes 2 s over each write: long enough to pause the replica that sent it mid-request.
    await world.sandbox.arm("emails", latency_ms=2000)
    booking = await world.booking("guest-paused")
    task = world.task(EMAIL, booking["booking_id"], "guest-paused")
    paused = await projector_process.start()
    await world.publish(task)
    await eventually(lambda: _in_flight(world, task.key), what="the email in the provider's hands")
    paused.send_signal(signal.SIGSTOP)
    try:
        await world.sandbox.clear_faults()  # the write in progress still takes its 2 s
        await projector_process.start()  # its claim lapses (no in-progress acks): this one takes the task
        record = await world.settled(task, ProjectionStatus.DELIVERED)
    finally:
        paused.send_signal(signal.SIGCONT)
    log_of_paused = projector_process.logs / "projector-0.log"
    await eventually(
        lambda: (
            b'"msg":"delivered"' in log_of_paused.read_bytes()
            or b"projection not delivered" in log_of_paused.read_bytes()
        ),
        what="the paused replica finishing its attempt once resumed",
    )
    await world.idle(EMAIL)
    assert [e["key"] for e in await world.effects("email")] == [task.key]
    settled = await world.record(task)
    assert settled is not None and settled.status is ProjectionStatus.DELIVERED
    assert record.attempts >= 2  # the second replica's attempt, by lookup after the first one's write


async def _in_flight(world: World, key: str) -> bool:
    return key in await world.sandbox.in_flight()


async def test_a_late_payment_after_a_hand_off_is_planned_by_a_replica_that_never_saw_the_run_end(
    world: World,
) -> None:
    # A payment whose answer was lost, the run handed off for it, its real outcome journaled long after: the
    # booking is paid, so the guest's email is due. The replica that takes the late event is not the one that
    # saw the run end (a second replica, or this one restarted): it must still know to plan it.
    events, _ = await paid_run(world)
    run = Run(started())
    for event in events[1:-2]:  # the payment asked, its answer not yet in
        run.add(event)
    pay = next(e for e in run.events if isinstance(e, ActionRequested) and e.tool == "create_payment")
    paid = events[-2]
    assert isinstance(paid, ActionCompleted) and paid.step_no == pay.step_no
    run.complete(pay.step_no, status="unknown")
    run.add(
        RunHandedOff(
            run_id=run.state.run_id, at=run.tick(), reason="outcome_unknown", detail="payment unknown"
        )
    )
    state = replay(run.events)
    assert state is not None and state.terminal
    async with inprocess.projector(world.settings()):
        await journal(world, run.events)
        audit = ProjectionTask(
            tool=AUDIT_TRAIL_TOOL,
            key=audit_key(state.run_id, len(run.events)),
            run_id=state.run_id,
            tenant="",
            agent="booking",
            planned_at=datetime.now(UTC),
            upto=len(run.events),
        )
        await world.settled(audit, ProjectionStatus.DELIVERED)
        stream = world.ns.stream(StreamKind.RUNS)
        await eventually(
            lambda: consumer_idle(world.broker, stream, world.ns.projector_planner_consumer),
            what="every run event settled by the planner",
        )
    assert await world.effects("email") == []  # maybe paid: nothing yet
    late = msgspec.structs.replace(paid, at=run.tick())
    run.add(late)
    after = replay(run.events)
    assert after is not None
    expected = plan(
        after, len(run.events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC)
    )
    email = next(t for t in expected if t.tool == EMAIL)
    async with inprocess.projector(world.settings(), name="tests-projector-2"):
        # As the runtime appends it (services/runtime/append_path.py `journal_headers`): marked as after the end,
        # a milestone.
        await RunJournal(world.broker, world.ns).append(
            late, len(run.events) - 1, headers={Header.RUN_ENDED: "1"}, after_end=True
        )
        await world.settled(email, ProjectionStatus.DELIVERED)
        await world.idle(EMAIL)
    assert [e["key"] for e in await world.effects("email")] == [email.key]


async def test_a_first_start_on_a_deployment_with_history_plans_only_recent_runs_and_a_restart_keeps_its_place(
    world: World,
) -> None:
    # A deployment upgraded to the projector: its RUNS stream holds every run it ever had, their emails sent as
    # steps (or never, by the model's choice). The planner's new durable must not replay years of run ends
    # into emails; it starts a bounded while back (hours, inside a receiver's key memory), and keeps its place.
    old_events, old_booking = await paid_run(world)
    await journal(world, old_events)
    await eventually(lambda: _aged(world), what="the old journal older than the planner's history")
    async with _projector(world, history_s=1.0) as projector:
        new_events, new_booking = await paid_run(world)
        other = "run_" + uuid.uuid4().hex[:24]
        new_events = [msgspec.structs.replace(e, run_id=other) for e in new_events]
        await journal(world, new_events)
        new_state = replay(new_events)
        assert new_state is not None
        new_tasks = plan(
            new_state, len(new_events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC)
        )
        for task in new_tasks:
            await world.settled(task, ProjectionStatus.DELIVERED)
        await eventually(
            lambda: consumer_idle(
                world.broker, world.ns.stream(StreamKind.RUNS), world.ns.projector_planner_consumer
            ),
            what="the planner idle",
        )
        created = (await projector.broker.js.consumer_info(*_planner(world))).created
    async with _projector(world, history_s=1.0) as projector:
        assert (await projector.broker.js.consumer_info(*_planner(world))).created == created
    emails = await world.effects("email")
    assert [e["key"] for e in emails] == [t.key for t in new_tasks if t.tool == EMAIL]
    assert old_booking != new_booking
    old_state = replay(old_events)
    assert old_state is not None
    for task in plan(
        old_state, len(old_events), REGISTRY.agent("booking"), REGISTRY.projections, datetime.now(UTC)
    ):
        assert await world.record(task) is None


_AGED_AT: dict[str, float] = {}


def _aged(world: World) -> bool:
    """True once the journal written so far is more than the planner's history (1 s) old."""
    import time

    since = _AGED_AT.setdefault(world.ns.name, time.monotonic())
    return time.monotonic() - since > 1.5


def _planner(world: World) -> tuple[str, str]:
    return world.ns.stream(StreamKind.RUNS), world.ns.projector_planner_consumer


@contextlib.asynccontextmanager
async def _projector(world: World, *, history_s: float) -> AsyncIterator[Projector]:
    settings = world.settings()
    broker = await Broker.connect(
        settings.nats_url, "tests-projector-history", access=access(settings.nats_url, Role.PROJECTOR)
    )
    providers = Providers.connect(settings.sandbox_url)
    projector = Projector(
        broker, settings, REGISTRY, providers, logging.getLogger("tests.projector"), history_s=history_s
    )
    try:
        await projector.start()
        yield projector
    finally:
        await projector.close()
        await providers.close()
        await broker.close()


async def _trickling_receiver() -> tuple[asyncio.Server, str, list[int]]:
    """An email provider that answers 200 with a body it sends one byte a second, for ever: each read is quick,
    the answer never ends. `connections` counts the requests it took."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
            )
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(1.0)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", connections


async def test_a_receiver_that_trickles_its_answer_for_ever_is_an_unknown_answer_not_a_held_slot(
    world: World,
) -> None:
    # Every read comes within the call's timeout, so a per-read timeout never fires: the attempt must still end
    # after the tool's timeout (unknown: asked by key next time), or a few such answers hold the worker's every
    # slot, and its claim (renewed while the call runs) for ever.
    server, url, connections = await _trickling_receiver()
    try:
        booking = await world.booking("guest-trickle")
        task = world.task(EMAIL, booking["booking_id"], "guest-trickle")
        settings = dataclasses.replace(world.settings(), sandbox_url=url)
        async with inprocess.projector(settings):
            await world.publish(task)
            record = await world.settled(task, ProjectionStatus.PENDING)
        assert record.attempts >= 1 and connections
    finally:
        server.close()


async def test_without_an_audit_trail_a_run_of_an_agent_that_projects_nothing_costs_no_read_of_its_journal(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's deployment (StayHub's booking agent and the steps agents, no audit trail): a steps run's end is
    planned from its first event alone (its agent declares no projection tools), a paid booking's from its whole
    journal, into its email and CRM record."""
    registry = workloads.registry()
    steps = msgspec.structs.replace(started(agent="steps5"), run_id=f"run_{uuid.uuid4().hex[:24]}")
    await journal(world, [steps, RunCompleted(run_id=steps.run_id, at=steps.at, reply="done")])
    paid, _ = await paid_run(world)
    await journal(world, paid)
    whole_reads: list[str] = []
    read_subject = world.broker.read_subject

    async def counted(stream: str, subject: str, after_seq: int = 0, batch: int = 256) -> Any:
        whole_reads.append(subject)
        return await read_subject(stream, subject, after_seq, batch)

    monkeypatch.setattr(world.broker, "read_subject", counted)
    settings = world.settings()
    async with Providers.connect(settings.sandbox_url) as providers:
        projector = Projector(
            world.broker, settings, registry, providers, logging.getLogger("tests.projector")
        )
        assert await projector.plan_run(steps.run_id) == 0
        assert whole_reads == []
        assert await projector.plan_run(paid[0].run_id) == 2
        # Its whole journal, and no other.
        whose = f"{world.ns.name}.run.{paid[0].run_id}."
        assert whole_reads and all(subject.startswith(whose) for subject in whole_reads), whole_reads


async def test_a_journal_read_that_ends_before_the_event_that_asked_is_planned_again_later(
    world: World,
) -> None:
    """A replica behind the journal answered the planner's read: planning from it would miss the very event that
    asked for the plan (a late receipt's email, the audit trail's last events), and record a plan the reconciler
    would trust. It fails as retryable (the event is delivered again), and plans once the read reaches it."""
    events, _ = await paid_run(world)
    await journal(world, events)
    run_id = events[0].run_id
    last = (await RunJournal(world.broker, world.ns).read(run_id))[1]
    settings = world.settings()
    async with Providers.connect(settings.sandbox_url) as providers:
        projector = Projector(
            world.broker, settings, REGISTRY, providers, logging.getLogger("tests.projector")
        )
        with pytest.raises(BrokerUnavailable):
            await projector.plan_run(run_id, at_least=last + 1)
        assert await world.broker.kv_get(world.records, world.ns.projection_plan_key(run_id)) is None
        assert await projector.plan_run(run_id, at_least=last) == 3
    entry = await world.broker.kv_get(world.records, world.ns.projection_plan_key(run_id))
    assert entry is not None and plan_decoder.decode(entry.value).last_seq == last


async def test_a_plan_that_cannot_be_recorded_is_logged_and_the_run_is_planned_all_the_same(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan on record only saves the reconciler a journal read: a write refused (NATS away, a NATS user not yet
    allowed `plan.*` during an upgrade) must not fail the planning, nor send its milestone to the dead letters."""
    events, _ = await paid_run(world)
    await journal(world, events)
    run_id = events[0].run_id
    kv_write = world.broker.kv_write

    async def refusing(spec: KvSpec, key: str, value: bytes, **kwargs: Any) -> int:
        if key == world.ns.projection_plan_key(run_id):
            raise BrokerUnavailable("refused", subject=spec.subject(key))
        return await kv_write(spec, key, value, **kwargs)

    monkeypatch.setattr(world.broker, "kv_write", refusing)
    settings = world.settings()
    async with Providers.connect(settings.sandbox_url) as providers:
        projector = Projector(
            world.broker, settings, REGISTRY, providers, logging.getLogger("tests.projector")
        )
        assert await projector.plan_run(run_id) == 3
    assert await world.broker.kv_get(world.records, world.ns.projection_plan_key(run_id)) is None
