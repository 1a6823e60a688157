"""Live pages without a consumer: a subject's new messages read from the last seen sequence by batched direct gets.

A browser tab on a live page costs one direct get every `POLL_S` while it is open and nothing once it goes: no
ordered or ephemeral consumer is created (so none can be left behind by a tab that vanished, a gateway killed
mid-stream, or a second replica), and the gateway's NATS user needs no right to create consumers on RUNS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from litestar.datastructures import State
from litestar.response import ServerSentEventMessage

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.services.platform.jetstream import Broker, StoredMessage
from crashsafe.services.platform.logs import log

logger = logging.getLogger("crashsafe.console")

POLL_S = 0.5  # how soon a new journal event reaches an open page
KEEPALIVE_S = 15.0  # a comment line, so proxies and the browser keep an idle stream open
RECHECK_S = 10.0  # how often an open stream checks its key again (a revoked key's stream ends)
BATCH = 256
MAX_STREAMS = 200  # open live streams per gateway process
MAX_STREAMS_PER_CLIENT = 20  # of them, held by one key: one client never takes every other client's slots
# A runs stream starts at most this many messages behind the head: an old or forged `after` never makes the
# gateway read the whole stream again.
MAX_BEHIND = 5_000


class Follower:
    """The messages on `subject` after sequence `after`, batch by batch, as they are stored."""

    def __init__(self, broker: Broker, stream: str, subject: str, after: int) -> None:
        self.broker = broker
        self.stream = stream
        self.subject = subject
        self.cursor = after

    async def poll(self) -> list[StoredMessage]:
        """What was stored since the last poll (empty if nothing); the cursor moves past it."""
        batch = await self.broker.read_subject(self.stream, self.subject, after_seq=self.cursor, batch=BATCH)
        if batch:
            self.cursor = batch[-1].seq
        return batch


def slots_of(state: State) -> StreamSlots:
    """The gateway process's stream slots (made on first use, kept in the app's state)."""
    slots = state.get("console_streams")
    if not isinstance(slots, StreamSlots):
        slots = StreamSlots()
        state["console_streams"] = slots
    return slots


def resume_after(headers: Mapping[str, str], query: Mapping[str, str], floor: int = 0) -> int:
    """Where a stream starts: after the Last-Event-ID a reconnecting browser sends, else after the page's `after`
    (the sequence it was rendered at), never before `floor`."""
    floor = max(floor, 0)
    for text in (headers.get("last-event-id", ""), query.get("after", "")):
        if text.isdigit() and len(text) < 20:
            return max(int(text), floor)
    return floor


class StreamSlots:
    """How many live streams one gateway process keeps open at once, and one client (key) of them: past either,
    a new one is told to come back later rather than letting open tabs grow the gateway's polling without bound
    or one key's tabs (or script) crowd out every other client's live pages."""

    def __init__(self, limit: int = MAX_STREAMS, per_client: int = MAX_STREAMS_PER_CLIENT) -> None:
        self.limit = limit
        self.per_client = per_client
        self.open = 0
        self.held: dict[str, int] = {}

    def take(self, owner: str) -> bool:
        held = self.held.get(owner, 0)
        if self.open >= self.limit or held >= self.per_client:
            return False
        self.open += 1
        self.held[owner] = held + 1
        return True

    def give_back(self, owner: str) -> None:
        self.open -= 1
        held = self.held.get(owner, 0) - 1
        if held > 0:
            self.held[owner] = held
        else:
            self.held.pop(owner, None)


async def head_seq(broker: Broker, stream: str) -> int:
    """The stream's last sequence now: where a live page rendered from a read starts following."""
    return await broker.stream_head(stream)


async def stream_events(
    follower: Follower,
    render: Callable[[list[StoredMessage], int], Awaitable[list[ServerSentEventMessage]]],
    still_allowed: Callable[[], Awaitable[bool]],
    slots: StreamSlots,
    owner: str,
) -> AsyncIterator[ServerSentEventMessage]:
    """Server-sent events for what `follower` finds, rendered by `render(batch, cursor before it)`, until the
    client goes (Litestar cancels this generator on disconnect) or its key stops being allowed. It holds one of
    `slots` for `owner` (the key) while it runs (taken here, so a stream that never started holds none); with
    none free, the browser is told to reconnect in 5 s."""
    if not slots.take(owner):
        yield ServerSentEventMessage(data=None, comment="busy: too many live streams", retry=5000)
        return
    try:
        async for message in _events(follower, render, still_allowed):
            yield message
    finally:
        slots.give_back(owner)


async def _events(
    follower: Follower,
    render: Callable[[list[StoredMessage], int], Awaitable[list[ServerSentEventMessage]]],
    still_allowed: Callable[[], Awaitable[bool]],
) -> AsyncIterator[ServerSentEventMessage]:
    beat = checked = time.monotonic()
    while True:
        before = follower.cursor
        try:
            batch = await follower.poll()
        except BrokerUnavailable as exc:
            # NATS away for a moment: the page stays, and catches up from its cursor when NATS answers.
            log(logger, logging.INFO, "live read failed", subject=follower.subject, error=str(exc))
            batch = []
        now = time.monotonic()
        if now - checked >= RECHECK_S:
            checked = now
            if not await still_allowed():
                yield ServerSentEventMessage(event="signed_out", data="signed out")
                return
        if batch:
            beat = now
            for message in await render(batch, before):
                # The cursor as the event id: a browser reconnecting after a drop sends it back as
                # Last-Event-ID, and the stream resumes after it (nothing twice, nothing missed).
                message.id = str(follower.cursor)
                yield message
            continue
        if now - beat >= KEEPALIVE_S:
            beat = now
            yield ServerSentEventMessage(data=None, comment="keepalive")
        await asyncio.sleep(POLL_S)
