"""The journals' archive (issue 31, months of runs), with a hot window of seconds: ended runs are archived and their
subjects purged from RUNS; the API, the export and the replay serve them from the archive byte for byte as before;
the same event sent again, past INBOUND's window too, is still a duplicate; a late message is refused naming the
archive; a run with an open unknown stays until it settles; a crash between the archive write and the purge is
finished by the next pass; and nothing is purged before `infra contract` or beside a release that reads no archive."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from crashsafe.contracts.archive import purge_filter
from crashsafe.contracts.audit import ProviderEffect
from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import ArchiveUnavailable, RunArchived
from crashsafe.contracts.heartbeats import (
    CONTRACTED_KEY,
    Contracted,
    VersionBeat,
    beat_encoder,
    contracted_encoder,
)
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    RunCompleted,
    RunHandedOff,
    RunStarted,
    decode_event,
)
from crashsafe.contracts.streams import versions_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.tool_messages import ActionOutcome, Answer, OutcomeStatus
from crashsafe.domain.agent import ProjectionCall
from crashsafe.domain.registry import LocalOperation, ProviderAnswer, Registration, Registry, Tool
from crashsafe.domain.run_state import RunState
from crashsafe.export_file import export_lines
from crashsafe.natsd import NatsServer
from crashsafe.replay import read_run, replayed_text
from crashsafe.services.agents.booking import BookingAgent
from crashsafe.services.agents.booking.booking_tools import TOOLS as BOOKING_TOOLS
from crashsafe.services.agents.remember_preference import REMEMBER_PREFERENCE
from crashsafe.services.gateway import app as gateway
from crashsafe.services.operations.provider_audit import audit_all
from crashsafe.services.platform.hook_limit import HookLimit
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.run_archive import FileArchive, open_archive
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from
from crashsafe.services.reconciler.journal_archiver import JournalArchiver
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.run_journal import RunJournal
from tests.integration.test_composition import STAMP, TwoStamps
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.runs import started
from tests.support.stack import auth_header, guest_event
from tests.support.waiting import eventually

# The hot window (below the setting's floor of a day: tests only). Each pass is given its clock, so a slow machine
# never ages a run past it by accident.
WINDOW_S = 60
KEPT = dataclasses.replace(RecordRetention(), journals_s=WINDOW_S)


def _settings(nats_server: NatsServer, namespace: Namespace, tmp_path: Path) -> Settings:
    return dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path / "data"),
        retention=KEPT,
        archive_dir=tmp_path / "archive",
    )


async def _contracted(broker: Broker, namespace: Namespace) -> None:
    """What `crashsafe infra contract` records once the rollout is over: archiving may start."""
    marker = Contracted(release=VERSION, at=datetime.now(UTC))
    await broker.kv_write(
        versions_spec(namespace), CONTRACTED_KEY, contracted_encoder.encode(marker), revision=None
    )


async def _subjects(broker: Broker, namespace: Namespace, run_id: str) -> int:
    return await broker.subject_count(namespace.stream(StreamKind.RUNS), purge_filter(namespace, run_id))


async def _past_window(archiver: JournalArchiver, then: datetime | None = None) -> dict[str, int]:
    """One archive pass a hot window (and a little) after `then` (default: now)."""
    now = (then or datetime.now(UTC)) + timedelta(seconds=WINDOW_S + 1)
    done = await archiver.run_pass(now)
    assert done.blocked is None, done.blocked
    return {"archived": done.archived, **done.kept}


@pytest.mark.filterwarnings("ignore::litestar.exceptions.LitestarDeprecationWarning")
async def test_ended_runs_are_archived_purged_and_still_served_and_deduplicated(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    stamped: list[str] = []

    async def stamp(args: dict[str, Any], key: str) -> dict[str, Any]:
        stamped.append(key)
        return {"stamped": args["n"]}

    registry = Registry.of(Registration(agent=TwoStamps(), tools=(Tool(STAMP, LocalOperation(stamp)),)))
    settings = _settings(nats_server, namespace, tmp_path)
    operator = dataclasses.replace(settings, nats_access=access(nats_server.url, Role.OPERATOR))
    gateway_settings = dataclasses.replace(settings, nats_access=access(nats_server.url, Role.GATEWAY))
    await inprocess.provisioned(settings)
    key = (await ClientKeys(broker, namespace).create("acme", [Scope.EVENTS_WRITE, Scope.RUNS_READ])).key
    journal = RunJournal(broker, namespace)

    async with (
        inprocess.runtime(settings, registry=registry) as runtime,
        inprocess.executor(settings, STAMP.family, registry=registry),
        inprocess.reconciler(settings) as reconciler,
        AsyncTestClient(app=gateway.build_app(gateway_settings, registry)) as client,
    ):
        await runtime.start()
        client.headers.update(auth_header(key))
        bodies = [
            guest_event(f"evt-{n}", guest_id=f"g-{n}", session_id=f"s-{n}", text="go") for n in range(3)
        ]
        runs = []
        for body in bodies:
            answer = await client.post("/v1/events", json=body)
            assert answer.status_code == 202, answer.text
            runs.append(answer.json()["run_id"])

        async def ended() -> bool:
            for run_id in runs:
                events, _ = await journal.read(run_id)
                if not events or not isinstance(events[-1], RunCompleted):
                    return False
            return True

        await eventually(ended, what="the runs completed", timeout_s=30)

        async def served(run_id: str) -> tuple[Any, ...]:
            state = await client.get(f"/v1/runs/{run_id}")
            events = await client.get(f"/v1/runs/{run_id}/events")
            assert state.status_code == events.status_code == 200, (state.text, events.text)
            export = await read_run(operator, registry, run_id)
            assert export is not None and export.header is not None
            lines = export_lines(export.header, export.events)
            return state.content, events.content, lines, replayed_text(export, registry, None, True, True)

        before = {run_id: await served(run_id) for run_id in runs}
        archiver = reconciler.archiver

        # Before `infra contract`, nothing leaves the stream (a rollback to 0.2.0 must still find every journal).
        waiting = await archiver.run_pass(datetime.now(UTC) + timedelta(seconds=WINDOW_S + 1))
        assert waiting.blocked is not None and "infra contract" in waiting.blocked
        await _contracted(broker, namespace)
        # Inside the hot window: kept.
        assert (await archiver.run_pass(datetime.now(UTC))).archived == 0
        assert await _past_window(archiver) == {"archived": 3}
        for run_id in runs:
            assert await _subjects(broker, namespace, run_id) == 0  # purged from RUNS
            assert (tmp_path / "archive" / namespace.name / "runs" / f"{run_id}.json").is_file()
            assert await served(run_id) == before[run_id]  # the API, export and replay: byte for byte

        # The audit still finds each effect a provider lists in a journal: the archived ones are read too.
        broker.archive = open_archive(settings.archive_dir, namespace.name)
        findings, stats = await audit_all(broker, settings, registry, Holds(stamped), Listing(stamped))
        assert (findings, stats.runs, stats.listed_effects) == ([], 3, 6)

        # The same event again, after INBOUND's window too (its message purged as if aged out): a duplicate of the
        # archived run, no second run, nothing called again.
        calls = len(stamped)
        inbound = namespace.stream(StreamKind.INBOUND)
        await broker.purge_filter(inbound, namespace.inbound(runs[0]))
        again = await client.post("/v1/events", json=bodies[0])
        assert again.status_code == 202 and again.json() == {"run_id": runs[0], "duplicate": True}, again.text
        await asyncio.sleep(1.0)
        assert await _subjects(broker, namespace, runs[0]) == 0
        assert len(stamped) == calls

        # A late message for an archived run is refused naming the archive; nothing is journaled.
        with pytest.raises(RunArchived) as woken:
            await inprocess.wake(runtime, runs[1], "late")
        assert woken.value.archive == f"{namespace.name}/runs/{runs[1]}.json"
        late = ActionOutcome(
            run_id=runs[1], step_no=2, tool=STAMP.name, key=f"{runs[1]}:2", status=OutcomeStatus.SUCCEEDED
        )
        with pytest.raises(RunArchived):
            await runtime.record_outcome(late, context_from(None), STAMP.family)
        assert await _subjects(broker, namespace, runs[1]) == 0


class Listing:
    """The stamp provider's listing of every effect it holds (by key)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    async def effects(self) -> list[ProviderEffect]:
        return [ProviderEffect(kind="stamp", key=key) for key in self.keys]


