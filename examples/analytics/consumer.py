"""The shell: a durable pull consumer on `<NS>_RUNS` with the read-only analytics credentials, and a state file.

The figures are written (atomically) before the deliveries they fold are acknowledged, the house's "durable
before ack": a consumer killed between the two gets those deliveries again, and folding them again changes
nothing (core.py counts per action key). The state file and the durable are one pair: the file names its
durable, stream and server, and a durable that has acknowledged events with no state file beside it is refused
(its figures would silently start from the middle of the stream).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from crashsafe.contracts.journal_bus import read_event
from crashsafe.contracts.nats_permissions import inbox_prefix
from crashsafe.contracts.run_events import JournalEvent
from crashsafe.contracts.subjects import Namespace, StreamKind, receipt_family
from crashsafe.examples.analytics.core import Figures, fold

DEFAULT_DURABLE = "analytics_hourly"
BATCH = 256


class AnalyticsError(Exception):
    """Something the person running the consumer must fix; the message says what."""


@dataclass(frozen=True, slots=True)
class Credential:
    user: str
    seed: str


def read_credential(path: Path) -> Credential:
    """A crashsafe credential file (`user:` and `seed:` lines; `crashsafe infra nats-auth` writes them)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise AnalyticsError(f"cannot read credentials {path}: {exc.strerror}") from None
    fields = {
        key.strip(): value.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
        for key, sep, value in [line.partition(":")]
        if sep
    }
    if not fields.get("user") or not fields.get("seed"):
        raise AnalyticsError(f"{path} is not a crashsafe NATS credential file (user: and seed: lines)")
    return Credential(fields["user"], fields["seed"])


class StateFile(msgspec.Struct, kw_only=True):
    """What is on disk: the figures and which durable (on which stream and server) they belong to."""

    durable: str
    stream: str
    url: str
    figures: Figures


def load_state(path: Path, durable: str, stream: str, url: str) -> Figures | None:
    if not path.exists():
        return None
    decoder = msgspec.json.Decoder(StateFile)
    try:
        state = decoder.decode(path.read_bytes())
    except msgspec.DecodeError as exc:
        raise AnalyticsError(
            f"{path} is not this consumer's state ({exc}); move it away to start over"
        ) from None
    if (state.durable, state.stream) != (durable, stream):
        raise AnalyticsError(
            f"{path} holds the figures of durable {state.durable} on {state.stream}, not {durable} on {stream};"
            " pass its own --durable, or another --state"
        )
    return state.figures


def save_state(path: Path, durable: str, stream: str, url: str, figures: Figures) -> None:
    """Write the whole state to a temporary file, fsync it, and rename it over the old one: never half a file."""
    body = msgspec.json.encode(StateFile(durable=durable, stream=stream, url=url, figures=figures))
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


def _decoded(data: bytes, subject: str) -> JournalEvent | None:
    try:
        # A receipt stands only as its subject's family wrote it (the journal as the bus: executors append them).
        return read_event(data, receipt_family(subject))
    except (msgspec.DecodeError, ValueError):
        return (
            None  # not an event this contract can read: counted as undecodable, acknowledged, never a wedge
        )


class Consumer:
    """One process per durable and state file (a lock file says so): pull, fold, save, acknowledge."""

    def __init__(self, nc: Client, ns: Namespace, durable: str, state_path: Path, url: str) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=10)
        self.ns = ns
        self.stream = ns.stream(StreamKind.RUNS)
        self.durable = durable
        self.state_path = state_path
        self.url = url
        self.figures = Figures()
        self._sub: object | None = None
        self._lock: int | None = None

    async def open(self) -> None:
        self._take_lock()
        existing = load_state(self.state_path, self.durable, self.stream, self.url)
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
        except nats.js.errors.NotFoundError:
            info = None
        if info is not None and existing is None and (info.ack_floor and info.ack_floor.stream_seq):
            raise AnalyticsError(
                f"durable {self.durable} has acknowledged events up to sequence {info.ack_floor.stream_seq}"
                f" but {self.state_path} does not exist: its figures are elsewhere. Restore that file, or use a"
                " new --durable to count from the start"
            )
        self.figures = existing or Figures()
        # A durable made before the journal's event classes filters `<ns>.run.*`, which no event matches now: the
        # same durable is brought to the new filter in place, keeping its place in the stream.
        if info is None or info.config.filter_subject != self.ns.run_events_all:
            await self.js.add_consumer(
                self.stream,
                ConsumerConfig(
                    # Named, so the create subject carries the filter the analytics role is allowed.
                    name=self.durable,
                    durable_name=self.durable,
                    filter_subject=self.ns.run_events_all,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=30,
                    max_ack_pending=BATCH * 4,
                ),
            )
        self._sub = await self.js.pull_subscribe_bind(self.durable, self.stream)

    def _take_lock(self) -> None:
        lock = self.state_path.with_name(self.state_path.name + ".lock")
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AnalyticsError(f"another consumer holds {lock}: one process per state file") from None
        self._lock = fd

    async def step(self, wait_s: float = 1.0) -> int:
        """Fold one batch: fetch, fold every delivery, save the state, then acknowledge. Deliveries folded."""
        assert self._sub is not None
        try:
            batch = await self._sub.fetch(BATCH, timeout=wait_s)  # type: ignore[attr-defined]
        except TimeoutError:  # nats-py raises its own and asyncio's (the same class since 3.11): nothing came
            return 0
        for msg in sorted(batch, key=lambda m: m.metadata.sequence.stream):
            fold(self.figures, _decoded(msg.data, msg.subject), msg.metadata.sequence.stream)
        save_state(self.state_path, self.durable, self.stream, self.url, self.figures)
        for msg in batch:
            await msg.ack()
        await self.nc.flush()
        return len(batch)

    async def pending(self) -> int:
        info = await self.js.consumer_info(self.stream, self.durable)
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def drain(self) -> None:
        """Fold until the durable has nothing left to deliver (what is in the stream now)."""
        while True:
            if not await self.step() and not await self.pending():
                return

    async def close(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


async def connect(url: str, creds: Path | None) -> Client:
    options: dict[str, object] = {}
    if creds is not None:
        credential = read_credential(creds)
        options["nkeys_seed_str"] = credential.seed
        # Replies (consumer info, pulled deliveries) come to this user's own inbox: no other user may listen.
        options["inbox_prefix"] = inbox_prefix(credential.user)
    try:
        return await asyncio.wait_for(
            nats.connect(url, name="analytics", max_reconnect_attempts=1, connect_timeout=3, **options),
            timeout=10,
        )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        raise AnalyticsError(f"cannot connect to NATS at {url}: {exc or type(exc).__name__}") from None
