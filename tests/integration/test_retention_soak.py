"""Months of runs in seconds (issue 31): with retention set to seconds, runs driven through the gateway, a runtime and
an executor for several retention periods keep a flat number of session lanes, active-run records, executor rows
and journal subjects in RUNS (the reconciler archives each ended run and purges it), where with retention off each
grows with every run; and a run asked again after its records expired and its journal was archived is still
answered as a duplicate, never run twice. Each run has a new guest and session (the worst case for the
buckets). `SOAK_ROUNDS` lengthens it (`just soak-retention`); the figures are printed (`-s`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.heartbeats import CONTRACTED_KEY, Contracted, contracted_encoder
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.retention import RecordRetention
from crashsafe.contracts.run_events import RunCompleted, RunStarted
from crashsafe.contracts.streams import active_spec, sessions_spec, versions_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain.registry import LocalOperation, Registration, Registry, Tool
from crashsafe.natsd import NatsServer
from crashsafe.services.gateway import app as gateway
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.run_archive import open_archive
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.run_journal import RunJournal
from tests.integration.test_composition import STAMP, TwoStamps
from tests.support import inprocess
from tests.support.nats_users import access
from tests.support.stack import auth_header, guest_event
from tests.support.waiting import eventually

ROUNDS = int(os.environ.get("SOAK_ROUNDS", "3"))
RUNS_A_ROUND = int(os.environ.get("SOAK_RUNS_A_ROUND", "8"))
SHORT = dataclasses.replace(
    RecordRetention(),
    sessions_s=2,
    active_s=1,
    step_rows_s=2,
    prune_every_s=0.5,
    prune_batch=50,
    journals_s=2,
)
OFF = dataclasses.replace(
    RecordRetention(),
    sessions_s=0,
    active_s=0,
    approvals_s=0,
    step_rows_s=0,
    business_rows_s=0,
    journals_s=0,
)


@pytest.mark.filterwarnings("ignore::litestar.exceptions.LitestarDeprecationWarning")
@pytest.mark.parametrize("retention", [OFF, SHORT], ids=["off", "short"])
async def test_kept_records_stay_flat_over_retention_periods_and_every_run_stays_deduplicated(
    nats_server: NatsServer,
    broker: Broker,
    namespace: Namespace,
    tmp_path: Path,
    retention: RecordRetention,
) -> None:
    stamped: list[str] = []

    async def stamp(args: dict[str, Any], key: str) -> dict[str, Any]:
        stamped.append(key)
        return {"stamped": args["n"]}

    registry = Registry.of(Registration(agent=TwoStamps(), tools=(Tool(STAMP, LocalOperation(stamp)),)))
    settings = dataclasses.replace(
        inprocess.settings_for(nats_server.url, namespace, data_dir=tmp_path),
        retention=retention,
        archive_dir=tmp_path / "archive",
        # Rows here are pruned 2 s after their receipt; a request asked before the last prune's cutoff (give or take
        # the hosts' clock skew) is looked up by key first. With the default 2 s of skew every request of the soak
        # counted as asked before it, and each one waited on a lookup (under CI's load, past the round's 30 s). A
        # deployment's floor is a day of rows against seconds of skew; one host here has none.
        clock_skew_s=0.2,
    )
    gateway_settings = dataclasses.replace(settings, nats_access=access(nats_server.url, Role.GATEWAY))
    await inprocess.provisioned(settings)
    key = (await ClientKeys(broker, namespace).create("acme", [Scope.EVENTS_WRITE])).key
    # The rollout is over (`infra contract`): the reconciler may archive; the test reads as the services do.
    marker = Contracted(release=VERSION, at=datetime.now(UTC))
    spec = versions_spec(namespace)
    await broker.kv_write(spec, CONTRACTED_KEY, contracted_encoder.encode(marker), revision=None)
    broker.archive = open_archive(settings.archive_dir, namespace.name)
    journal = RunJournal(broker, namespace)
    runs_stream = namespace.stream(StreamKind.RUNS)
    # (runs, sessions kept, active kept, executor rows, journal subjects kept in RUNS)
    figures: list[tuple[int, int, int, int, int]] = []

    async def kept(stream: str) -> int:
        return (await broker.js.stream_info(stream)).state.messages  # one per key: history 1

    async with (
        inprocess.runtime(settings, registry=registry) as runtime,
        inprocess.executor(settings, STAMP.family, registry=registry) as executor,
        inprocess.reconciler(settings) as reconciler,
        AsyncTestClient(app=gateway.build_app(gateway_settings, registry)) as client,
    ):
        await runtime.start()
        client.headers.update(auth_header(key))
        first: dict[str, Any] = {}
        round_subjects: list[int] = []
        for round_no in range(ROUNDS):
            runs = []
            for n in range(RUNS_A_ROUND):
                body = guest_event(
                    f"evt-{round_no}-{n}",
                    guest_id=f"g-{round_no}-{n}",
                    session_id=f"s-{round_no}-{n}",
                    text="go",
                )
                answer = await client.post("/v1/events", json=body)
                assert answer.status_code == 202, answer.text
                runs.append(answer.json()["run_id"])
                first = first or {"body": body, "run_id": runs[0]}

            async def ended(runs: list[str] = runs) -> bool:
                for run_id in runs:
                    events, _ = await journal.read(run_id)
                    if not events or not isinstance(events[-1], RunCompleted):
                        return False
                return True

            await eventually(ended, what=f"round {round_no}'s runs completed", timeout_s=30)
            # The subjects this round's journals stand on: steps, milestones, and the bus's intents (one per
            # family and partition asked) and receipts (one per family that answered).
            written = {
                m.subject
                for r in runs
                for m in await broker.read_subject(runs_stream, namespace.run_events(r))
            }
            round_subjects.append(len(written))
            await asyncio.sleep(2.5)  # a retention period passes (the executor prunes on its own schedule)
            if reconciler.archiver.enabled:  # the reconciler's pass (every CRASHSAFE_ARCHIVE_EVERY_S)
                assert (await reconciler.archiver.run_pass(datetime.now(UTC))).blocked is None
            rows = sum([await store.count() for store in executor.stores.values()])
            done = (round_no + 1) * RUNS_A_ROUND
            figures.append(
                (
                    done,
                    await kept(sessions_spec(namespace).stream),
                    await kept(active_spec(namespace).stream),
                    rows,
                    await broker.subject_count(runs_stream, namespace.run_events_all),
                )
            )

        # The first run, asked again after its lane, its active record and its executor rows are gone and its
        # journal left RUNS for the archive: the same run, a duplicate, and nothing called again.
        calls = len(stamped)
        again = await client.post("/v1/events", json=first["body"])
        assert again.status_code == 202 and again.json()["run_id"] == first["run_id"], again.text
        assert again.json().get("duplicate") is True, again.text
        await asyncio.sleep(1.0)
        events, _ = await journal.read(first["run_id"])
        assert sum(isinstance(e, RunStarted) for e in events) == 1
        assert len(stamped) == calls == 2 * ROUNDS * RUNS_A_ROUND

    print(
        f"\nretention {'on' if retention.sessions_s else 'off'}: (runs, sessions kept, active kept, rows,"
        f" journal subjects) {figures}"
    )
    total = ROUNDS * RUNS_A_ROUND
    last = figures[-1]
    if retention is OFF:
        # Everything every run wrote is still there.
        assert last == (total, total, total, 2 * total, sum(round_subjects)), (figures, round_subjects)
    else:
        # Bounded by what one retention period holds, not by the runs so far: flat from round to round.
        # (a store keeps its newest row through a pass: one a partition at most)
        for _, sessions, active, rows, journals in figures:
            assert max(sessions, active) <= RUNS_A_ROUND, figures
            assert rows <= 2 * RUNS_A_ROUND + settings.partitions, figures
            assert journals <= max(round_subjects), (figures, round_subjects)
