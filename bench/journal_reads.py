"""What one journal read costs nats-server and the reader, by where the run sits in the stream and by how it is read:
across the run's subjects at once (a wildcard batch, as `RunJournal.stored` reads) or one event class at a time, cut
at the last sequence asked first (cheaper for the server far back in a long stream, and rejected: with replicas
answering direct gets it can leave a hole; docs/decisions.md).

`python bench/journal_reads.py [--runs 20000] [--reads 300]` starts its own nats-server (JetStream, a temporary
file store), fills a stream with `--runs` journals of 3 step events and 1 milestone each (a subject per run and
class: 2 x runs subjects), then reads `--reads` journals of old runs (the first tenth of the stream) and of
recent ones (the last 20), each way twice, and prints the CPU (user + system, /proc) of nats-server and of this
process per read, and the wall time per read."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crashsafe.contracts.streams import StreamSpec
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_reads import StoredMessage

PAYLOAD = b"x" * 400  # a journal event's size on the wire, about
STREAM = "JOURNALS"
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def _fill(broker: Broker, runs: int) -> None:
    for run in range(runs):
        for _ in range(3):
            await broker.nc.publish(f"j.run.r{run}.step", PAYLOAD)
        await broker.nc.publish(f"j.run.r{run}.milestone", PAYLOAD)
        if run % 2000 == 0:
            await broker.nc.flush()
    await broker.publish("j.run.last.step", PAYLOAD)  # acknowledged: everything before it is stored


async def main(runs: int, reads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp), port=free_port(), open_access=True).start()
        try:
            broker = await Broker.connect(server.url, "journal-reads")
            await broker.ensure_stream(StreamSpec(name=STREAM, subjects=("j.run.>",)))
            await _fill(broker, runs)
            assert server.process is not None
            pid = server.process.pid

            async def across(run: str) -> list[StoredMessage]:
                return await broker.read_subject(STREAM, f"j.run.{run}.*")

            async def by_class(run: str) -> list[StoredMessage]:
                last = await broker.last_on_subject(STREAM, f"j.run.{run}.*")
                assert last is not None
                parts = await asyncio.gather(
                    *(broker.read_subject(STREAM, f"j.run.{run}.{kind}") for kind in ("step", "milestone"))
                )
                return sorted((m for part in parts for m in part if m.seq <= last.seq), key=lambda m: m.seq)

            ways: list[tuple[str, Callable[[str], Awaitable[list[StoredMessage]]]]] = [
                ("across the run's subjects", across),
                ("one class at a time", by_class),
            ]
            print(f"{runs} runs ({4 * runs} messages, {2 * runs} subjects); per read:")
            for where, sample in (
                ("old", [f"r{random.randrange(max(runs // 10, 1))}" for _ in range(reads)]),
                ("recent", [f"r{runs - 1 - random.randrange(20)}" for _ in range(reads)]),
            ):
                for name, read in ways * 2:
                    server0, client0, wall0 = _cpu_s(pid), time.process_time(), time.perf_counter()
                    for run in sample:
                        assert len(await read(run)) == 4
                    server_us = 1e6 * (_cpu_s(pid) - server0) / reads
                    client_us = 1e6 * (time.process_time() - client0) / reads
                    wall_us = 1e6 * (time.perf_counter() - wall0) / reads
                    print(
                        f"  {where:6s} {name:26s} nats-server {server_us:6.0f} µs  reader {client_us:5.0f} µs"
                        f"  wall {wall_us:6.0f} µs"
                    )
            await broker.close()
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--reads", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.reads))
