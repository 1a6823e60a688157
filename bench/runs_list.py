"""What `crashsafe runs list` costs against folding every journal, on an embedded nats-server.

`python -m bench.runs_list [--runs N]`: N booking-shaped journals (13 events each: a start, five model answers,
three intents and receipts, the end), then the wall time and messages read by (1) the listing's newest 50,
(2) the listing of every run, and (3) the baseline: reading the whole stream and folding every journal."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ModelAnswered,
    RunCompleted,
    RunEvent,
    RunStarted,
    ToolCall,
    event_encoder,
)
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.fold import replay, summarize
from crashsafe.natsd import NatsServer
from crashsafe.runs import list_runs
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.records.run_journal import RunJournal

T0 = datetime(2031, 1, 1, tzinfo=UTC)
TOOLS = ("search_hotels", "create_booking", "create_payment")


def journal(i: int) -> list[RunEvent]:
    run_id, at = f"run_{i:05d}", T0 + timedelta(seconds=i)
    events: list[RunEvent] = [
        RunStarted(
            run_id=run_id,
            at=at,
            agent="booking",
            session_id=f"s{i}",
            guest_id=f"g{i % 50}",
            event_id=f"e{i}",
            idempotency_key=f"e{i}",
            input_hash="0" * 64,
            text="Book a room in Lisbon from 2031-12-01 to 2031-12-03",
            deadline_at=at + timedelta(minutes=2),
        )
    ]
    step = 1
    for tool in TOOLS:
        events.append(
            ModelAnswered(
                run_id=run_id,
                at=at,
                step_no=step,
                model="m",
                response_id=f"resp_{i}_{step}",
                tool_calls=[ToolCall(call_id=f"c{step}", name=tool, arguments='{"city": "Lisbon"}' * 4)],
                input_tokens=900,
            )
        )
        key = f"{tool}:{i:040d}"
        events.append(
            ActionRequested(
                run_id=run_id,
                at=at,
                step_no=step + 1,
                call_id=f"c{step}",
                tool=tool,
                family="booking",
                args={
                    "hotel_id": "lis-1",
                    "check_in": "2031-12-01",
                    "check_out": "2031-12-03",
                    "guest_id": "g",
                },
                key=key,
                input_hash="1" * 64,
                timeout_s=5.0,
                deadline_at=at + timedelta(minutes=1),
            )
        )
        events.append(
            ActionCompleted(
                run_id=run_id,
                at=at,
                step_no=step + 1,
                key=key,
                status=OutcomeStatus.SUCCEEDED,
                result={
                    "hotels": [
                        {"hotel_id": f"lis-{n}", "name": "Hotel Lisboa", "nightly_cents": 12000}
                        for n in range(3)
                    ]
                },
            )
        )
        step += 2
    for _ in range(2):
        events.append(
            ModelAnswered(
                run_id=run_id, at=at, step_no=step, model="m", response_id=f"r{step}", reply="Booked. " * 30
            )
        )
        step += 1
    events.append(RunCompleted(run_id=run_id, at=at, reply="Booked. " * 30))
    return events


async def measure(url: str, runs: int, repeat: int) -> None:
    broker = await Broker.connect(url, "bench-runs-list")
    ns = Namespace("runsbench")
    try:
        await provision(broker, ns)

        async def append(i: int) -> None:
            for event in journal(i):
                await broker.publish(ns.run_event(event.run_id, EventClass.STEP), event_encoder.encode(event))

        for start in range(0, runs, 100):
            await asyncio.gather(*(append(i) for i in range(start, min(start + 100, runs))))
        head = await broker.stream_head(ns.stream(StreamKind.RUNS))
        print(f"{runs} runs, {head} events in the stream")

        async def listing(limit: int) -> str:
            rows, read = await list_runs(broker, ns, limit=limit)
            return (
                f"{len(rows)} rows, {read.messages} messages read "
                f"({read.first_reads} first events, {read.folded} journals folded)"
            )

        async def baseline(_: int) -> str:
            journals = await RunJournal(broker, ns).read_all()
            summaries = [summarize(s) for e in journals.values() if (s := replay(e)) is not None]
            return f"{len(summaries)} runs"

        # The machine is shared: each figure is the median of `repeat` runs, interleaved so load hits all alike.
        times: dict[str, list[float]] = {}
        said: dict[str, str] = {}
        cases = (
            ("runs list (newest 50)", listing, 50),
            ("runs list --limit 0 (all)", listing, 0),
            ("baseline: read the whole stream, fold every journal", baseline, 0),
        )
        for _ in range(repeat):
            for label, case, limit in cases:
                began = time.perf_counter()
                said[label] = await case(limit)
                times.setdefault(label, []).append(time.perf_counter() - began)
        for label, _, _ in cases:
            print(f"{label}: median {statistics.median(times[label]) * 1000:.0f} ms, {said[label]}")
    finally:
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crashsafe-runs-list-") as tmp:
        server = NatsServer(Path(tmp), open_access=True).start()
        try:
            asyncio.run(measure(server.url, args.runs, args.repeat))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
