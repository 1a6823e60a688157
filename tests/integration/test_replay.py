"""`crashsafe replay` and `crashsafe export` against a real nats-server and a runtime that really ran the run: the
replay's state is the runtime's own, an export replays offline to the same bytes, and a journal holding an event
this version does not know still replays and exports unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec
import pytest

from crashsafe.contracts.catalog import Catalog
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import JournalEvent
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.domain.fold import replay
from crashsafe.domain.run_state import RunState
from crashsafe.export_file import read_export
from crashsafe.natsd import NatsServer
from crashsafe.replay import replay_events
from crashsafe.run_views import state_view
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_catalog import publish_catalog
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import submit_inbound
from tests.support.inprocess import REGISTRY
from tests.support.nats_users import access
from tests.support.stack import CliResult, crashsafe
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT, Sandbox

# The registry in-process services run (tests/support/inprocess.py), for the CLI to load as they do.
BENCH_REGISTRY = "bench.workloads:registry"
BOOKING = REGISTRY.agent("booking").config
PUBLISHED = Catalog(agents={"booking": msgspec.structs.replace(BOOKING, max_repeats=4)}, label="replay tests")


@dataclass
class World:
    runtime: Runtime
    journal: RunJournal
    sandbox: Sandbox
    env: dict[str, str]
    state_dir: Path


@pytest.fixture
async def world(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[World]:
    async with inprocess.sandbox_server() as sandbox_url, AsyncExitStack() as running:
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=sandbox_url, data_dir=tmp_path / "data", worker_id="rt"
        )
        for family in ("booking", "payment", "notify"):
            await running.enter_async_context(inprocess.executor(settings, family))
        model = await running.enter_async_context(inprocess.scripted_model(settings))
        # A published catalog, so every run here is pinned to a revision other than the built-in one.
        await inprocess.provisioned(settings)
        await publish_catalog(broker, namespace, REGISTRY, PUBLISHED)
        runtime = await running.enter_async_context(inprocess.runtime(settings, model, catalog=True))
        await runtime.start()
        http = await running.enter_async_context(httpx.AsyncClient(timeout=10))
        creds = access(nats_server.url, Role.OPERATOR).creds
        env = {
            "CRASHSAFE_NATS_URL": nats_server.url,
            "CRASHSAFE_NAMESPACE": namespace.name,
            "CRASHSAFE_REGISTRY": BENCH_REGISTRY,
            **({"CRASHSAFE_NATS_CREDS": str(creds)} if creds else {}),
        }
        yield World(runtime, RunJournal(broker, namespace), Sandbox(http, sandbox_url), env, tmp_path)


async def _cli(world: World, *args: str, env: dict[str, str] | None = None) -> CliResult:
    result = await crashsafe(*args, "--state-dir", str(world.state_dir), env=env or world.env)
    assert result.returncode == 0, result.stderr
    return result


async def _ended(world: World, run_id: str) -> list[JournalEvent]:
    async def done() -> list[JournalEvent] | None:
        events, _ = await world.journal.read(run_id)
        state = replay(events)
        return events if state is not None and state.terminal else None

    return await eventually(done, what=f"run {run_id} to end")


async def test_replay_of_a_live_run_is_the_state_the_runtime_holds(world: World, broker: Broker) -> None:
    """Caught while its payment is in flight, the runtime's in-memory state after N events is what `crashsafe
    replay --until N` rebuilds from the journal; once the run ended, the replay's final state is the journal's."""
    await world.sandbox.arm("payments", latency_ms=3000)  # keeps the run in the runtime's memory meanwhile
    run_id = await submit_inbound(broker, world.journal.ns, unique("ev"), agent="booking", text=BOOKING_TEXT)

    def paying() -> RunState | None:
        state = inprocess.held_state(world.runtime, run_id)
        return state if state is not None and any(p.tool == "create_payment" for p in state.pending) else None

    held = await eventually(paying, what="the runtime to hold the run with its payment pending")
    upto = held.events  # the runtime's snapshot is of exactly this many journal events: no race with the run
    online = json.loads((await _cli(world, "replay", run_id, "--until", str(upto), "--json")).stdout)
    assert online["state"] == json.loads(json.dumps(state_view(held), default=str))
    assert [t["position"] for t in online["transitions"]] == list(range(1, upto + 1))
    assert online["next"].startswith("wait for create_payment")
    # The pure replay of the same prefix is the runtime's state itself, field for field.
    events, _ = await world.journal.read(run_id)
    assert replay_events(events, REGISTRY, None, until=upto).state == held

    await world.sandbox.clear_faults()
    journal = await _ended(world, run_id)
    final = json.loads((await _cli(world, "replay", run_id, "--json")).stdout)
    state = replay(journal)
    assert state is not None and final["state"] == json.loads(json.dumps(state_view(state), default=str))
    assert final["state"]["status"] == "completed" and final["next"] == "nothing (idle)"
    assert len(final["transitions"]) == len(journal)


async def test_an_export_replays_offline_to_the_same_output_as_the_deployment(
    world: World, broker: Broker
) -> None:
    """`export` then `replay --file` with no NATS reachable prints, byte for byte, what `replay` prints online,
    with and without --diff, --until and --json; the export holds each event exactly as the stream does."""
    run_id = await submit_inbound(broker, world.journal.ns, unique("ev"), agent="booking", text=BOOKING_TEXT)
    journal = await _ended(world, run_id)
    out = world.state_dir / "run.jsonl"
    await _cli(world, "export", run_id, "--out", str(out))
    stream = await broker.read_subject(
        world.journal.ns.stream(StreamKind.RUNS), world.journal.ns.run_events(run_id)
    )
    export = read_export(out.read_bytes())
    assert export.events == tuple(m.data for m in stream) and len(export.events) == len(journal)
    assert export.header is not None and export.header.run_id == run_id
    # The run's pinned revision and that revision's configuration, read from the catalog bucket as the runtime
    # reads it: what an offline replay cannot read for itself.
    assert export.header.catalog_revision >= 1 and export.header.config == PUBLISHED.agents["booking"]
    assert export.header.registry == BENCH_REGISTRY
    assert (await _cli(world, "export", run_id)).stdout.encode() == out.read_bytes()

    nowhere = {**world.env, "CRASHSAFE_NATS_URL": "nats://127.0.0.1:9"}  # offline: nothing listens there
    printed = {}
    for flags in ([], ["--diff"], ["--json"], ["--diff", "--json"], ["--until", "5", "--diff"]):
        online = await _cli(world, "replay", run_id, *flags)
        offline = await _cli(world, "replay", "--file", str(out), *flags, env=nowhere)
        assert offline.stdout == online.stdout, flags
        printed[" ".join(flags)] = online.stdout
    assert "\nnext: nothing (idle)\nprojection: send_confirmation_email key=email:" in printed[""]
    # Stopped at the model's ask for the hold, the runtime would next journal that request (and its key).
    assert "\nnext: journal run.action_requested create_booking key=hold:" in printed["--until 5 --diff"]


async def test_a_journal_with_an_event_this_version_does_not_know_replays_and_exports_unchanged(
    world: World, broker: Broker
) -> None:
    """A newer replica's event (and a hostile one) in the journal: kept byte for byte by the export, named by the
    replay, skipped by the fold, and the run's state and next move are what they would be without it."""
    run_id = await submit_inbound(broker, world.journal.ns, unique("ev"), agent="booking", text=BOOKING_TEXT)
    journal = await _ended(world, run_id)
    _, seq = await world.journal.read(run_id)
    alien = json.dumps(
        {
            "type": "run.reflection.v9",
            "run_id": run_id,
            "at": datetime.now(UTC).isoformat(),
            "step_no": 99,
            "payload": {"nested": ["x" * 100]},
        }
    ).encode()
    await broker.publish(
        world.journal.ns.run_event(run_id, EventClass.STEP),
        alien,
        expected_subject_seq=seq,
        sequence_subject=world.journal.ns.run_events(run_id),
    )
    out = world.state_dir / "alien.jsonl"
    await _cli(world, "export", run_id, "--out", str(out))
    assert read_export(out.read_bytes()).events[-1] == alien
    text = (await _cli(world, "replay", "--file", str(out), "--diff")).stdout
    assert "run.reflection.v9" in text and "not understood by this version" in text
    replayed = json.loads((await _cli(world, "replay", run_id, "--json")).stdout)
    before = replay(journal)
    assert before is not None
    assert replayed["state"]["status"] == "completed" and replayed["state"]["unknown_events"] == [
        "run.reflection.v9"
    ]
    assert replayed["state"]["final_reply"] == before.final_reply


async def test_replay_refuses_a_file_that_is_not_a_journal_naming_the_line(world: World) -> None:
    bad = world.state_dir / "bad.jsonl"
    bad.write_bytes(b'{"type": "crashsafe.export", "format": 1, "run_id": "r"}\n{"not": "an event"}\n')
    result = await crashsafe("replay", "--file", str(bad), "--state-dir", str(world.state_dir), env=world.env)
    assert result.returncode == 1 and "line 2: not a run event" in result.stderr
    missing = await crashsafe("replay", "run_nope", "--state-dir", str(world.state_dir), env=world.env)
    assert missing.returncode == 1 and "no run run_nope" in missing.stderr


async def test_a_corrupt_event_in_a_journal_is_exported_as_it_is_and_named_by_the_replay(
    world: World, broker: Broker
) -> None:
    """A known event type that does not decode (corruption, or a hostile write): the export keeps the bytes for the
    post-mortem, and the replay stops with one line naming the position, not a traceback."""
    run_id = await submit_inbound(broker, world.journal.ns, unique("ev"), agent="booking", text=BOOKING_TEXT)
    journal = await _ended(world, run_id)
    _, seq = await world.journal.read(run_id)
    corrupt = json.dumps({"type": "run.action_completed", "run_id": run_id, "at": "not a time"}).encode()
    await broker.publish(
        world.journal.ns.run_event(run_id, EventClass.STEP),
        corrupt,
        expected_subject_seq=seq,
        sequence_subject=world.journal.ns.run_events(run_id),
    )
    out = world.state_dir / "corrupt.jsonl"
    await _cli(world, "export", run_id, "--out", str(out))
    assert out.read_bytes().splitlines()[-1] == corrupt
    online = await crashsafe("replay", run_id, "--state-dir", str(world.state_dir), env=world.env)
    assert online.returncode == 1, online.stdout
    assert (
        f"position {len(journal) + 1}: not a run event" in online.stderr and "Traceback" not in online.stderr
    )
    offline = await crashsafe(
        "replay", "--file", str(out), "--state-dir", str(world.state_dir), env=world.env
    )
    assert offline.returncode == 1 and f"line {len(journal) + 2}: not a run event" in offline.stderr
