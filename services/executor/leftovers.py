"""Intents a previous life (or a previous store) left open in a partition, settled once it is taken up, beside
new work: each looked up by key (maybe called again), receipted and published, or left open for the next owner."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from crashsafe.contracts.errors import CrashsafeError, PartitionNotOwned
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest
from crashsafe.domain.execution import credited, receipt_of
from crashsafe.domain.registry import Tool
from crashsafe.domain.unknown_finality import unknown_outcome
from crashsafe.services.executor.call_until_known import OutcomeStillUnknown
from crashsafe.services.executor.key_records import KeyRecords
from crashsafe.services.executor.outcomes import OutcomePublisher
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.tracing import context_from

# Left-over intents settled at once after a partition is taken up (each one lookup, maybe a call).
LEFTOVER_CONCURRENCY = 32


class Leftovers:
    def __init__(
        self,
        tools: dict[str, Tool],
        inflight: dict[str, asyncio.Future[None]],
        records: KeyRecords,
        outcomes: OutcomePublisher,
        call: Callable[..., Awaitable[ActionOutcome]],
        logger: logging.Logger,
    ) -> None:
        self.tools = tools
        # The executor's map of keys being settled (the same dict): a key is never settled twice at once.
        self._inflight = inflight
        self.records = records
        self.outcomes = outcomes
        self.call = call  # the executor's call-until-known, each attempt made durable first
        self.logger = logger
        self._tasks: dict[int, set[asyncio.Task[None]]] = {}
        self._slots = asyncio.Semaphore(LEFTOVER_CONCURRENCY)

    def cancel(self, partition: int) -> None:
        """A partition let go: its left-overs stop; their intents stay open and the next owner settles them."""
        for task in self._tasks.pop(partition, set()):
            task.cancel()

    async def settle(self, partition: int, store: ActionStore) -> None:
        loop = asyncio.get_running_loop()
        for request, attempts, sent_at in await store.open_intents():
            if request.key in self._inflight:
                continue  # a delivery of the key is settling it already
            done: asyncio.Future[None] = loop.create_future()
            self._inflight[request.key] = done
            task = asyncio.create_task(self._settle_one(store, request, attempts, sent_at, done))
            tasks = self._tasks.setdefault(partition, set())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _settle_one(
        self,
        store: ActionStore,
        request: ActionRequest,
        attempts: int,
        sent_at: float,
        done: asyncio.Future[None],
    ) -> None:
        try:
            async with self._slots:
                await self._resolve(store, request, attempts, sent_at)
        finally:
            if self._inflight.get(request.key) is done:
                del self._inflight[request.key]
            done.set_result(None)

    async def _resolve(
        self, store: ActionStore, request: ActionRequest, attempts: int, sent_at: float
    ) -> None:
        tool = self.tools.get(request.tool)
        if tool is None:
            return
        try:
            record = await store.get(request.key)
            outcome = await self.call(request, tool, attempts, 1, True, store, sent_at=sent_at)
        except OutcomeStillUnknown as exc:
            if exc.final:  # no later ask can tell: the run hears it now, not after its request's redeliveries
                await self._tell_unknown(store, request, attempts, exc)
                return
            log(
                self.logger,
                logging.WARNING,
                "left-over intent still unknown",
                key=request.key,
                detail=exc.message,
            )
            return
        except Exception:  # one bad left-over must never keep the executor from starting
            self.logger.exception(
                "could not resolve a left-over intent; it stays open", extra={"fields": {"key": request.key}}
            )
            return
        try:
            await self.records.settle(store, request, receipt_of(outcome, record), None)
        except PartitionNotOwned:
            log(
                self.logger,
                logging.WARNING,
                "left-over intent: partition lost before its receipt",
                key=request.key,
            )
            return
        outcome = credited(outcome, record)
        await self.outcomes.publish(outcome, context_from(None))
        log(
            self.logger,
            logging.INFO,
            "resolved left-over intent",
            run_id=request.run_id,
            key=request.key,
            via=outcome.via,
            status=outcome.status,
        )

    async def _tell_unknown(
        self, store: ActionStore, request: ActionRequest, attempts: int, exc: OutcomeStillUnknown
    ) -> None:
        """A final unknown left over: marked unknown in the store (a later delivery of the key asks again and
        answers unknown again, never calling), then published to the run with what was asked on the way."""
        try:
            if not await store.mark_unknown(request.key):
                # Marked unknown by an earlier start, which told the run (or its request's redelivery will): a
                # store keeps its records, so telling it again at every start would grow without end.
                return
        except PartitionNotOwned:
            log(
                self.logger,
                logging.WARNING,
                "left-over intent: partition lost before it was told",
                key=request.key,
            )
            return
        outcome = unknown_outcome(request, exc.message, attempts, 1)
        try:
            await self.outcomes.publish(
                msgspec.structs.replace(outcome, evidence=exc.evidence), context_from(None)
            )
        except CrashsafeError as error:
            # The key is marked: the run hears it from its request's next delivery, which asks the store again.
            log(
                self.logger,
                logging.WARNING,
                "left-over intent cannot be known; telling the run failed, its request's redelivery will",
                key=request.key,
                error=error.message,
            )
            return
        log(
            self.logger,
            logging.WARNING,
            "left-over intent cannot be known; told the run",
            run_id=request.run_id,
            key=request.key,
            detail=exc.message,
        )
