"""`crashsafe runs list` and `crashsafe tail` against a real nats-server: the listing equals the runtime's own fold
of every journal while reading a fraction of the stream, and tail follows live events, filtered, and stops clean."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import timedelta

import msgspec

from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import (
    ModelAnswered,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    event_encoder,
)
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.domain.fold import replay, summarize
from crashsafe.natsd import NatsServer
from crashsafe.runs import list_runs, parse_since
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.records.run_journal import RunJournal
from tests.support.nats_users import access
from tests.support.paths import ROOT
from tests.support.runs import T0, started

RUNS = 300


def _journal(i: int) -> list[RunEvent]:
    """Run i: started i minutes after T0 by guest g<i % 7>; most complete, every 10th is handed off, every
    25th is still running, every 40th had a nudge journaled after its end."""
    run_id = f"run_{i:04d}"
    at = T0 + timedelta(minutes=i)
    first = msgspec.structs.replace(
        started(at=at),
        run_id=run_id,
        guest_id=f"g{i % 7}",
        session_id=f"s{i % 50}",
        tenant="zeta" if i % 3 == 0 else "acme",
    )
    # A model's steps, as a run journals them: most of a journal's bytes, none of which a listing needs.
    answers = [
        ModelAnswered(
            run_id=run_id,
            at=at + timedelta(seconds=step / 10),
            step_no=step,
            model="m",
            response_id=f"r{step}",
            reply="Here is what I found for you. " * 8,
        )
        for step in range(1, 7)
    ]
    if i % 25 == 0:
        return [first]
    end: RunEvent = (
        RunHandedOff(run_id=run_id, at=at + timedelta(seconds=2), reason="budget_steps")
        if i % 10 == 0
        else RunCompleted(run_id=run_id, at=at + timedelta(seconds=2), reply="ok")
    )
    after = (
        [RunNudged(run_id=run_id, at=at + timedelta(seconds=3), by="reconciler", reason="late")]
        if i % 40 == 1
        else []
    )
    return [first, *answers, end, *after]


async def _journal_all(broker: Broker, ns: Namespace) -> None:
    await provision(broker, ns)

    async def append(i: int) -> None:
        for event in _journal(i):
            await broker.publish(ns.run_event(event.run_id, EventClass.STEP), event_encoder.encode(event))

    for start in range(0, RUNS, 50):
        await asyncio.gather(*(append(i) for i in range(start, min(start + 50, RUNS))))
    await broker.publish(
        ns.run_event("hostile", EventClass.STEP), b"\x00 not an event"
    )  # nothing a runtime wrote


async def _truth(broker: Broker, ns: Namespace) -> dict[str, tuple[str, str, int]]:
    """Every run as the runtime's fold sees it from its whole journal: (status, guest, steps)."""
    out = {}
    for run_id, events in (await RunJournal(broker, ns).read_all()).items():
        state = replay(events)
        assert state is not None
        s = summarize(state)
        out[run_id] = (s.status.value, state.guest_id, s.steps)
    return out


async def test_the_listing_equals_the_fold_of_every_journal_and_reads_a_fraction_of_the_stream(
    broker: Broker, namespace: Namespace
) -> None:
    await _journal_all(broker, namespace)
    # The whole stream holds the hostile message too, which decodes as no event: the truth leaves it out.
    hostile = await broker.last_on_subject(namespace.stream(StreamKind.RUNS), namespace.run_events("hostile"))
    assert hostile is not None
    await broker.js.delete_msg(namespace.stream(StreamKind.RUNS), hostile.seq)
    truth = await _truth(broker, namespace)
    await broker.publish(namespace.run_event("hostile", EventClass.STEP), b"\x00 not an event")
    total = (await broker.js.stream_info(namespace.stream(StreamKind.RUNS))).state.messages
    assert len(truth) == RUNS

    everything, _ = await list_runs(broker, namespace, limit=0)
    assert {r.run_id: (r.status, r.guest_id, r.steps) for r in everything} == truth
    assert [r.run_id for r in everything] == [f"run_{i:04d}" for i in reversed(range(RUNS))]  # newest first
    nudged = next(r for r in everything if r.run_id == "run_0041")
    assert (nudged.status, nudged.ended_at) == ("completed", T0 + timedelta(minutes=41, seconds=2))
    assert next(r for r in everything if r.run_id == "run_0050").ended_at is None  # still running

    newest, read = await list_runs(broker, namespace, limit=20)
    assert [r.run_id for r in newest] == [r.run_id for r in everything[:20]]
    assert read.runs == RUNS + 1 and read.folded <= 32
    # The index (a last and a first event per run) and 32 journals, not every event of every run.
    assert read.messages < total / 2, read

    for status in ("running", "completed", "handed_off"):
        rows, _ = await list_runs(broker, namespace, status=status, limit=0)
        assert {r.run_id for r in rows} == {k for k, v in truth.items() if v[0] == status}, status
    rows, read = await list_runs(broker, namespace, guest="g3", limit=0)
    assert {r.run_id for r in rows} == {k for k, v in truth.items() if v[1] == "g3"}
    since = T0 + timedelta(minutes=250)
    rows, read = await list_runs(broker, namespace, since=since, limit=0)
    assert {r.run_id for r in rows} == {f"run_{i:04d}" for i in range(250, RUNS)}
    rows, read = await list_runs(broker, namespace, since=since, limit=5)
    assert [r.run_id for r in rows] == [f"run_{i:04d}" for i in range(299, 294, -1)]
    assert read.first_reads < RUNS / 4  # runs whose last event is older than --since are never read further
    # By index and by whole stream, the same rows.
    for status in ("running", "handed_off"):
        by_index, read = await list_runs(broker, namespace, status=status, limit=3)
        assert read.first_reads > 0 and by_index == [r for r in everything if r.status == status][:3]
    rows, _ = await list_runs(broker, namespace, status="handed_off", guest="g0", since=since, limit=0)
    assert {r.run_id for r in rows} == {
        f"run_{i:04d}" for i in range(250, RUNS) if i % 10 == 0 and i % 25 and i % 7 == 0
    }
    # The console's filters: one tenant's runs only, one session's, by index and by whole stream alike.
    for limit in (0, 3):
        rows, _ = await list_runs(broker, namespace, tenant="zeta", limit=limit)
        zeta = [r for r in everything if r.run_id in {f"run_{i:04d}" for i in range(0, RUNS, 3)}]
        assert rows == (zeta[:limit] if limit else zeta) and {r.tenant for r in rows} == {"zeta"}
        rows, _ = await list_runs(broker, namespace, session="s7", tenant="acme", limit=limit)
        ours = [r for r in everything if r.session_id == "s7" and r.tenant == "acme"]
        assert len(ours) > 3 and rows == (ours[:limit] if limit else ours)


