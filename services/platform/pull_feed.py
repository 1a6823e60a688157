"""A pull consumer's messages handed to a handler as they arrive, for as long as this process keeps asking."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from crashsafe.contracts.streams import ConsumerSpec

log = logging.getLogger("crashsafe.jetstream")

# How many messages one pull request asks for at most. The handler's own bound (Deliveries) caps the work in hand.
PULL_BATCH = 64
# How many a feed asks for when its last request came back empty: an idle feed holds this little room, so a room
# shared by many feeds (an executor's partitions) keeps a request waiting on the server for every one of them.
IDLE_BATCH = 4
_HEARTBEAT = "100"


class Room:
    """How many more handlers a service may start: a feed reserves room before it asks the server for messages,
    so a message that arrives always finds a handler free and a callback never waits for one.

    Fair between the feeds that share it: room freed goes to the feed that has waited longest, and a feed never
    takes room past one already waiting (the first feeds to ask once kept all of it, and the others never asked
    the server again)."""

    def __init__(self, handlers: int) -> None:
        self._free = handlers
        self._waiting: collections.deque[tuple[asyncio.Future[int], int]] = collections.deque()

    async def reserve(self, most: int) -> int:
        """Wait until a handler is free and no feed waits ahead, then reserve room for up to `most` messages:
        how many to ask for."""
        if self._free > 0 and not self._waiting:
            taken = min(most, self._free)
            self._free -= taken
            return taken
        turn: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((turn, most))
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release(turn.result())  # granted as the feed stopped: the room goes to the next waiter
            else:
                self._waiting = collections.deque(w for w in self._waiting if w[0] is not turn)
            raise

    def release(self, count: int) -> None:
        """A handler ended, or room reserved for messages that never came (a request that expired short): it goes
        to the longest waiter first."""
        self._free += count
        while self._free > 0 and self._waiting:
            turn, most = self._waiting.popleft()
            if turn.done():
                continue
            taken = min(most, self._free)
            self._free -= taken
            turn.set_result(taken)

    def overdraw(self) -> None:
        """A message arrived that no reservation covered (a request's straggler): it is handled all the same."""
        self._free -= 1


class PullFeed:
    """One outstanding pull request at a time, each for at most `spec.pull_expires_s`.

    nats-py's `fetch` waits for a whole batch before it returns; here every message goes to the handler the
    moment it arrives, and the next request is sent once the last one is filled or ends (a 408 when it expires,
    a 409 when the server drops it). A request lost with a broker restart is replaced after its expiry.

    With a `room`, each request asks for no more messages than there are free handlers (flow control): what the
    server sends is handled at once, and the rest waits on the server, unacknowledged, for whoever asks next. A
    feed asks for what it can use: `IDLE_BATCH` after a request that came back empty, twice as many after one
    that was filled (up to `PULL_BATCH`), so an idle feed never holds the room other feeds need to ask at all."""

    def __init__(
        self,
        nc: Client,
        spec: ConsumerSpec,
        handler: Callable[[Msg], Awaitable[None]],
        room: Room | None = None,
    ) -> None:
        self.nc = nc
        self.spec = spec
        self.handler = handler
        self.room = room
        self._open = False  # a request is outstanding: what arrives is counted against it
        self._inbox = nc.new_inbox()
        self._next_subject = spec.next_subject
        self._asked = 0
        self._received = 0
        self._want = IDLE_BATCH
        self._request_over = asyncio.Event()
        self._last_status = ""
        self._stopping = False
        self._sub: object | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_message)
        self._task = asyncio.create_task(self._ask_forever())

    async def stop(self) -> None:
        """Ask for nothing more, then drop the inbox. Never relies on cancellation alone: on Python 3.11 a
        `wait_for` whose inner wait completes as the task is cancelled swallows the cancel (gh-86296), and a feed
        that kept asking after its partition was put down would hold the partition's release forever."""
        self._stopping = True
        self._request_over.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=5.0)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()  # type: ignore[attr-defined]
            except (nats.errors.Error, OSError) as exc:
                log.warning("unsubscribe: %s: %s", type(exc).__name__, exc)

    async def _on_message(self, msg: Msg) -> None:
        status = (msg.headers or {}).get("Status")
        if status is not None:
            if status != _HEARTBEAT:
                self._last_status = status
                self._request_over.set()  # expired (408), dropped (409), or nothing more to give (404)
            return
        if self._open and self._received < self._asked:
            self._received += 1
            if self._received >= self._asked:
                self._request_over.set()
        elif self.room is not None:
            self.room.overdraw()  # a straggler of a request that ended: handled, never dropped
        if self._stopping:
            if self.room is not None:
                self.room.release(1)
            return  # not ours to handle any more: unacked, it comes back to whoever asks next
        await self.handler(msg)

    async def _ask_forever(self) -> None:
        expires_s = self.spec.pull_expires_s
        while not self._stopping:
            batch = PULL_BATCH if self.room is None else await self.room.reserve(self._want)
            self._asked, self._received, self._open = batch, 0, True
            self._request_over.clear()
            try:
                request = json.dumps({"batch": batch, "expires": int(expires_s * 1e9)}).encode()
                try:
                    await self.nc.publish(self._next_subject, request, reply=self._inbox)
                except (nats.errors.Error, OSError):
                    await asyncio.sleep(expires_s)  # disconnected: nats-py reconnects; ask again then
                    continue
                # asyncio.wait, not wait_for: it never swallows a cancel (see stop).
                over = asyncio.ensure_future(self._request_over.wait())
                try:
                    await asyncio.wait({over}, timeout=expires_s + 1.0)
                finally:
                    over.cancel()
            finally:
                self._open = False
                if self.room is not None:
                    self.room.release(self._asked - self._received)  # room for messages that never came
            if self._received >= self._asked:
                self._want = min(self._want * 2, PULL_BATCH)
            elif self._received == 0:
                self._want = IDLE_BATCH
            if self._last_status.startswith("409"):
                # Dropped (a leader change, too many waiting requests): ask again, but not in a tight loop.
                log.info("pull request on %s ended: %s", self.spec.durable, self._last_status)
                self._last_status = ""
                await asyncio.sleep(0.2)
