"""How every service handles one JetStream delivery: ack on success, nak on retryable, dead-letter on poison."""

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
from crashsafe.contracts.errors import CrashsafeError, ErrorCode, RetryClass
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform import metrics
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.pull_feed import Room


class Deliveries:
    """Runs handlers for deliveries concurrently (bounded), and settles each message exactly as its outcome says.

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
    ) -> None:
        self.broker = broker
        self.ns = ns
        self.service = service
        self.logger = logger
        self.max_deliver = max_deliver
        self.heartbeat_s = max(ack_wait_s / 4, 0.1)
        self.room = Room(
            concurrency
        )  # reserved by the pull feeds before they ask (`Broker.subscribe(room=)`)
        self._tasks: set[asyncio.Task[None]] = set()
        # Messages being handled, and when their ack timer was last reset: one sweeper heartbeats them all.
        self._handling: dict[int, tuple[Msg, float]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def dispatch(self, handler: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """The callback for a feed that reserved room for each message: it starts the handler and returns."""

        async def on_message(msg: Msg) -> None:
            task = asyncio.create_task(self._settle(msg, handler))
            self._tasks.add(task)
            task.add_done_callback(self._done)

        return on_message

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.room.release(1)

    async def _settle(self, msg: Msg, handler: Callable[[Msg], Awaitable[None]]) -> None:
        deliveries = msg.metadata.num_delivered
        if deliveries > self.max_deliver:
            # Taken this often and never settled (each handler died or stalled first): the server has no limit of
            # its own (it would end deliveries silently), so the message is given up here, as a dead letter.
            try:
                await self.dead_letter(
                    msg,
                    f"delivered {deliveries} times and never settled (over {self.max_deliver}); "
                    "find why its handler died or stalled, then replay or discard it",
                    ErrorCode.DELIVERIES_EXHAUSTED,
                    {"deliveries": deliveries, "max_deliver": self.max_deliver},
                )
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                log(
                    self.logger,
                    logging.WARNING,
                    "could not dead-letter; it will be redelivered",
                    error=str(exc),
                )
            return
        # A short ack wait lets a dead worker's messages come back fast; a live worker's long steps say "in progress".
        self._handling[id(msg)] = (msg, time.monotonic())
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._heartbeats())
        try:
            await self._handle(msg, handler, deliveries)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            # The broker went away mid-settle: the message was not acked, so it comes back after the ack wait.
            log(
                self.logger,
                logging.WARNING,
                "could not settle message; it will be redelivered",
                subject=msg.subject,
                error=str(exc),
            )
        finally:
            self._handling.pop(id(msg), None)

    async def _handle(self, msg: Msg, handler: Callable[[Msg], Awaitable[None]], deliveries: int) -> None:
        try:
            await handler(msg)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self.dead_letter(msg, f"cannot decode: {exc}", ErrorCode.POISON_MESSAGE)
        except CrashsafeError as exc:
            if exc.retry is RetryClass.POISON or deliveries >= self.max_deliver:
                await self.dead_letter(msg, exc.message, exc.code, exc.details())
            else:
                log(
                    self.logger,
                    logging.WARNING,
                    "retrying later",
                    error=exc.code.value,
                    detail=exc.message,
                    deliveries=deliveries,
                )
                await msg.nak(delay=min(0.2 * 2**deliveries, 5.0))
        except Exception as exc:  # an unexpected bug must not loop forever nor lose the message silently
            self.logger.exception(
                "handler failed", extra={"fields": {"subject": msg.subject, "deliveries": deliveries}}
            )
            if deliveries >= self.max_deliver:
                await self.dead_letter(msg, f"{type(exc).__name__}: {exc}", ErrorCode.HANDLER_FAILED)
            else:
                await msg.nak(delay=min(0.2 * 2**deliveries, 5.0))
        else:
            await msg.ack()

    async def _heartbeats(self) -> None:
        """Every message handled for longer than a heartbeat says "in progress", so its ack timer restarts."""
        while self._handling:
            await asyncio.sleep(self.heartbeat_s)
            now = time.monotonic()
            for ident, (msg, since) in list(self._handling.items()):
                if now - since >= self.heartbeat_s and ident in self._handling:
                    self._handling[ident] = (msg, now)
                    try:
                        await msg.in_progress()
                    except (nats.errors.Error, OSError):
                        pass

    async def dead_letter(
        self, msg: Msg, reason: str, code: ErrorCode, details: dict[str, Any] | None = None
    ) -> None:
        letter = DeadLetter(
            service=self.service,
            subject=msg.subject,
            stream_seq=msg.metadata.sequence.stream,
            deliveries=msg.metadata.num_delivered,
            reason=reason,
            code=code,
            payload=msg.data.decode("utf-8", "replace")[:8192],
            at=datetime.now(UTC),
            details=details or {},
        )
        await self.broker.publish(self.ns.dead_letters(self.service), dead_letter_encoder.encode(letter))
        metrics.DEAD_LETTERS.labels(self.service, code.value).inc()  # rare: no cached child needed
        log(self.logger, logging.ERROR, "dead-lettered", subject=msg.subject, reason=reason, code=code.value)
        await msg.term()

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
