"""What one NATS / JetStream message costs in CPU here, client and server, on the product's own Python paths: the
floor under issue 19's budget (~4 ms of CPU per steps5 run on 2 cores for 2x Restate), so the messages a run may
send can be counted before any work is done.

`python bench/message_floor.py [--n 20000] [--json]` starts its own nats-server (JetStream, a temporary store, a
free port), runs its phases one after another (listed in bench/README.md; the raw-protocol ones on a second
connection, the rest on the product's `Broker`), and stops the server. Each phase reads the
CPU (user + system) of nats-server (`/proc/<pid>/stat`) and of this process (`time.process_time()`) before and
after, and its wall time. A "message" is one exchange: a publish and its PubAck are 1 publish, a delivery and its
ack are 1 delivery, a KV get and its answer are 1 get (`bench/wiretap.py` counts each half: 2 messages there)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from nats.aio.msg import Msg

from crashsafe.contracts.streams import ConsumerSpec, KvSpec, Retention, StreamSpec
from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import NatsServer, free_port
from crashsafe.services.platform.deliveries import Deliveries
from crashsafe.services.platform.jetstream import Broker

# A journal event's size on the wire (run.action_requested and its kin are 300-500 bytes of msgspec JSON).
PAYLOAD = b'{"type":"run.action_requested","run_id":"run_' + b"0" * 24 + b'","args":"' + b"x" * 310 + b'"}'
STEPS_PER_RUN = (
    10  # appends per simulated run in the expected-sequence phase (a steps5 journal is ~12 events)
)
KV = KvSpec(bucket="floor")
CHUNK = 20_000  # the most messages a work queue holds when a consume phase starts a round
_TICK = os.sysconf("SC_CLK_TCK")
_TWO_CORES_US = 2_000_000.0  # CPU microseconds two cores give in one second


def _cpu_s(pid: int) -> float:
    """utime + stime of `pid`, all its threads (fields 14 and 15 of /proc/<pid>/stat, after the `(comm)`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass(frozen=True, slots=True)
class Row:
    phase: str
    what: str
    n: int
    wall_s: float
    p50_us: float  # each message's own latency (publish to PubAck, request to answer); 0 where not timed
    client_us: float  # this process's CPU per message
    server_us: float  # nats-server's CPU per message

    @property
    def total_us(self) -> float:
        return self.client_us + self.server_us

    @property
    def per_s(self) -> float:
        return self.n / self.wall_s


class Meter:
    """Reads the CPU of this process and of nats-server around one phase."""

    def __init__(self, broker: Broker, server_pid: int) -> None:
        self.broker = broker
        self.server_pid = server_pid

    async def phase(
        self,
        phase: str,
        what: str,
        n: int,
        body: Callable[[], Awaitable[list[float]]],
        *,
        rounds: int = 1,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> Row:
        """`body` run `rounds` times (`n` messages in all), each after `before`, which is not metered."""
        print(f"  {phase}: {what} ...", file=sys.stderr, flush=True)
        client = server = wall = 0.0
        latencies: list[float] = []
        for _ in range(rounds):
            if before is not None:
                await before()
            await self.broker.nc.flush()
            client0, server0, wall0 = time.process_time(), _cpu_s(self.server_pid), time.perf_counter()
            latencies += await body()
            # A ping answered: the server has read (and handled, in order) everything sent before it, the acks too.
            await self.broker.nc.flush()
            wall += time.perf_counter() - wall0
            server += _cpu_s(self.server_pid) - server0
            client += time.process_time() - client0
        return Row(
            phase=phase,
            what=what,
            n=n,
            wall_s=wall,
            p50_us=statistics.median(latencies) * 1e6 if latencies else 0.0,
            client_us=client * 1e6 / n,
            server_us=server * 1e6 / n,
        )


class _PubAck(msgspec.Struct):
    seq: int = 0


_pub_ack = msgspec.json.Decoder(_PubAck)


class RawPublisher(asyncio.Protocol):
    """The least Python a JetStream publish can be, for the floor under nats-py: the NATS text protocol on a bare
    asyncio transport, the `PUB`s of one loop turn written together (as nats-py's flusher does: one write, one read
    on the server), PubAcks read on one inbox wildcard and matched by token."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._buf = bytearray()
        self._waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self._counter = 0
        self._pong: asyncio.Future[None] | None = None

    @classmethod
    async def connect(cls, host: str, port: int) -> RawPublisher:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(cls, host, port)
        await proto.ping()  # the server's INFO has come, our CONNECT is taken
        proto._write(b"SUB _INBOX.raw.* 1\r\n")
        await proto.ping()
        return proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(b'CONNECT {"verbose":false,"pedantic":false,"headers":false}\r\n')

    def _write(self, data: bytes) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self._out))
        self._out.clear()

    async def ping(self) -> None:
        self._pong = asyncio.get_running_loop().create_future()
        self._write(b"PING\r\n")
        await self._pong

    async def publish(self, subject: str, payload: bytes) -> int:
        self._counter += 1
        token = b"_INBOX.raw.%d" % self._counter
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        self._write(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), token, len(payload), payload))
        return _pub_ack.decode(await future).seq

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        at = 0
        while True:
            end = buf.find(b"\r\n", at)
            if end < 0:
                break
            if buf.startswith(b"MSG ", at):
                parts = bytes(buf[at:end]).split(b" ")  # MSG <subject> <sid> <size>
                size = int(parts[-1])
                if len(buf) < end + 2 + size + 2:
                    break
                future = self._waiting.pop(parts[1], None)
                if future is not None:
                    future.set_result(bytes(buf[end + 2 : end + 2 + size]))
                at = end + 2 + size + 2
                continue
            line = bytes(buf[at:end])
            at = end + 2
            if line == b"PING":
                self._write(b"PONG\r\n")
            elif line == b"PONG" and self._pong is not None:
                self._pong.set_result(None)
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode())
        del buf[:at]

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


Publish = Callable[[str, bytes], Awaitable[object]]


async def _publish_one_at_a_time(publish: Publish, n: int) -> list[float]:
    took = []
    for i in range(n):
        start = time.perf_counter()
        await publish(f"floor.pub.{i // STEPS_PER_RUN}", PAYLOAD)
        took.append(time.perf_counter() - start)
    return took


async def _publish_concurrently(publish: Publish, n: int, tasks: int) -> list[float]:
    took: list[float] = []

    async def publisher(k: int) -> None:
        for i in range(k, n, tasks):
            start = time.perf_counter()
            await publish(f"floor.pub.{i // STEPS_PER_RUN}", PAYLOAD)
            took.append(time.perf_counter() - start)

    await asyncio.gather(*(publisher(k) for k in range(tasks)))
    return took


async def _append_concurrently(broker: Broker, n: int, tasks: int) -> list[float]:
    """The journal's append: each task appends to one simulated run at a time, STEPS_PER_RUN events, each with the
    run's last sequence across its subjects as the expected one."""
    took: list[float] = []
    runs = n // STEPS_PER_RUN

    async def appender(k: int) -> None:
        for run in range(k, runs, tasks):
            seq = 0
            for _ in range(STEPS_PER_RUN):
                start = time.perf_counter()
                published = await broker.publish(
                    f"floor.run.{run}.step",
                    PAYLOAD,
                    expected_subject_seq=seq,
                    sequence_subject=f"floor.run.{run}.*",
                )
                took.append(time.perf_counter() - start)
                seq = published.seq

    await asyncio.gather(*(appender(k) for k in range(tasks)))
    return took


async def _preload(broker: Broker, subject: str, n: int, tasks: int) -> None:
    async def publisher(k: int) -> None:
        for i in range(k, n, tasks):
            await broker.publish(f"{subject}.{i}", PAYLOAD)

    await asyncio.gather(*(publisher(k) for k in range(tasks)))


async def _consume_feed(broker: Broker, spec: ConsumerSpec, n: int) -> list[float]:
    """The product's pull feed (`PullFeed`, 64 a request), its handler acking each message inline."""
    done = asyncio.Event()
    count = 0

    async def handler(msg: Msg) -> None:
        nonlocal count
        await msg.ack()
        count += 1
        if count == n:
            done.set()

    handle = await broker.subscribe(spec, handler)
    await done.wait()
    await broker.unsubscribe(handle)
    return []


async def _consume_deliveries(broker: Broker, spec: ConsumerSpec, n: int) -> list[float]:
    """The product's delivery loop (`Deliveries`: a task per message, in-progress sweeper, ack after the handler),
    on the same feed with its room: what every service pays per delivery, the handler itself doing nothing."""
    deliveries = Deliveries(
        broker, Namespace("floor"), "floor", logging.getLogger("floor"), max_deliver=5, ack_wait_s=30.0
    )
    done = asyncio.Event()
    count = 0

    async def handler(msg: Msg) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    handle = await broker.subscribe(spec, deliveries.dispatch(handler), room=deliveries.room)
    await done.wait()
    await deliveries.drain()
    await broker.unsubscribe(handle)
    return []


async def _kv_gets(broker: Broker, n: int, tasks: int, keys: int) -> list[float]:
    took: list[float] = []

    async def reader(k: int) -> None:
        for i in range(k, n, tasks):
            start = time.perf_counter()
            entry = await broker.kv_get(KV, f"k{i % keys}")
            took.append(time.perf_counter() - start)
            assert entry is not None

    await asyncio.gather(*(reader(k) for k in range(tasks)))
    return took


async def _measure(url: str, server_pid: int, n: int, n_busy: int, tasks: int) -> list[Row]:
    """`n` messages in the phases one at a time, `n_busy` in those with `tasks` in flight."""
    broker = await Broker.connect(url, "bench-message-floor")
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    raw = await RawPublisher.connect(host, int(port))
    meter = Meter(broker, server_pid)
    work = {
        "feed": ConsumerSpec(
            stream="FLOOR_WORK", durable="feed", filter_subject="floor.work.feed.>", pull=True
        ),
        "loop": ConsumerSpec(
            stream="FLOOR_WORK", durable="loop", filter_subject="floor.work.loop.>", pull=True
        ),
    }
    try:
        await broker.ensure_stream(StreamSpec(name="FLOOR_PUB", subjects=("floor.pub.>",)))
        await broker.ensure_stream(StreamSpec(name="FLOOR_RUN", subjects=("floor.run.>",)))
        await broker.ensure_stream(
            StreamSpec(name="FLOOR_WORK", subjects=("floor.work.>",), retention=Retention.WORK_QUEUE)
        )
        for spec in work.values():
            await broker.ensure_consumer(spec)
        await broker.ensure_kv(KV)
        keys = 1000
        for k in range(keys):
            await broker.kv_write(KV, f"k{k}", PAYLOAD, revision=None)
        # Warm-up: the PubAck inboxes, the stream's first blocks.
        await _publish_concurrently(broker.publish, 2000, tasks)
        await _publish_concurrently(raw.publish, 2000, tasks)

        rows = [
            await meter.phase(
                "1", "publish, awaited one at a time", n, lambda: _publish_one_at_a_time(broker.publish, n)
            ),
            await meter.phase(
                "1r", "  same, raw protocol (no nats-py)", n, lambda: _publish_one_at_a_time(raw.publish, n)
            ),
            await meter.phase(
                "2",
                f"publish, awaited, {tasks} in flight",
                n_busy,
                lambda: _publish_concurrently(broker.publish, n_busy, tasks),
            ),
            await meter.phase(
                "2r",
                "  same, raw protocol (no nats-py)",
                n_busy,
                lambda: _publish_concurrently(raw.publish, n_busy, tasks),
            ),
            await meter.phase(
                "3",
                f"append (expected subject seq), {tasks} in flight",
                n_busy,
                lambda: _append_concurrently(broker, n_busy, tasks),
            ),
        ]
        # A work queue in service holds what is in flight, not a backlog of 100,000s: with one, the server's cost
        # per delivery grows (14 µs with 30,000 waiting, 23 with 200,000). So: fill CHUNK, drain it metered, again.
        rounds = max(n_busy // CHUNK, 1)
        chunk = n_busy // rounds
        rows.append(
            await meter.phase(
                "4",
                "delivery + ack, pull feed, inline ack",
                chunk * rounds,
                lambda: _consume_feed(broker, work["feed"], chunk),
                rounds=rounds,
                before=lambda: _preload(broker, "floor.work.feed", chunk, tasks),
            )
        )
        rows.append(
            await meter.phase(
                "4d",
                "delivery + ack, the Deliveries loop",
                chunk * rounds,
                lambda: _consume_deliveries(broker, work["loop"], chunk),
                rounds=rounds,
                before=lambda: _preload(broker, "floor.work.loop", chunk, tasks),
            )
        )
        rows.append(
            await meter.phase(
                "5", "KV get (direct get), one at a time", n, lambda: _kv_gets(broker, n, 1, keys)
            )
        )
        rows.append(
            await meter.phase(
                "5c",
                f"KV get (direct get), {tasks} in flight",
                n_busy,
                lambda: _kv_gets(broker, n_busy, tasks, keys),
            )
        )
        for name, spec in work.items():
            left = await broker.consumer_pending(spec.stream, spec.durable)
            if left:
                raise RuntimeError(f"consumer {name} still has {left} messages pending")
        return rows
    finally:
        raw.close()
        await broker.close()


# Per-message cost of each kind a run's budget is spent on, from the phases run as services run them: many in
# flight (one at a time, a message costs several times more: nothing is batched into one read or write). The raw
# protocol's publish is the floor under nats-py itself.
_KINDS = {"publish": "2", "append": "3", "delivery": "4", "kv get": "5c", "raw publish": "2r"}
BUDGETS = (20, 50, 100, 110)


def derived(rows: list[Row]) -> list[dict[str, float | int]]:
    """CPU per run for a workflow of M messages, each of one kind, and the runs/s two cores carry at that floor."""
    by_phase = {row.phase: row for row in rows}
    out: list[dict[str, float | int]] = []
    for m in BUDGETS:
        entry: dict[str, float | int] = {"messages": m}
        for kind, phase in _KINDS.items():
            ms = m * by_phase[phase].total_us / 1000
            entry[f"{kind}_ms"] = ms
            entry[f"{kind}_runs_per_s"] = _TWO_CORES_US / (ms * 1000)
        out.append(entry)
    return out


def table(rows: list[Row]) -> str:
    head = (
        f"{'':<3}{'phase':<45}{'n':>8}{'wall s':>8}{'msgs/s':>9}{'p50 µs':>8}{'wall µs':>9}"
        f"{'client µs':>11}{'server µs':>11}{'total µs':>10}"
    )
    lines = [head]
    for r in rows:
        p50 = f"{r.p50_us:.0f}" if r.p50_us else "-"
        lines.append(
            f"{r.phase:<3}{r.what:<45}{r.n:>8}{r.wall_s:>8.2f}{r.per_s:>9.0f}{p50:>8}{r.wall_s * 1e6 / r.n:>9.1f}"
            f"{r.client_us:>11.1f}{r.server_us:>11.1f}{r.total_us:>10.1f}"
        )
    lines += [
        "",
        "A message is one exchange: a publish + its PubAck, a delivery + its ack, a get + its answer (bench/wiretap.py"
        " counts each half, so its messages per run are about twice these).",
        "CPU per run of M messages all of one kind (its total µs above), and the most runs/s two cores carry at that,"
        " before any work:",
        f"{'M':>5}" + "".join(f"{kind + ' (' + phase + ')':>24}" for kind, phase in _KINDS.items()),
    ]
    for entry in derived(rows):
        cells = (f"{entry[f'{kind}_ms']:.2f} ms, ≤ {entry[f'{kind}_runs_per_s']:.0f}/s" for kind in _KINDS)
        lines.append(f"{entry['messages']:>5}" + "".join(f"{cell:>24}" for cell in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=int, default=20_000, help="messages in each phase one at a time (default 20,000)"
    )
    parser.add_argument(
        "--n-busy", type=int, default=0, help="messages in each phase with many in flight (default 10 x --n)"
    )
    parser.add_argument("--concurrency", type=int, default=50, help="tasks in flight (default 50)")
    parser.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = parser.parse_args(argv)
    n = args.n
    whole_runs = args.concurrency * STEPS_PER_RUN  # the append phase gives each task whole runs
    n_busy = max((args.n_busy or 10 * n) // whole_runs, 1) * whole_runs
    with tempfile.TemporaryDirectory(prefix="crashsafe-floor-") as tmp:
        server = NatsServer(Path(tmp), port=free_port(), open_access=True).start()
        assert server.process is not None
        print(f"nats-server {server.url}, pid {server.process.pid}, n={n}, n busy={n_busy}", file=sys.stderr)
        try:
            rows = asyncio.run(_measure(server.url, server.process.pid, n, n_busy, args.concurrency))
        finally:
            server.stop()
    if args.json:
        print(
            json.dumps(
                {"n": n, "n_busy": n_busy, "rows": [asdict(r) for r in rows], "derived": derived(rows)},
                indent=2,
            )
        )
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
