"""Contracting a deployment whose journals are on the old layout (one subject per run): `crashsafe infra apply` only
adds (the old subjects stay taken), and `crashsafe infra contract` copies every run onto its event classes'
subjects, in order, exactly once, narrows the stream, and the projector's planner does not plan the upgraded runs
again; it refuses while an older process may be alive (a heartbeat of an older release, or a runtime pulling with
no heartbeat of this release to account for it)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from crashsafe.contracts.errors import UpgradeBlocked
from crashsafe.contracts.heartbeats import VersionBeat, beat_encoder
from crashsafe.contracts.inbound import inbound_encoder
from crashsafe.contracts.release import RUNS_BESIDE_SINCE, VERSION
from crashsafe.contracts.run_events import (
    ModelAnswered,
    RunCompleted,
    RunEvent,
    RunNudged,
    RunStarted,
    event_encoder,
)
from crashsafe.contracts.streams import (
    projector_planner_consumer,
    runtime_consumers,
    stream_specs,
    versions_spec,
)
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.natsd import NatsServer
from crashsafe.services.operations.contracting import Contraction, contract
from crashsafe.services.operations.journal_layout import LayoutMigration
from crashsafe.services.operations.nats_setup import declare_streams
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from tests.support import inprocess
from tests.support.runs import inbound_of, started
from tests.support.waiting import eventually


def _run(now: datetime, *, ended: bool) -> list[RunEvent]:
    run_id = "run_" + uuid.uuid4().hex[:24]
    events: list[RunEvent] = [
        msgspec.structs.replace(started(at=now), run_id=run_id),
        ModelAnswered(run_id=run_id, at=now, step_no=1, model="m", response_id="r1", reply="thinking"),
    ]
    if ended:
        events.append(RunCompleted(run_id=run_id, at=now, reply="done"))
        events.append(RunNudged(run_id=run_id, at=now, by="operator", reason="after its end"))
    return events


async def _old_layout(
    broker: Broker, ns: Namespace, journals: list[list[RunEvent]], *, planner: bool = True
) -> None:
    """The namespace as the previous version left it: RUNS on `<ns>.run.*`, each journal on its run's subject, and
    the projector's planner on every event."""
    runs = next(s for s in stream_specs(ns) if s.name == ns.stream(StreamKind.RUNS))
    await broker.ensure_stream(replace(runs, subjects=(ns.legacy_run_events_all,)))
    for events in journals:
        seq = 0
        for event in events:
            subject = f"{ns.name}.run.{event.run_id}"
            headers = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
            seq = (
                await broker.publish(
                    subject, event_encoder.encode(event), expected_subject_seq=seq, headers=headers
                )
            ).seq
    await broker.publish(f"{ns.name}.run.h$x", b"not a run's subject")
    if planner:
        old = replace(projector_planner_consumer(ns), filter_subject=ns.legacy_run_events_all)
        await broker.ensure_consumer(old)


async def test_old_journals_are_copied_onto_their_classes_once_and_the_planner_starts_after_them(
    broker: Broker, namespace: Namespace
) -> None:
    now = datetime.now(UTC)
    ended, going = _run(now, ended=True), _run(now, ended=False)
    await _old_layout(broker, namespace, [ended, going])
    stream = namespace.stream(StreamKind.RUNS)
    # A copy interrupted after the ended run's first event: the next one finishes it without a second copy.
    await broker.ensure_stream(
        replace(
            next(s for s in stream_specs(namespace) if s.name == stream),
            subjects=(namespace.legacy_run_events_all, namespace.run_classes_all),
        )
    )
    await RunJournal(broker, namespace).append(ended[0], 0)
    # `infra apply` adds and never takes away: the old layout is still taken, nothing is copied.
    await declare_streams(broker, namespace, 1)
    assert set(await broker.stream_subjects(stream) or []) == {
        namespace.legacy_run_events_all,
        *namespace.run_subjects,
    }

    assert await contract(broker, namespace) == Contraction(
        LayoutMigration(runs=2, events=5, skipped=1), {stream: [namespace.legacy_run_events_all]}
    )

    journal = RunJournal(broker, namespace)
    for events in (ended, going):
        read, _ = await journal.read(events[0].run_id)
        assert read == events
    stored = await broker.read_subject(stream, namespace.run_events(ended[0].run_id))
    assert [m.subject.rsplit(".", 1)[-1] for m in stored] == ["step", "step", "milestone", "milestone"]
    assert all(m.headers.get("traceparent", "").startswith("00-111") for m in stored[1:])
    # The old layout is gone: the stream takes the new subjects only, and no run's old subject holds a message
    # (the one that names no run is left as it was).
    assert await broker.stream_subjects(stream) == list(namespace.run_subjects)
    kept = await broker.last_on_each_subject(stream, namespace.legacy_run_events_all)
    assert [m.subject for m in kept] == [f"{namespace.name}.run.h$x"]
    # The planner is sent nothing of the copies, and milestones from here on.
    planner = projector_planner_consumer(namespace)
    assert await broker.consumer_pending(stream, planner.durable) == 0
    # A run that was going on goes on where it was.
    _, seq = await journal.read(going[0].run_id)
    await journal.append(RunCompleted(run_id=going[0].run_id, at=now, reply="done"), seq)
    assert await broker.consumer_pending(stream, planner.durable) == 1
    # Nothing left to do the second time, and `infra apply` leaves the narrowed stream alone.
    await declare_streams(broker, namespace, 1)
    assert await contract(broker, namespace) is None
    last = await broker.last_on_subject(stream, namespace.run_events(going[0].run_id))
    assert last is not None and last.subject == namespace.run_event(going[0].run_id, EventClass.MILESTONE)


