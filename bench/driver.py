"""The load driver: submits runs in a closed loop (over HTTP or straight to JetStream) and times them off the journal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from time import perf_counter

import httpx
import msgspec
from nats.aio.msg import Msg

from bench.figures import RunSample
from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.inbound import GuestMessage, InboundEvent, InboundMessage, inbound_encoder
from crashsafe.contracts.keys import input_hash, run_id_for
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ModelAnswered,
    RunCompleted,
    RunHandedOff,
    event_decoder,
)
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker, Subscription
from crashsafe.services.platform.tracing import context_from, headers_for

Submit = Callable[[GuestMessage], Awaitable[None]]


class RunTrace:
    """One run as the driver watches it: when it was submitted, how it ended, and its step timings."""

    __slots__ = (
        "done",
        "error",
        "finished",
        "last_at",
        "model_ms",
        "outcome",
        "requested",
        "run_id",
        "step_ms",
        "submitted",
    )

    def __init__(self, run_id: str, done: asyncio.Future[str]) -> None:
        self.run_id = run_id
        self.submitted = 0.0
        self.finished: float | None = None
        self.outcome = "lost"
        self.error = ""
        self.done = done
        self.last_at: datetime | None = None
        self.requested: dict[int, datetime] = {}
        self.step_ms: list[float] = []
        self.model_ms: list[float] = []

    def sample(self) -> RunSample:
        run_ms = (self.finished - self.submitted) * 1000 if self.finished is not None else None
        return RunSample(self.outcome, run_ms, tuple(self.step_ms), tuple(self.model_ms), self.error)


class JournalWatcher:
    """Follows the run journals of the namespace with one ordered consumer; no HTTP polling per run.

    `steps=True` follows every event: a step's latency is `run.action_requested.at` to `run.action_completed.at`
    (both stamped by the runtime when it decided them); a model step is the previous event's `at` to
    `run.model_answered.at`. `steps=False` follows the milestones alone (`<ns>.run.*.milestone`, where a run's
    end is journaled): what a throughput phase needs, at 2 deliveries a run instead of every event, so the load
    driver does not spend the cores it shares with the stack on timings the phase does not report (as Restate's
    driver reads only each workflow's answer).
    """

    def __init__(self, broker: Broker, ns: Namespace, steps: bool = True) -> None:
        self.broker = broker
        self.ns = ns
        self.steps = steps
        self.traces: dict[str, RunTrace] = {}
        self.untracked = 0
        self._sub: Subscription | None = None

    async def start(self) -> None:
        # From now: a phase starts its watcher before its first submission, and the stack runs on this host (one
        # clock). Starting earlier would replay the events of the phase before (2,000 at 200 runs/s in a second).
        since = datetime.now(UTC)
        subject = self.ns.run_events_all if self.steps else self.ns.run_milestones_all
        self._sub = await self.broker.follow(self.ns.stream(StreamKind.RUNS), subject, self._on_msg, since)

    async def stop(self) -> None:
        if self._sub is not None:
            await self.broker.unsubscribe(self._sub)
            self._sub = None

    def track(self, run_id: str) -> RunTrace:
        trace = RunTrace(run_id, asyncio.get_running_loop().create_future())
        self.traces[run_id] = trace
        return trace

    async def _on_msg(self, msg: Msg) -> None:
        event = event_decoder.decode(msg.data)
        trace = self.traces.get(event.run_id)
        if trace is None:
            self.untracked += 1
            return
        match event:
            case ActionRequested():
                trace.requested[event.step_no] = event.at
            case ActionCompleted():
                requested = trace.requested.pop(event.step_no, None)
                if requested is not None:
                    trace.step_ms.append((event.at - requested).total_seconds() * 1000)
            case ModelAnswered():
                if trace.last_at is not None:
                    trace.model_ms.append((event.at - trace.last_at).total_seconds() * 1000)
            case RunCompleted() | RunHandedOff():
                if not trace.done.done():
                    trace.finished = perf_counter()
                    trace.outcome = "completed" if isinstance(event, RunCompleted) else "handed_off"
                    trace.done.set_result(trace.outcome)
        trace.last_at = event.at


class SubmitRejected(Exception):
    """The gateway did not answer 202."""


def gateway_submitter(client: httpx.AsyncClient, agent: str) -> Submit:
    params = {"agent": agent} if agent != "booking" else None
    headers = {"content-type": "application/json"}

    async def submit(message: GuestMessage) -> None:
        response = await client.post(
            "/v1/events", content=msgspec.json.encode(message), headers=headers, params=params
        )
        if response.status_code != 202:
            raise SubmitRejected(f"gateway answered {response.status_code}: {response.text[:200]}")

    return submit


class RawGateway:
    """A bare HTTP/1.1 keep-alive client for `POST /v1/events`, one connection per worker.

    httpx spends a few milliseconds of CPU per request; on a two-core box that is CPU the services under test do
    not get. This client spends a few tens of microseconds, so the gateway path measures the gateway.
    """

    def __init__(self, base_url: str, agent: str, api_key: str) -> None:
        url = httpx.URL(base_url)
        self.host, self.port = url.host, url.port or 80
        query = f"?agent={agent}" if agent != "booking" else ""
        self._head = (
            f"POST /v1/events{query} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {api_key}\r\n"
        ).encode()
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.retries = 0

    async def submit(self, message: GuestMessage) -> None:
        body = msgspec.json.encode(message)
        request = self._head + b"content-length: %d\r\n\r\n" % len(body) + body
        # The gateway may close a keep-alive connection at any time; a POST here is idempotent by its event id,
        # so one retry on a fresh connection is safe.
        for attempt in range(2):
            conn = (
                self._idle.pop()
                if self._idle and attempt == 0
                else await asyncio.open_connection(self.host, self.port)
            )
            try:
                status, text, keep = await self._exchange(conn, request)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                conn[1].close()
                if attempt == 0:
                    self.retries += 1
                    continue
                raise SubmitRejected(f"gateway connection failed: {exc!r}") from exc
            if keep:
                self._idle.append(conn)
            else:
                conn[1].close()
            if status != 202:
                raise SubmitRejected(f"gateway answered {status}: {text[:200]!r}")
            return

    @staticmethod
    async def _exchange(
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
    ) -> tuple[int, bytes, bool]:
        reader, writer = conn
        writer.write(request)
        status_line = await reader.readline()
        if not status_line:
            raise asyncio.IncompleteReadError(b"", None)
        status = int(status_line.split()[1])
        length, keep = 0, True
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
            elif name == b"transfer-encoding":
                raise ValueError("chunked responses are not supported by the raw client; use --http httpx")
        return status, await reader.readexactly(length), keep

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def jetstream_submitter(broker: Broker, ns: Namespace, agent: str, tenant: str) -> Submit:
    """What the gateway does after admitting a request, minus the HTTP hop and its post-publish journal read."""

    async def submit(message: GuestMessage) -> None:
        run_id = run_id_for(tenant, message.event_id)
        event = InboundEvent(
            key=message.event_id,
            run_id=run_id,
            input_hash=input_hash(message),
            message=InboundMessage.of(message),
            agent=agent,
            received_at=datetime.now(UTC),
            tenant=tenant,
        )
        published = await broker.publish(
            ns.inbound(run_id),
            inbound_encoder.encode(event),
            msg_id=run_id,
            headers=headers_for(context_from(None)),
        )
        if published.duplicate:
            raise SubmitRejected(f"run {run_id} was already submitted")

    return submit


@dataclass(frozen=True)
class LoopResult:
    wall_s: float
    samples: list[RunSample]


async def closed_loop(
    watcher: JournalWatcher,
    submit: Submit,
    messages: Sequence[GuestMessage],
    concurrency: int,
    run_timeout_s: float,
    tenant: str,
) -> LoopResult:
    """`concurrency` workers; each submits a run and waits for its journal to end before taking the next."""
    pending = iter(messages)
    traces: list[RunTrace] = []

    async def worker() -> None:
        for message in pending:
            trace = watcher.track(run_id_for(tenant, message.event_id))
            traces.append(trace)
            trace.submitted = perf_counter()
            try:
                await submit(message)
            except (httpx.HTTPError, SubmitRejected, CrashsafeError) as exc:
                trace.outcome = "rejected"
                trace.error = f"{type(exc).__name__}: {exc}"[:160]
                continue
            try:
                await asyncio.wait_for(asyncio.shield(trace.done), run_timeout_s)
            except TimeoutError:
                pass  # stays "lost"

    start = perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = perf_counter() - start
    for trace in traces:
        watcher.traces.pop(trace.run_id, None)
    return LoopResult(wall, [t.sample() for t in traces])


def guest_messages(prefix: str, count: int, text: str) -> list[GuestMessage]:
    return [
        GuestMessage(
            event_id=f"{prefix}-{i}", session_id=f"{prefix}-s{i}", guest_id=f"{prefix}-g{i}", text=text
        )
        for i in range(count)
    ]