class Holds:
    """The stamp provider asked by key: it holds every stamp it listed."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    async def lookup(self, tool: Tool, key: str, timeout: float, args: Any = None) -> ProviderAnswer:
        return ProviderAnswer(Answer.FOUND if key in self.keys else Answer.ABSENT, {})


def _requested(run_id: str, at: datetime) -> ActionRequested:
    return ActionRequested(
        run_id=run_id,
        at=at,
        step_no=1,
        call_id="c1",
        tool=STAMP.name,
        family=STAMP.family,
        args={"n": 1},
        key=f"{run_id}:1",
        input_hash="0" * 64,
        timeout_s=2.0,
        deadline_at=at + timedelta(seconds=2),
    )


async def _handed_off_with_an_unknown(journal: RunJournal, run_id: str) -> ActionRequested:
    """A run handed off with an outcome still unknown (a provider that never answered before the deadline)."""
    now = datetime.now(UTC)
    begun = msgspec.structs.replace(started(agent="two_stamps", at=now), run_id=run_id)
    request = _requested(run_id, now)
    unknown = ActionCompleted(
        run_id=run_id, at=now, step_no=1, key=request.key, status=OutcomeStatus.UNKNOWN, result={}
    )
    seq = 0
    for event in (begun, request, unknown, RunHandedOff(run_id=run_id, at=now, reason="deadline")):
        seq = await journal.append(event, seq)
    return request


async def test_a_run_with_an_open_unknown_stays_until_it_settles_and_a_crash_before_the_purge_is_finished(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    settings = _settings(nats_server, namespace, tmp_path)
    await inprocess.provisioned(settings)
    await _contracted(broker, namespace)
    broker.archive = open_archive(settings.archive_dir, namespace.name)  # the test reads as a service would
    journal = RunJournal(broker, namespace)
    run_id = f"run_{uuid.uuid4().hex[:24]}"
    request = await _handed_off_with_an_unknown(journal, run_id)
    async with inprocess.reconciler(settings) as reconciler:
        archiver = reconciler.archiver
        # Far past its hot window, but its outcome is unknown: the reconciler still asks by key. Kept.
        assert await _past_window(archiver) == {"archived": 0, "outcome_unknown": 1}
        assert await _subjects(broker, namespace, run_id) == 2
        await archiver.run_pass(datetime.now(UTC) + timedelta(days=30))  # however long: kept
        assert await _subjects(broker, namespace, run_id) == 2

        # It settles: a late receipt, journaled after the run's end (a milestone).
        _, seq = await journal.read(run_id)
        settled = ActionCompleted(
            run_id=run_id,
            at=datetime.now(UTC),
            step_no=1,
            key=request.key,
            status=OutcomeStatus.SUCCEEDED,
            result={"stamped": 1},
        )
        await journal.append(settled, seq, after_end=True)
        assert (await archiver.run_pass(datetime.now(UTC))).archived == 0  # it moved just now: hot
        assert await _subjects(broker, namespace, run_id) == 2

        # A crash between the archive write and the purge (planted: the purge never happens): both are left.
        crashed = reconciler.broker

        async def dies(*args: Any, **kwargs: Any) -> int:
            raise SystemExit("killed after the archive was written")

        crashed.purge_filter = dies  # type: ignore[method-assign]
        with pytest.raises(SystemExit):
            await _past_window(archiver)
        archived = tmp_path / "archive" / namespace.name / "runs" / f"{run_id}.json"
        assert archived.is_file() and await _subjects(broker, namespace, run_id) == 2
        whole = await journal.stored(run_id)  # the stream's copy, still whole: served from it

        # A new reconciler (the walk starts again) finishes it: the same archive, then the purge.
        del crashed.purge_filter
        archiver = JournalArchiver(crashed, settings, reconciler.logger, None, "reconciler:again")
        assert await _past_window(archiver) == {"archived": 1}
        assert await _subjects(broker, namespace, run_id) == 0
        assert [m.data for m in await journal.stored(run_id)] == [m.data for m in whole]
        assert [m.seq for m in await journal.stored(run_id)] == [m.seq for m in whole]
        assert json.loads(archived.read_bytes())["run_id"] == run_id


async def test_nothing_is_purged_while_a_process_of_a_release_before_the_archive_is_alive(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> None:
    """A 0.2.0 gateway beside this release would take a purged run's event for a new run: no purge while it beats."""
    settings = _settings(nats_server, namespace, tmp_path)
    await inprocess.provisioned(settings)
    await _contracted(broker, namespace)
    broker.archive = open_archive(settings.archive_dir, namespace.name)
    journal = RunJournal(broker, namespace)
    run_id = f"run_{uuid.uuid4().hex[:24]}"
    now = datetime.now(UTC)
    begun = msgspec.structs.replace(started(agent="two_stamps", at=now), run_id=run_id)
    seq = await journal.append(begun, 0)
    await journal.append(RunCompleted(run_id=run_id, at=now, reply="done"), seq)
    old = VersionBeat(
        version="0.2.0",
        runs_beside_since="0.1.0",
        service="gateway",
        worker="old-1",
        pid=1,
        started_at=now,
        beat_at=now,
    )
    spec = versions_spec(namespace)
    beat = namespace.version_beat_key("gateway", "old-1")
    await broker.kv_write(spec, beat, beat_encoder.encode(old), revision=None, ttl_s=60)
    async with inprocess.reconciler(settings) as reconciler:
        done = await reconciler.archiver.run_pass(now + timedelta(seconds=WINDOW_S + 1))
        assert done.blocked is not None and "gateway old-1 0.2.0" in done.blocked
        assert await _subjects(broker, namespace, run_id) == 2
        await broker.kv_delete(spec, beat)  # the old gateway stopped
        assert await _past_window(reconciler.archiver, now) == {"archived": 1}
        assert await _subjects(broker, namespace, run_id) == 0
        first = await journal.first(run_id)  # the archive answers the first event, as the stream did
        assert first is not None and isinstance(decode_event(first.data), RunStarted)