def _beat(version: str, worker: str) -> bytes:
    now = datetime.now(UTC)
    return beat_encoder.encode(
        VersionBeat(
            version=version,
            runs_beside_since=RUNS_BESIDE_SINCE,
            service="runtime",
            worker=worker,
            pid=1,
            started_at=now,
            beat_at=now,
        )
    )


async def test_a_contract_is_refused_while_an_older_runtime_may_be_alive_and_makes_the_planner_when_none_existed(
    broker: Broker, namespace: Namespace
) -> None:
    now = datetime.now(UTC)
    ended = _run(now, ended=True)
    await _old_layout(broker, namespace, [ended], planner=False)
    stream = namespace.stream(StreamKind.RUNS)
    inbound = runtime_consumers(namespace)[0]
    await broker.ensure_stream(next(s for s in stream_specs(namespace) if s.name == inbound.stream))
    await broker.ensure_consumer(inbound)
    versions = versions_spec(namespace)
    await broker.ensure_kv(versions)
    # An older runtime still pulling, with no heartbeat (a release before heartbeats): it would append to the old
    # layout behind the copy.
    pulling = await broker.js.pull_subscribe_bind(inbound.durable, inbound.stream)
    waiting = asyncio.create_task(pulling.fetch(1, timeout=60))
    await eventually(
        lambda: broker.consumer_pullers(inbound.stream, inbound.durable), what="the old runtime pulls"
    )
    with pytest.raises(UpgradeBlocked) as refused:
        await contract(broker, namespace)
    (unheard,) = refused.value.processes
    assert (
        unheard.startswith("runtime without a heartbeat") and f"{inbound.stream}/{inbound.durable}" in unheard
    )
    # A heartbeat of an older release accounts for the request, and blocks all the same, by name.
    await broker.kv_write(versions, "beat.runtime.old", _beat("0.1.0", "old"), revision=None, ttl_s=60)
    with pytest.raises(UpgradeBlocked) as refused:
        await contract(broker, namespace)
    assert refused.value.processes == ["runtime old 0.1.0"]
    assert await broker.stream_subjects(stream) == [namespace.legacy_run_events_all]  # nothing changed
    # The pulling runtime is this release's (its heartbeat says so): the copy goes ahead beside it.
    await broker.kv_delete(versions, "beat.runtime.old")
    await broker.kv_write(versions, "beat.runtime.new", _beat(VERSION, "new"), revision=None, ttl_s=60)

    done = await contract(broker, namespace)
    assert done is not None and done.journals == LayoutMigration(runs=1, events=4, skipped=1)
    waiting.cancel()
    await pulling.unsubscribe()
    # No projector had ever run: its planner is made after the copies all the same, never hours back by time.
    assert await broker.consumer_pending(stream, projector_planner_consumer(namespace).durable) == 0
    # The subject that names no run is left where it was.
    kept = await broker.last_on_each_subject(stream, namespace.legacy_run_events_all)
    assert [m.subject for m in kept] == [f"{namespace.name}.run.h$x"]


async def test_a_reconciler_after_the_upgrade_follows_only_runs_written_within_its_look_back(
    broker: Broker, namespace: Namespace, nats_server: NatsServer, tmp_path: Path
) -> None:
    """The copies are stored now, so the reconciler's follow-by-receive-time sees the whole history: a run that
    stalled a year ago must not be woken, re-ticketed or asked about because an upgrade copied it. Each run was
    accepted (its inbound message, kept as the run's lasting guard); the reconciler reads a journal only once
    something in it may be due."""
    year_ago = datetime.now(UTC) - timedelta(days=365)
    old, recent = _run(year_ago, ended=False), _run(datetime.now(UTC), ended=False)
    await _old_layout(broker, namespace, [old, recent])
    await declare_streams(broker, namespace, 1)
    await contract(broker, namespace)
    for events in (old, recent):
        first = events[0]
        assert isinstance(first, RunStarted)
        await broker.publish(namespace.inbound(first.run_id), inbound_encoder.encode(inbound_of(first)))
    settings = inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data", worker_id="up")
    async with inprocess.reconciler(settings) as reconciler:
        await eventually(lambda: recent[0].run_id in reconciler.work.looks, what="the recent run accepted")
        await reconciler.tick(datetime.now(UTC) + timedelta(seconds=reconciler.cadence.first_s + 1))
        assert recent[0].run_id in reconciler.work.runs
        assert old[0].run_id not in reconciler.work.runs
        assert old[0].run_id not in reconciler.work.looks