def test_since_reads_durations_and_times() -> None:
    assert parse_since("2h", now=T0) == T0 - timedelta(hours=2)
    assert parse_since("90s", now=T0) == T0 - timedelta(seconds=90)
    assert parse_since("2026-12-01T08:00:00Z") == T0 - timedelta(hours=1)
    assert parse_since("2026-12-01T08:00:00") == T0 - timedelta(hours=1)


async def test_runs_list_and_tail_from_the_command_line(
    broker: Broker, namespace: Namespace, nats_server: NatsServer
) -> None:
    await provision(broker, namespace)
    operator = access(nats_server.url, Role.OPERATOR).creds
    env = {
        "CRASHSAFE_NATS_URL": nats_server.url,
        "CRASHSAFE_NAMESPACE": namespace.name,
        "CRASHSAFE_NATS_CREDS": str(operator),
    }
    tail = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crashsafe.cli",
        "tail",
        "--session",
        "s1",
        "--type",
        "run.started",
        "--type",
        "run.compl*",
        "--json",
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert tail.stdout is not None
    try:
        # Appended until tail shows them: it follows from now, so it may start after the first few appends.
        seen: list[dict[str, object]] = []
        for i in range(1, 200):
            for event in _journal(i):
                await broker.publish(
                    namespace.run_event(event.run_id, EventClass.STEP), event_encoder.encode(event)
                )
            try:
                line = await asyncio.wait_for(tail.stdout.readline(), timeout=0.5 if i < 150 else 5)
            except TimeoutError:
                continue
            seen.append(json.loads(line))
            if len(seen) >= 2:
                break
        assert seen, "tail printed nothing"
        # Only session s1's runs (runs 1, 51, 101, 151), only started and completed events, in journal order.
        assert {e["run_id"] for e in seen} <= {"run_0001", "run_0051", "run_0101", "run_0151"}
        assert all(e["type"] in ("run.started", "run.completed") for e in seen)
        assert [int(str(e["seq"])) for e in seen] == sorted(int(str(e["seq"])) for e in seen)
    finally:
        tail.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(tail.communicate(), timeout=30)
    assert tail.returncode == 0 and b"Traceback" not in err, err.decode()

    # One run, from its start (it ended before tail began), whatever its type: every event in journal order.
    if i < 3:  # the first tail saw enough before run 3 was journaled
        for event in _journal(3):
            await broker.publish(
                namespace.run_event(event.run_id, EventClass.STEP), event_encoder.encode(event)
            )
    one = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crashsafe.cli",
        "tail",
        "--run",
        "run_0003",
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert one.stdout is not None
    try:
        lines = [(await asyncio.wait_for(one.stdout.readline(), timeout=30)).decode() for _ in _journal(3)]
    finally:
        one.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(one.communicate(), timeout=30)
    assert one.returncode == 0 and b"Traceback" not in err, err.decode()
    assert all("run_0003" in line for line in lines)
    assert "started" in lines[0] and "completed" in lines[-1], lines

    listing = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crashsafe.cli",
        "runs",
        "list",
        "--guest",
        "g3",
        "--json",
        "--limit",
        "5",
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(listing.communicate(), timeout=60)
    assert listing.returncode == 0, err.decode()
    rows = [json.loads(line) for line in out.decode().splitlines()]
    assert rows and len(rows) <= 5 and {r["guest_id"] for r in rows} == {"g3"}
    assert [r["started_at"] for r in rows] == sorted((r["started_at"] for r in rows), reverse=True)


async def test_the_listing_holds_more_journal_subjects_than_one_snapshot_answers(
    broker: Broker, namespace: Namespace
) -> None:
    """nats-server answers a `multi_last` over at most 1,024 subjects; a run on the bus stands on about six, so
    past about 170 runs the listing reads the stream instead (it once failed with "413 Too Many Results")."""
    await provision(broker, namespace)
    many = 1100

    async def begin(i: int) -> None:
        event = msgspec.structs.replace(started(at=T0 + timedelta(seconds=i)), run_id=f"run_{i:05d}")
        await broker.publish(namespace.run_event(event.run_id, EventClass.STEP), event_encoder.encode(event))

    for start in range(0, many, 100):
        await asyncio.gather(*(begin(i) for i in range(start, start + 100)))
    rows, _ = await list_runs(broker, namespace, limit=0)
    assert len(rows) == many
    newest, _ = await list_runs(broker, namespace, limit=10)
    assert [r.run_id for r in newest] == [f"run_{i:05d}" for i in range(many - 1, many - 11, -1)]