class Unreliable:
    """The archive's port over the real directory, failing as a volume can: every write refused (`refuse`), or
    what is read back not what was written (`garble`)."""

    def __init__(self, archive: FileArchive, *, refuse: bool = False, garble: bool = False) -> None:
        self.inner, self.refuse, self.garble = archive, refuse, garble

    def name(self, run_id: str) -> str:
        return self.inner.name(run_id)

    async def put(self, run_id: str, data: bytes) -> None:
        if self.refuse:
            raise ArchiveUnavailable("the volume is read-only", archive=self.name(run_id))
        await self.inner.put(run_id, data[:-1] if self.garble else data)

    async def get(self, run_id: str) -> bytes | None:
        return await self.inner.get(run_id)

    async def exists(self, run_id: str) -> bool:
        return await self.inner.exists(run_id)

    async def runs(self) -> list[str]:
        return await self.inner.runs()


@pytest.mark.parametrize("failure", ["refuse", "garble"])
async def test_a_journal_whose_archive_is_not_written_whole_stays_in_the_stream(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path, failure: str
) -> None:
    """Nothing is purged unless the archive was written and read back equal: a refused write, or an object read back
    other than written, leaves the journal in the stream and the pass says why."""
    settings = _settings(nats_server, namespace, tmp_path)
    await inprocess.provisioned(settings)
    await _contracted(broker, namespace)
    journal = RunJournal(broker, namespace)
    run_id = f"run_{uuid.uuid4().hex[:24]}"
    now = datetime.now(UTC)
    begun = msgspec.structs.replace(started(agent="two_stamps", at=now), run_id=run_id)
    seq = await journal.append(begun, 0)
    await journal.append(RunCompleted(run_id=run_id, at=now, reply="done"), seq)
    async with inprocess.reconciler(settings) as reconciler:
        archiver = reconciler.archiver
        assert isinstance(archiver.archive, FileArchive)
        flaky = Unreliable(archiver.archive, **{failure: True})
        archiver.archive = flaky
        done = await archiver.run_pass(now + timedelta(seconds=WINDOW_S + 1))
        assert done.archived == 0 and len(done.failed) == 1, done
        assert ("read-only" if failure == "refuse" else "read back differs") in done.failed[0]
        assert await _subjects(broker, namespace, run_id) == 2
        assert [e for _, e in await journal.read_with_seqs(run_id)][-1] == RunCompleted(
            run_id=run_id, at=now, reply="done"
        )
        # The volume back, the next pass archives it (over a garbled object too) and purges.
        archiver.archive = flaky.inner
        later = await archiver.run_pass(now + timedelta(seconds=WINDOW_S + 1 + archiver.every_s))
        assert (later.archived, later.failed) == (1, []), later
        assert await _subjects(broker, namespace, run_id) == 0


