"""The reconciler on the real nats-server, as its own NATS user, with no projector running: an ended run whose
projections have no receipt gets its tasks published again; a delivered or dead receipt is left alone; a pending
receipt is left to the projector until its next attempt is long past; a hostile journal never stops the tick."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from crashsafe.contracts.headers import Header
from crashsafe.contracts.keys import action_key, input_hash, run_id_for
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.projections import (
    AUDIT_TRAIL_TOOL,
    PlannedProjection,
    ProjectionPlan,
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
    plan_decoder,
    record_decoder,
    task_decoder,
)
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    RunCompleted,
    RunEvent,
    RunStarted,
)
from crashsafe.contracts.streams import projections_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.missing_projections import planned
from crashsafe.domain.projection_rules import Trigger
from crashsafe.domain.registry import Registry, load
from crashsafe.natsd import NatsServer
from crashsafe.projections_command import projections_list, projections_retry
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.projector.service import Projector
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.reconciler.service import Reconciler
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.waiting import eventually, unique

STAYHUB = load("crashsafe.services.agents:stayhub")
record_encoder = msgspec.json.Encoder()


@pytest.fixture
async def reconciler(nats_server: NatsServer, namespace: Namespace) -> AsyncIterator[Reconciler]:
    """The reconciler with the booking deployment's registry, connected as the `reconciler` NATS user; it never
    ticks by itself (the test calls `tick(now)`)."""
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, worker_id="rp"), projection_time_scale=0.01
    )
    await inprocess.provisioned(settings)
    broker = await Broker.connect(
        nats_server.url, "tests-reconciler-projections", access=access(nats_server.url, Role.RECONCILER)
    )
    worker = Reconciler(broker, settings, logging.getLogger("tests.reconciler"), registry=STAYHUB)
    try:
        await worker.start()
        yield worker
    finally:
        await broker.close()


def _paid_booking(run_id: str, now: datetime) -> list[RunEvent]:
    """A booking run that charged for its booking and completed (the model's steps are not needed here)."""
    key = unique("ev")
    started = RunStarted(
        run_id=run_id,
        at=now,
        agent="booking",
        session_id=f"s-{key}",
        guest_id=unique("guest"),
        event_id=key,
        idempotency_key=key,
        input_hash="0" * 64,
        text="Book Lisbon",
        budget=Budget(),
        deadline_at=now + timedelta(seconds=Budget().deadline_s),
    )
    args = {"booking_id": unique("bk"), "guest_id": started.guest_id, "amount_cents": 100, "currency": "EUR"}
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
    paid = ActionCompleted(
        run_id=run_id,
        at=now,
        step_no=1,
        key=intent.key,
        status=OutcomeStatus.SUCCEEDED,
        result={"payment_id": "pay_1", "status": "captured"},
        provider_ref="pay_1",
    )
    return [started, intent, paid, RunCompleted(run_id=run_id, at=now, reply="Booked and paid.")]


async def _journal(broker: Broker, ns: Namespace, events: list[RunEvent]) -> None:
    await _journal_on(broker, ns, events, 0)


async def _journal_on(broker: Broker, ns: Namespace, events: list[RunEvent], seq: int) -> None:
    journal = RunJournal(broker, ns)
    for event in events:
        seq = await journal.append(event, seq)


async def _tasks(broker: Broker, ns: Namespace, run_id: str) -> list[ProjectionTask]:
    """Every projection task published for the run, on any projection tool's subject."""
    stored = await broker.read_subject(ns.stream(StreamKind.PROJECTIONS), f"{ns.name}.projection.*.{run_id}")
    return [task_decoder.decode(m.data) for m in stored]


async def _receipt(broker: Broker, ns: Namespace, task: ProjectionTask, record: ProjectionRecord) -> None:
    await broker.kv_write(
        projections_spec(ns),
        ns.projection_record_key(task.tool, task.key),
        record_encoder.encode(record),
        revision=None,
    )


def _record(
    task: ProjectionTask, status: ProjectionStatus, now: datetime, next_attempt: datetime | None = None
) -> ProjectionRecord:
    return ProjectionRecord(
        tool=task.tool,
        key=task.key,
        run_id=task.run_id,
        status=status,
        attempts=2,
        planned_at=task.planned_at,
        updated_at=now,
        next_attempt_at=next_attempt,
    )


async def _plan_on_record(
    broker: Broker, ns: Namespace, run_id: str, tasks: list[ProjectionTask], last_seq: int | None = None
) -> None:
    """The plan the projector records once it published an ended run's tasks (from its journal as it stands,
    unless `last_seq` says otherwise)."""
    plan = ProjectionPlan(
        run_id=run_id,
        events=4,
        last_seq=(await RunJournal(broker, ns).read(run_id))[1] if last_seq is None else last_seq,
        planned_at=datetime.now(UTC),
        tasks=tuple(PlannedProjection(tool=t.tool, key=t.key) for t in tasks),
    )
    await broker.kv_write(
        projections_spec(ns), ns.projection_plan_key(run_id), record_encoder.encode(plan), revision=None
    )


def _planned(events: list[RunEvent], now: datetime) -> list[ProjectionTask]:
    """What the projector plans from the journal `events`."""
    tasks = planned(STAYHUB, events, now)  # type: ignore[arg-type]
    assert tasks is not None
    return tasks


def _registry_projections(registry: Registry) -> set[str]:
    return set(registry.projections)


async def _ended(reconciler: Reconciler, run_id: str) -> None:
    await eventually(
        lambda: run_id in reconciler.projection_checks.ended.runs, what=f"the reconciler saw {run_id} end"
    )


async def test_a_completed_runs_lost_projections_are_published_again_once_and_settled_ones_left_alone(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    assert {"send_confirmation_email", "update_crm"} <= _registry_projections(STAYHUB)
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    await _journal(broker, namespace, _paid_booking(run_id, now))
    await _ended(reconciler, run_id)

    # Within the grace the projector is presumed at work: nothing is published.
    await reconciler.tick(now)
    assert await _tasks(broker, namespace, run_id) == []

    # Past the grace, no receipt at all: each planned projection is published again, once.
    later = now + timedelta(seconds=reconciler.projection_checks.grace_s + 0.1)
    await reconciler.tick(later)
    tasks = await _tasks(broker, namespace, run_id)
    tools = sorted(t.tool for t in tasks)
    assert {"send_confirmation_email", "update_crm"} <= set(tools)
    assert len(tools) == len(set(tools)), f"one task per projection, got {tools}"
    assert all(t.run_id == run_id and t.agent == "booking" for t in tasks)
    email = next(t for t in tasks if t.tool == "send_confirmation_email")
    crm = next(t for t in tasks if t.tool == "update_crm")
    assert email.key.startswith("email:") and crm.key.startswith("crm:")

    # Before its re-check the run is not read again; at it, receipts decide: delivered and dead are left alone,
    # a pending one being tried is the projector's.
    await reconciler.tick(later)
    assert len(await _tasks(broker, namespace, run_id)) == len(tasks)
    recheck = later + timedelta(seconds=reconciler.projection_checks.recheck_s + 0.1)
    await _receipt(broker, namespace, email, _record(email, ProjectionStatus.DELIVERED, recheck))
    await _receipt(
        broker, namespace, crm, _record(crm, ProjectionStatus.PENDING, recheck, next_attempt=recheck)
    )
    for other in tasks:
        if other.tool not in ("send_confirmation_email", "update_crm"):
            await _receipt(broker, namespace, other, _record(other, ProjectionStatus.DEAD, recheck))
    await reconciler.tick(recheck)
    assert len(await _tasks(broker, namespace, run_id)) == len(tasks)
    assert run_id in reconciler.projection_checks.ended.runs  # the CRM record is not settled yet

    # The pending CRM receipt's next attempt long past (its worker died, its task purged): published again,
    # keeping the planning time of its receipt.
    stale = recheck + timedelta(
        seconds=reconciler.projection_checks.stale_s + reconciler.projection_checks.max_gap_s + 1
    )
    await reconciler.tick(stale)
    again = [t for t in await _tasks(broker, namespace, run_id) if t.tool == "update_crm"]
    assert len(again) == 2
    assert again[1].key == crm.key and again[1].planned_at == crm.planned_at

    # Delivered: the run is forgotten, and nothing more is published for it.
    await _receipt(broker, namespace, crm, _record(crm, ProjectionStatus.DELIVERED, stale))
    done = stale + timedelta(seconds=reconciler.projection_checks.max_gap_s + 1)
    await reconciler.tick(done)
    assert run_id not in reconciler.projection_checks.ended.runs
    assert len(await _tasks(broker, namespace, run_id)) == len(tasks) + 1
    assert reconciler.projection_checks.counts["settled_runs"] == 1


async def test_work_per_tick_is_bounded(reconciler: Reconciler, broker: Broker, namespace: Namespace) -> None:
    reconciler.projection_checks.reads_per_tick = (
        5  # under the publishes' bound (50): each bound is seen alone
    )
    now = datetime.now(UTC)
    runs = [run_id_for("", unique("run")) for _ in range(reconciler.projection_checks.reads_per_tick + 5)]
    for run_id in runs:
        await _journal(broker, namespace, _paid_booking(run_id, now))
    for run_id in runs:
        await _ended(reconciler, run_id)
    later = now + timedelta(seconds=reconciler.projection_checks.grace_s + 0.1)
    await reconciler.tick(later)
    per_run = {r: await _tasks(broker, namespace, r) for r in runs}
    touched = [r for r, tasks in per_run.items() if tasks]
    assert 0 < len(touched) <= reconciler.projection_checks.reads_per_tick
    assert sum(len(t) for t in per_run.values()) <= reconciler.projection_checks.publishes_per_tick
    assert len(touched) < len(runs)  # the rest wait for the next ticks
    # Later ticks put back the rest (a run cut short by the budget is completed at its re-check).
    expected = {"send_confirmation_email", "update_crm"}
    for _ in range(10):
        # Each next tick when the next run is due, all within the stale window of what was put back.
        due = min((r.due_at for r in reconciler.projection_checks.ended.runs.values()), default=later)
        assert due - later < timedelta(seconds=reconciler.projection_checks.stale_s)
        await reconciler.tick(due)
        per_run = {r: await _tasks(broker, namespace, r) for r in runs}
        if all(expected <= {t.tool for t in tasks} for tasks in per_run.values()):
            break
    assert all(expected <= {t.tool for t in tasks} for tasks in per_run.values()), per_run
    for tasks in per_run.values():  # and no task twice
        keys = [t.key for t in tasks]
        assert len(keys) == len(set(keys)), keys


async def test_a_hostile_journal_does_not_stop_the_others(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    """A run of an agent this deployment does not run, and a run whose payment arguments are garbage: neither
    stops the tick; the good run next to them is still put back."""
    assert AUDIT_TRAIL_TOOL in STAYHUB.projections
    now = datetime.now(UTC)
    stranger, garbage, good = (run_id_for("", unique("run")) for _ in range(3))
    events = _paid_booking(stranger, now)
    events[0] = msgspec.structs.replace(events[0], agent="no_such_agent")  # type: ignore[type-var]
    await _journal(broker, namespace, events)
    events = _paid_booking(garbage, now)
    intent = events[1]
    assert isinstance(intent, ActionRequested)
    events[1] = msgspec.structs.replace(intent, args={"booking_id": {"nested": ["x" * 3000]}, "guest_id": 7})
    await _journal(broker, namespace, events)
    await _journal(broker, namespace, _paid_booking(good, now))
    for run_id in (stranger, garbage, good):
        await _ended(reconciler, run_id)
    await reconciler.tick(now + timedelta(seconds=reconciler.projection_checks.grace_s + 0.1))
    # The stranger's run: no email or CRM record (no agent to call for them), its audit trail all the same.
    assert {t.tool for t in await _tasks(broker, namespace, stranger)} <= {AUDIT_TRAIL_TOOL}
    assert await _tasks(broker, namespace, good)


async def test_an_operator_retries_a_dead_projection_and_only_a_dead_one(
    reconciler: Reconciler,
    broker: Broker,
    namespace: Namespace,
    nats_server: NatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`crashsafe projections retry KEY`, as the operator user: a dead email goes back to pending and its task,
    re-planned from the journal, is published; a delivered one is refused and nothing is sent."""
    monkeypatch.setenv("CRASHSAFE_NATS_URL", nats_server.url)
    monkeypatch.setenv("CRASHSAFE_NAMESPACE", namespace.name)
    monkeypatch.setenv("CRASHSAFE_NATS_CREDS", str(access(nats_server.url, Role.OPERATOR).creds))
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    await _journal(broker, namespace, _paid_booking(run_id, now))
    await _ended(reconciler, run_id)
    await reconciler.tick(now + timedelta(seconds=reconciler.projection_checks.grace_s + 0.1))
    tasks = await _tasks(broker, namespace, run_id)
    email = next(t for t in tasks if t.tool == "send_confirmation_email")
    crm = next(t for t in tasks if t.tool == "update_crm")
    dead = msgspec.structs.replace(
        _record(email, ProjectionStatus.DEAD, now), detail="422 from the receiver: address refused"
    )
    await _receipt(broker, namespace, email, dead)
    await _receipt(broker, namespace, crm, _record(crm, ProjectionStatus.DELIVERED, now))

    assert await projections_list(tmp_path, "dead", run_id) == 0
    listed = capsys.readouterr().out
    assert email.key in listed and "address refused" in listed and crm.key not in listed

    assert await projections_retry(tmp_path, crm.key) == 1
    assert await projections_retry(tmp_path, email.key) == 0
    after = await _tasks(broker, namespace, run_id)
    assert len(after) == len(tasks) + 1
    sent = after[-1]
    assert (sent.tool, sent.key, sent.args) == (email.tool, email.key, email.args)
    assert sent.planned_at > dead.updated_at  # the give-up clock starts again, from the retry
    entry = await broker.kv_get(
        projections_spec(namespace), namespace.projection_record_key(email.tool, email.key)
    )
    assert entry is not None
    record = record_decoder.decode(entry.value)
    assert record.status is ProjectionStatus.PENDING and record.attempts == dead.attempts
    # Not dead any more: a second retry is refused (the projector is trying it).
    assert await projections_retry(tmp_path, email.key) == 1
    assert len(await _tasks(broker, namespace, run_id)) == len(after)


async def test_an_operator_retries_a_pending_projection_nobody_is_trying(
    reconciler: Reconciler,
    broker: Broker,
    namespace: Namespace,
    nats_server: NatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pending receipt whose next attempt is long past and whose task is gone (a retry that died between its
    receipt and its publish; a run the reconciler let go of, or forgot once it saw the projection dead): the
    reconciler no longer tracks the run, so the operator's retry is the only way back, and must not refuse it
    as "the projector is trying it"."""
    monkeypatch.setenv("CRASHSAFE_NATS_URL", nats_server.url)
    monkeypatch.setenv("CRASHSAFE_NAMESPACE", namespace.name)
    monkeypatch.setenv("CRASHSAFE_NATS_CREDS", str(access(nats_server.url, Role.OPERATOR).creds))
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    await _journal(broker, namespace, _paid_booking(run_id, now))
    await _ended(reconciler, run_id)
    await reconciler.tick(now + timedelta(seconds=reconciler.projection_checks.grace_s + 0.1))
    tasks = await _tasks(broker, namespace, run_id)
    email = next(t for t in tasks if t.tool == "send_confirmation_email")
    an_hour_ago = now - timedelta(hours=1)
    orphaned = msgspec.structs.replace(
        _record(email, ProjectionStatus.PENDING, an_hour_ago, next_attempt=an_hour_ago),
        detail="retried by an operator after: 422 from the receiver",
    )
    await _receipt(broker, namespace, email, orphaned)
    # A receipt pending and being tried is still the projector's.
    trying = _record(email, ProjectionStatus.PENDING, now, next_attempt=now + timedelta(seconds=30))
    crm = next(t for t in tasks if t.tool == "update_crm")
    await _receipt(broker, namespace, crm, trying)
    assert await projections_retry(tmp_path, crm.key) == 1

    assert await projections_retry(tmp_path, email.key) == 0
    after = await _tasks(broker, namespace, run_id)
    assert len(after) == len(tasks) + 1
    assert (after[-1].tool, after[-1].key) == (email.tool, email.key)


async def test_a_run_settled_by_its_plan_and_receipts_is_let_go_without_reading_its_journal(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    """The projector's plan on record and every receipt delivered: the run is forgotten by the plan alone. Its
    journal here holds only its end (the plan would fail on it, counted): a read would show."""
    checks = reconciler.projection_checks
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    tasks = _planned(_paid_booking(run_id, now), now)
    end = RunCompleted(run_id=run_id, at=now, reply="Booked and paid.")
    await _journal(broker, namespace, [end])
    await _ended(reconciler, run_id)
    await _plan_on_record(broker, namespace, run_id, tasks)
    for task in tasks:
        await _receipt(broker, namespace, task, _record(task, ProjectionStatus.DELIVERED, now))

    by_plan = metrics.PROJECTION_CHECKS.labels("plan")
    before = by_plan._value.get()
    later = now + timedelta(seconds=checks.grace_s + 0.1)
    await reconciler.tick(later)
    assert run_id not in checks.ended.runs
    counted = (checks.counts["by_plan"], checks.counts["settled_runs"], checks.counts["failed_checks"])
    assert counted == (1, 1, 0)
    assert by_plan._value.get() == before + 1  # what an operator's dashboard reads
    assert await _tasks(broker, namespace, run_id) == []

    # An event appended after the end (a late receipt after a hand-off) makes the run one to check again, though
    # it was settled and forgotten: the projector plans it again, and the plan on record is not that plan.
    journal = RunJournal(broker, namespace)
    late = ActionCompleted(
        run_id=run_id,
        at=now + timedelta(seconds=1),
        step_no=1,
        key=action_key(run_id, 1),
        status=OutcomeStatus.SUCCEEDED,
        result={"payment_id": "pay_1", "status": "captured"},
        provider_ref="pay_1",
    )
    ended_header = {Header.RUN_ENDED.value: "1"}  # as the runtime marks an event after its run's end
    await journal.append(late, (await journal.read(run_id))[1], ended_header, after_end=True)
    await eventually(lambda: run_id in checks.ended.runs, what="the late event seen")
    await reconciler.tick(later + timedelta(seconds=checks.grace_s + 1.2))
    assert checks.counts["by_plan"] == 1  # its journal was read (it opens with an end: nothing to plan there)
    assert run_id not in checks.ended.runs


async def test_a_plan_pending_at_its_receiver_is_checked_again_later_and_a_missing_receipt_reads_the_journal(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    checks = reconciler.projection_checks
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    events = _paid_booking(run_id, now)
    tasks = _planned(events, now)
    await _journal(broker, namespace, events)
    await _ended(reconciler, run_id)
    await _plan_on_record(broker, namespace, run_id, tasks)
    email = next(t for t in tasks if t.tool == "send_confirmation_email")
    for task in tasks:
        status = ProjectionStatus.PENDING if task is email else ProjectionStatus.DELIVERED
        await _receipt(broker, namespace, task, _record(task, status, now, next_attempt=now))

    # Pending and being tried: the projector's; judged by the plan, kept, nothing published.
    later = now + timedelta(seconds=checks.grace_s + 0.1)
    await reconciler.tick(later)
    assert run_id in checks.ended.runs and checks.counts["by_plan"] == 1
    assert await _tasks(broker, namespace, run_id) == []

    # Its receipt gone (a purged bucket, a receipt never written): only the journal has the task to put back.
    await broker.kv_delete(
        projections_spec(namespace), namespace.projection_record_key(email.tool, email.key)
    )
    recheck = later + timedelta(seconds=checks.recheck_s + 0.1)
    await reconciler.tick(recheck)
    assert checks.counts["by_plan"] == 1
    assert [(t.tool, t.key) for t in await _tasks(broker, namespace, run_id)] == [(email.tool, email.key)]


async def test_a_plan_made_before_the_journal_last_moved_is_not_trusted(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    """A plan on record from before the run's last event (an empty one here, which would settle the run at once),
    whatever the events' times say (each runtime replica stamps its own): the journal is read, and what it calls
    for is published, the audit trail of the whole journal with it."""
    checks = reconciler.projection_checks
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    events = _paid_booking(run_id, now)
    await _journal(broker, namespace, events[:-1])
    before_the_end = (await RunJournal(broker, namespace).read(run_id))[1]
    await _journal_on(broker, namespace, events[-1:], before_the_end)
    await _ended(reconciler, run_id)
    await _plan_on_record(broker, namespace, run_id, [], last_seq=before_the_end)

    await reconciler.tick(now + timedelta(seconds=checks.grace_s + 0.1))
    assert checks.counts["by_plan"] == 0
    tasks = await _tasks(broker, namespace, run_id)
    assert {"send_confirmation_email", "update_crm", AUDIT_TRAIL_TOOL} <= {t.tool for t in tasks}
    assert next(t for t in tasks if t.tool == AUDIT_TRAIL_TOOL).upto == len(events)


async def test_an_audit_only_plan_written_after_the_runs_full_plan_never_stands_for_the_ended_run(
    reconciler: Reconciler, broker: Broker, namespace: Namespace, nats_server: NatsServer
) -> None:
    """Two projector replicas plan one ended run out of order: one plans everything from the run's end; the other,
    lagging on the approval the run once waited for (it never saw the end), flushes only the audit trail, from a
    journal read that already reaches the end. That audit-only plan is not the run's plan: recorded at the run's
    last sequence, it would settle the run by its audit receipt alone, and a lost email or CRM record would never
    be put back."""
    checks = reconciler.projection_checks
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    await _journal(broker, namespace, _paid_booking(run_id, now))
    await _ended(reconciler, run_id)
    settings = inprocess.settings_for(nats_server.url, namespace)
    async with Providers.connect(settings.sandbox_url) as providers:

        def replica() -> Projector:
            return Projector(broker, settings, STAYHUB, providers, logging.getLogger("tests.projector"))

        assert await replica().plan_run(run_id) == 3  # the email, the CRM record and the audit trail
        assert await replica().plan_run(run_id, Trigger.AUDIT) == 1
    entry = await broker.kv_get(projections_spec(namespace), namespace.projection_plan_key(run_id))
    assert entry is not None
    on_record = plan_decoder.decode(entry.value)
    assert {t.tool for t in on_record.tasks} == {"send_confirmation_email", "update_crm", AUDIT_TRAIL_TOOL}, (
        f"the plan on record is {on_record.tasks}: an audit-only flush replaced the run's plan"
    )
    # The audit trail was delivered; the email and the CRM record were lost on their way (no receipt).
    published = await _tasks(broker, namespace, run_id)
    audit = next(t for t in published if t.tool == AUDIT_TRAIL_TOOL)
    await _receipt(broker, namespace, audit, _record(audit, ProjectionStatus.DELIVERED, now))

    await reconciler.tick(now + timedelta(seconds=checks.grace_s + 0.1))
    again = sorted(t.tool for t in await _tasks(broker, namespace, run_id))
    assert again == sorted([*(t.tool for t in published), "send_confirmation_email", "update_crm"]), (
        f"published for the run: {again}; the lost email and CRM record were not put back"
    )
    assert run_id in checks.ended.runs  # checked again until their receipts come


async def test_runs_judged_by_their_plans_are_bounded_per_tick_too(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    """Up to `checks_per_tick` a tick; a run that needs its journal read while the tick's reads are spent (none
    here) waits for a later tick, and the runs behind it are still judged by their plans."""
    checks = reconciler.projection_checks
    checks.checks_per_tick, checks.reads_per_tick = 5, 0
    now = datetime.now(UTC)
    unplanned = run_id_for("", unique("run"))
    await _journal(
        broker, namespace, [RunCompleted(run_id=unplanned, at=now - timedelta(seconds=1), reply="x")]
    )
    runs = [run_id_for("", unique("run")) for _ in range(6)]
    for run_id in runs:
        await _journal(broker, namespace, [RunCompleted(run_id=run_id, at=now, reply="done")])
        await _plan_on_record(broker, namespace, run_id, [])
    for run_id in [unplanned, *runs]:
        await _ended(reconciler, run_id)
    later = now + timedelta(seconds=checks.grace_s + 0.1)
    await reconciler.tick(later)
    assert checks.counts["by_plan"] == 4 and len(checks.ended.runs) == 3
    await reconciler.tick(later)
    assert checks.counts["by_plan"] == 6 and set(checks.ended.runs) == {unplanned}


async def test_a_plan_no_rule_expected_is_logged_and_the_journal_decides(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    """A plan naming a tool no subject can carry (a hostile or buggy writer): never a net that stops on it."""
    checks = reconciler.projection_checks
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    await _journal(broker, namespace, _paid_booking(run_id, now))
    await _ended(reconciler, run_id)
    hostile = ProjectionTask(
        tool="no.such tool", key="k", run_id=run_id, tenant="", agent="booking", planned_at=now
    )
    await _plan_on_record(broker, namespace, run_id, [hostile])

    await reconciler.tick(now + timedelta(seconds=checks.grace_s + 0.1))
    assert checks.counts["by_plan"] == 0
    assert {"send_confirmation_email", "update_crm"} <= {
        t.tool for t in await _tasks(broker, namespace, run_id)
    }


async def test_a_compensation_requested_after_a_forgotten_runs_end_makes_it_one_to_check_again(
    reconciler: Reconciler, broker: Broker, namespace: Namespace
) -> None:
    """Only receipts carry the runtime's after-the-end mark; any other event journaled after the end (a milestone
    that neither ends the run nor makes it wait) is one too."""
    checks = reconciler.projection_checks
    now = datetime.now(UTC)
    run_id = run_id_for("", unique("run"))
    events = _paid_booking(run_id, now)
    await _journal(broker, namespace, events)
    await _ended(reconciler, run_id)
    checks.ended.runs.pop(run_id)  # settled and forgotten
    intent = events[1]
    assert isinstance(intent, ActionRequested)
    refund = msgspec.structs.replace(intent, step_no=2, key=action_key(run_id, 2), tool="refund_payment")
    journal = RunJournal(broker, namespace)
    await journal.append(refund, (await journal.read(run_id))[1], after_end=True)
    await eventually(lambda: run_id in checks.ended.runs, what="the event after the end seen")
