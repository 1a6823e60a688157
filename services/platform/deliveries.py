"""The one delivery loop: how every service handles a JetStream delivery, with one set of ack and dead-letter rules.

The rules, the same for every consumer of every service:

- A handler may settle its message itself (ack, nak with a delay, term, or `dead_letter`); the loop then leaves it
  be. A message its handler returned without settling is acked.
- While a handler runs, its message says "in progress" every quarter ack wait: a short ack wait lets a dead
  worker's messages come back fast, and a live worker's long step is never handed to another.
- What a handler raises:
  a message that does not decode, or a poison error: dead-lettered at once (never retried: it cannot get better);
  NATS not answering, or a typed error to retry later: nak with a growing delay;
  anything else (a bug): logged with its traceback, nak with a growing delay;
  a retried message is dead-lettered once it has been delivered `max_deliver` times (a bug with the code
  `handler_failed`), so nothing circles for hours and nothing crash-loops.
- A message delivered more than `max_deliver` times and never settled (each handler died or stalled first) is
  dead-lettered before a handler sees it again: the server's own limit would end deliveries silently.
- A consumer whose server stops delivering at `max_deliver` (`server_stops=True`, the executor's: its durables
  keep 0.1.0's shape) has no delivery past it to dead-letter on: its handler sees `max_deliver - 1` deliveries,
  and the server's last delivery is dead-lettered before a handler sees it (a request whose executor died on
  every delivery vanished with no dead letter and no alarm).
- A settle that fails (NATS went away meanwhile) is logged; the message comes back after its ack wait.

A handler that settles its own messages (`dispatch(handler, settles_itself=True)`, the projector's) keeps its own
count of attempts: its naks are its retry schedule, so the server's delivery count is no sign of trouble. The loop
then gives it up only for a bug (after `max_deliver` deliveries), never for its delivery count nor for NATS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg

from crashsafe.contracts.dead_letters import DeadLetter, dead_letter_encoder
from crashsafe.contracts.errors import BrokerUnavailable, CrashsafeError, ErrorCode, RetryClass
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.pull_feed import Room

Handler = Callable[[Msg], Awaitable[None]]
# NATS did not answer a settle or a call under the handler: not the message's fault.
_NATS_FAILED = (TimeoutError, nats.errors.Error, OSError, BrokerUnavailable)


def backoff_s(deliveries: int) -> float:
    """How long a retried message waits before its next delivery: doubling from 0.4 s, at most 5 s."""
    return min(0.2 * 2**deliveries, 5.0)


class Deliveries:
    """Runs handlers for deliveries concurrently (bounded), and settles each message as the rules above say.

    The bound is room a pull feed reserves before it asks the server for messages (`Room`), so a message that
    arrives always finds a handler free: nothing ever waits inside a subscription's callback (a callback that waited
    for a slot made nats-py buffer, then drop, a flood's messages as a slow consumer)."""

    def __init__(
        self,
        broker: Broker,
        ns: Namespace,
        service: str,
        logger: logging.Logger,
        max_deliver: int,
        ack_wait_s: float,
        concurrency: int = 512,
        *,
        server_stops: bool = False,
    ) -> None:
        self.broker = broker
        self.ns = ns
        self.service = service
        self.logger = logger
        self.max_deliver = max_deliver
        self.server_stops = server_stops
        # How many deliveries a handler sees: with the server's limit, its last delivery is the dead letter's.
        self.handler_deliveries = max(max_deliver - 1, 1) if server_stops else max_deliver
        self.heartbeat_s = max(ack_wait_s / 4, 0.1)
        # Reserved by the pull feeds before they ask (`Broker.subscribe(room=)`).
        self.room = Room(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        # Messages being handled, and when their ack timer was last reset: one sweeper heartbeats them all.
        self._handling: dict[int, tuple[Msg, float]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def dispatch(self, handler: Handler, *, settles_itself: bool = False) -> Handler:
        """The callback for a feed that reserved room for each message: it starts the handler and returns."""

        async def on_message(msg: Msg) -> None:
            task = asyncio.create_task(self._settle(msg, handler, settles_itself))
            self._tasks.add(task)
            task.add_done_callback(self._done)

        return on_message

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.room.release(1)

    async def _settle(self, msg: Msg, handler: Handler, settles_itself: bool) -> None:
        deliveries = msg.metadata.num_delivered
        try:
            if deliveries > self.handler_deliveries and not settles_itself:
                last = "the server's last delivery" if self.server_stops else f"over {self.max_deliver}"
                await self.dead_letter(
                    msg,
                    f"delivered {deliveries} times and never settled ({last}); "
                    "find why its handler died or stalled, then replay or discard it",
                    ErrorCode.DELIVERIES_EXHAUSTED,
                    {"deliveries": deliveries, "max_deliver": self.max_deliver},
                )
                return
            self._handling[id(msg)] = (msg, time.monotonic())
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.create_task(self._heartbeats())
            try:
                await self._handle(msg, handler, deliveries, settles_itself)
            finally:
                self._handling.pop(id(msg), None)
        except _NATS_FAILED as exc:
            # The broker went away mid-settle: the message was not settled, so it comes back after the ack wait.
            log(
                self.logger,
                logging.WARNING,
                "could not settle message; it will be redelivered",
                subject=msg.subject,
                error=str(exc),
            )

    async def _handle(self, msg: Msg, handler: Handler, deliveries: int, settles_itself: bool) -> None:
        try:
            await handler(msg)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._give_up(msg, f"cannot decode: {exc}", ErrorCode.POISON_MESSAGE)
        except CrashsafeError as exc:
            if exc.retry is RetryClass.POISON or (
                deliveries >= self.handler_deliveries and not settles_itself
            ):
                await self._give_up(msg, exc.message, exc.code, exc.details())
            else:
                log(
                    self.logger,
                    logging.WARNING,
                    "retrying later",
                    subject=msg.subject,
                    error=exc.code.value,
                    detail=exc.message,
                    deliveries=deliveries,
                )
                await self._retry(msg, deliveries)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            if deliveries >= self.handler_deliveries and not settles_itself:
                await self._give_up(msg, f"{type(exc).__name__}: {exc}", ErrorCode.HANDLER_FAILED)
            else:
                log(
                    self.logger,
                    logging.WARNING,
                    "NATS failed under the handler; retrying later",
                    subject=msg.subject,
                    error=f"{type(exc).__name__}: {exc}",
                    deliveries=deliveries,
                )
                await self._retry(msg, deliveries)
        except Exception as exc:  # an unexpected bug must not loop forever nor lose the message silently
            self.logger.exception(
                f"{self.service} handler failed",
                extra={"fields": {"subject": msg.subject, "deliveries": deliveries}},
            )
            if deliveries >= self.handler_deliveries:
                await self._give_up(msg, f"{type(exc).__name__}: {exc}", ErrorCode.HANDLER_FAILED)
            else:
                await self._retry(msg, deliveries)
        else:
            if not msg.is_acked:
                await msg.ack()

    async def _retry(self, msg: Msg, deliveries: int) -> None:
        if not msg.is_acked:  # a handler that settled its message and then raised has said what it wants
            await msg.nak(delay=backoff_s(deliveries))

    async def _give_up(
        self, msg: Msg, reason: str, code: ErrorCode, details: dict[str, Any] | None = None
    ) -> None:
        await self.dead_letter(msg, reason, code, details, settle=not msg.is_acked)

    async def _heartbeats(self) -> None:
        """Every message handled for longer than a heartbeat says "in progress", so its ack timer restarts."""
        while self._handling:
            # Swept twice a heartbeat: a message that arrived just after a sweep says so within 1.5 heartbeats of
            # its delivery, not 2, leaving more of the ack wait for a loop that lags.
            await asyncio.sleep(self.heartbeat_s / 2)
            now = time.monotonic()
            for ident, (msg, since) in list(self._handling.items()):
                if now - since >= self.heartbeat_s and ident in self._handling and not msg.is_acked:
                    self._handling[ident] = (msg, now)
                    try:
                        await msg.in_progress()
                    except (nats.errors.Error, OSError):
                        pass

    async def dead_letter(
        self,
        msg: Msg,
        reason: str,
        code: ErrorCode | str,
        details: dict[str, Any] | None = None,
        *,
        settle: bool = True,
        msg_id: str | None = None,
    ) -> None:
        """Give up on `msg`: its dead letter first (the evidence; `msg_id` makes a second one a duplicate), then
        term it unless `settle` is False (a handler that writes its own receipt first, then terms)."""
        await dead_letter(
            self.broker, self.ns, self.service, self.logger, msg, reason, code, details, settle, msg_id
        )

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def dead_letter(
    broker: Broker,
    ns: Namespace,
    service: str,
    logger: logging.Logger,
    msg: Msg,
    reason: str,
    code: ErrorCode | str,
    details: dict[str, Any] | None = None,
    settle: bool = True,
    msg_id: str | None = None,
) -> None:
    """Publish `msg`'s dead letter on `<ns>.dead.<service>`, count it, log it, and term the message if `settle`."""
    letter = DeadLetter(
        service=service,
        subject=msg.subject,
        stream_seq=msg.metadata.sequence.stream,
        deliveries=msg.metadata.num_delivered,
        reason=reason,
        code=str(code.value if isinstance(code, ErrorCode) else code),
        payload=msg.data.decode("utf-8", "replace")[:8192],
        at=datetime.now(UTC),
        details=details or {},
    )
    await broker.publish(ns.dead_letters(service), dead_letter_encoder.encode(letter), msg_id=msg_id)
    metrics.DEAD_LETTERS.labels(service, letter.code).inc()  # rare: no cached child needed
    log(logger, logging.ERROR, "dead-lettered", subject=msg.subject, reason=reason, code=letter.code)
    if settle:
        await msg.term()