class _PlansBadly(BookingAgent):
    """The booking agent with a `projections` hook that raises on some ended runs (an adopter's bug: an index
    into results a run that ended early never got)."""

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        if "boom" in state.started.text:
            raise IndexError("list index out of range")
        if "hang" in state.started.text:
            # A synchronous call that hangs; finite, so a broken limit fails the test rather than hanging it.
            time.sleep(20)
        return super().projections(state)


@pytest.mark.timeout(0)  # SIGALRM is the hook limit's here, as in a reconciler's process
@pytest.mark.parametrize("misbehaves", ["boom", "hang"])
async def test_an_agent_whose_projections_hook_raises_keeps_its_run_and_stops_no_other_runs_archive(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path, misbehaves: str
) -> None:
    """The archiver asks each ended run's agent what it projects: an agent's hook that raises is the agent's fault,
    never an archiver that stops for every tenant (its pass raised, its task ended, and a restarted one walks into
    the same run first). The run is kept, as a journal nobody can plan from; the others are archived."""
    registry = Registry.of(Registration(agent=_PlansBadly(), tools=(*BOOKING_TOOLS, REMEMBER_PREFERENCE)))
    settings = _settings(nats_server, namespace, tmp_path)
    await inprocess.provisioned(settings)
    await _contracted(broker, namespace)
    journal = RunJournal(broker, namespace)
    now = datetime.now(UTC)
    runs = {}
    for text in (f"{misbehaves}: a run its agent cannot plan", "a run like any other"):
        run_id = f"run_{uuid.uuid4().hex[:24]}"
        begun = msgspec.structs.replace(started(agent="booking", text=text, at=now), run_id=run_id)
        seq = await journal.append(begun, 0)
        await journal.append(RunCompleted(run_id=run_id, at=now, reply="done"), seq)
        runs[text[:4]] = run_id
    limit = HookLimit(0.3)  # the reconciler's composition root installs it (CRASHSAFE_HOOK_LIMIT_S)
    assert limit.install()
    try:
        async with inprocess.reconciler(settings, registry=registry) as reconciler:
            reconciler.archiver.hook_limit = limit
            assert await _past_window(reconciler.archiver) == {"archived": 1, "unreadable": 1}
    finally:
        limit.uninstall()
    assert await _subjects(broker, namespace, runs[misbehaves[:4]]) == 2  # its journal stays whole
    assert await _subjects(broker, namespace, runs["a ru"]) == 0
