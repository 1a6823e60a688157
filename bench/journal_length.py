"""Does a step cost more in a long run? The awaited journal append (the run's version checked across its
subjects) in a fresh run against one with 1,000 events and more, beside 2,000 other runs, and the cold read of the
long run (what a worker that does not hold it pays once)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crashsafe.contracts.run_events import Budget, ModelAnswered, RunStarted
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.records.run_journal import RunJournal


def _started(run_id: str, now: datetime) -> RunStarted:
    return RunStarted(
        run_id=run_id,
        at=now,
        agent="bench",
        session_id="s",
        guest_id="g",
        event_id=run_id,
        idempotency_key=run_id,
        input_hash="0" * 64,
        text="hello",
        budget=Budget(),
        deadline_at=now + timedelta(seconds=90),
    )


def _answer(run_id: str, step: int, now: datetime) -> ModelAnswered:
    return ModelAnswered(run_id=run_id, at=now, step_no=step, model="m", response_id="r", reply="y")


async def _appends(journal: RunJournal, run_id: str, seq: int, n: int) -> tuple[int, list[float]]:
    now, took = datetime.now(UTC), []
    for step in range(n):
        start = time.perf_counter()
        seq = await journal.append(_answer(run_id, step, now), seq)
        took.append((time.perf_counter() - start) * 1e3)
    return seq, took


async def _measure(url: str, others: int, long_events: int, rounds: int) -> None:
    broker = await Broker.connect(url, "bench-journal-length")
    ns = Namespace("journal_length")
    try:
        await provision(broker, ns)
        journal, now = RunJournal(broker, ns), datetime.now(UTC)
        for _ in range(others):
            run_id = "run_" + uuid.uuid4().hex[:24]
            await _appends(journal, run_id, await journal.append(_started(run_id, now), 0), 9)
        fresh, long = ("run_" + uuid.uuid4().hex[:24] for _ in range(2))
        fresh_seq = await journal.append(_started(fresh, now), 0)
        long_seq, _ = await _appends(journal, long, await journal.append(_started(long, now), 0), long_events)
        for n in range(rounds):
            fresh_seq, a = await _appends(journal, fresh, fresh_seq, 300)
            long_seq, b = await _appends(journal, long, long_seq, 300)
            start = time.perf_counter()
            events, _ = await journal.read(long)
            read_ms = (time.perf_counter() - start) * 1e3
            print(
                f"round {n + 1}: append p50 in a fresh run {statistics.median(a):.3f} ms, in a run of"
                f" {len(events) - 300}+ events {statistics.median(b):.3f} ms; a cold read of that run"
                f" ({len(events)} events) {read_ms:.0f} ms"
            )
    finally:
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--others", type=int, default=2000, help="other runs of 10 events in the stream")
    parser.add_argument("--long", type=int, default=1000, help="events in the long run before measuring")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as store:
        server = NatsServer(Path(store), port=free_port(), open_access=True).start()
        try:
            asyncio.run(_measure(server.url, args.others, args.long, args.rounds))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
