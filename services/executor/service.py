"""The executor shell: owns partitions of a tool family's keys, their SQLite stores, and every provider call."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.capabilities import CapabilityVerifier
from crashsafe.contracts.errors import (
    CapabilityRefused,
    ErrorCode,
    ErrorInfo,
    InvalidSetting,
    PartitionNotOwned,
    PoisonMessage,
)
from crashsafe.contracts.keys import partition_of
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.streams import EXECUTOR_MAX_DELIVER
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    action_request_decoder,
)
from crashsafe.contracts.tools import Effect
from crashsafe.domain.execution import (
    Conflict,
    Execute,
    Replay,
    Resolve,
    being_undone,
    credited,
    receipt_of,
    refused,
)
from crashsafe.domain.registry import KvOperation, Registry, Tool
from crashsafe.domain.unknown_finality import unknown_outcome
from crashsafe.services.executor.call_until_known import (
    PROVIDER_CALLS_BY_TOOL,
    OutcomeStillUnknown,
    call_until_known,
)
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.journal_intents import Reply, intent_head, intent_request
from crashsafe.services.executor.journal_receipts import JournalReceipts
from crashsafe.services.executor.key_records import KeyRecords
from crashsafe.services.executor.leftovers import Leftovers
from crashsafe.services.executor.outcomes import OutcomePublisher, with_note
from crashsafe.services.executor.partition_feeds import PartitionFeeds
from crashsafe.services.executor.partition_stores import PartitionStores
from crashsafe.services.executor.partitions import PartitionKeeper
from crashsafe.services.executor.pruning import Pruner
from crashsafe.services.executor.readiness import ExecutorReadiness
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform import probes, seam_checks
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.deliveries import Deliveries
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import executor_streams, require
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from, span
from crashsafe.services.providers import provider_views
from crashsafe.services.providers.kv_effects import KvEffects
from crashsafe.services.providers.provider_calls import Providers

MAX_DELIVER = EXECUTOR_MAX_DELIVER
# How long a released partition waits for its keys in flight before its store closes (the fence covers the rest).
DRAIN_S = 10.0


class Executor:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        registry: Registry,
        family: str,
        providers: Providers,
        logger: logging.Logger,
        verifier: CapabilityVerifier,
        max_deliver: int = MAX_DELIVER,
    ) -> None:
        self.broker = broker
        # Checks the runtime's signature on every request before anything else is done with it.
        self.verifier = verifier
        self.settings = settings
        self.ns = settings.namespace
        self.family = family
        self.tools = registry.tools_of(family)
        if not self.tools:
            expected = f"a tool family of this deployment: {', '.join(sorted(registry.families))}"
            raise InvalidSetting(variable="--tool", value=family, expected=expected)
        self.providers = providers
        if providers.kv is None and any(isinstance(t.operation, KvOperation) for t in self.tools.values()):
            # A family whose effects are key-value writes (memory) writes them with its own NATS user.
            providers.kv = KvEffects(broker, self.ns)
        self.logger = logger
        self.synchronous = settings.sqlite_sync
        # How many deliveries a key whose outcome stays unknown may spend before the run is told `unknown`.
        self.max_deliver = max_deliver
        # The stores of the partitions this replica holds a lease on, opened on acquire and closed on release.
        self.stores: dict[int, ActionStore] = {}
        # Each key's facts beside its partition's store: what a store that never saw a key learns it from.
        self.facts = FactBook(broker, self.ns, family, settings.stream_replicas)
        # What a key's records say across this replica's stores and beside them (the facts); where this replica
        # stands in each partition's fencing order is the keeper's (made below).
        self.records = KeyRecords(
            self.facts, self.stores, settings.partitions, lambda p: self.keeper.holding(p)
        )
        self.pruner = Pruner(self.stores, settings.retention, logger)  # settled rows past their retention
        # Backed up, and restored at a takeover, so a store follows its partition (off: each replica's own file).
        self.backups = PartitionStores.of(
            settings, family, self.stores, self.records.holding, self.facts, logger
        )
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._busy: dict[int, int] = {}  # keyed deliveries being handled, per partition
        self.outcomes = OutcomePublisher(broker, self.ns, family, logger)
        self.receipts = JournalReceipts(
            broker, self.ns, family, self.outcomes, logger
        )  # intents from the journal
        self.leftovers = Leftovers(self.tools, self._inflight, self.records, self.outcomes, self._run, logger)
        self.incarnation = uuid.uuid4().hex
        self._views: Any = None
        self.keeper = PartitionKeeper(
            broker,
            settings,
            family,
            self.incarnation,
            logger,
            acquired=self._take_up,
            released=self._put_down,
        )
        self.deliveries = Deliveries(
            broker,
            self.ns,
            f"executor_{family}",
            logger,
            max_deliver=max_deliver,
            ack_wait_s=settings.ack_wait_s,
            server_stops=True,  # its durables stop at `max_deliver`: the last delivery is dead-lettered, not lost
        )
        # A held partition's requests on ACTIONS and its intents in the journal (issue 33).
        self.feeds = PartitionFeeds(
            broker, settings, family, max_deliver, self.deliveries, self._on_request, self._on_intent
        )
        held = (self.keeper, self.incarnation, self.stores, self.feeds.requests)
        self.readiness = ExecutorReadiness(broker, settings, family, *held, max_deliver)

    def store_path(self, partition: int) -> Path:
        return self.settings.data_dir / f"{self.ns.name}-{self.family}-p{partition}.sqlite3"

    @property
    def partitions(self) -> list[int]:
        """The partitions this replica holds now (their leases, stores and consumers)."""
        return sorted(self.stores)

    async def start(self) -> None:
        await require(self.broker, executor_streams(self.ns))
        # No partition taken until its receipts land and no consumer of its family is of another shape.
        await seam_checks.prove(f"executor {self.family}", self.readiness.seams())
        # Takes the partitions that are free now and returns; the keeper takes the rest as others let go.
        await self.keeper.start()
        self.pruner.start()
        self.backups.start()
        # The provider's by-key view for the console (read-only lookups; issue 11).
        self._views = await provider_views.serve(
            self.broker, self.ns, self.family, self.tools, self.providers, self.logger
        )
        log(self.logger, logging.INFO, "executor ready", family=self.family, partitions=self.partitions)

    async def close(self) -> None:
        if self._views is not None:
            await self.broker.unsubscribe(self._views)
        await self.pruner.stop()
        await self.backups.stop()  # the release of each partition below still backs its store up
        await self.keeper.close()  # every partition handed back: unsubscribed, keys finished, store closed
        await self.deliveries.drain()
        for store in list(self.stores.values()):
            await store.close()
        self.stores.clear()

    def ops_checks(self) -> dict[str, probes.Check]:
        return self.readiness.checks()

    def ops_samplers(self) -> list[probes.Sampler]:
        return self.readiness.samplers()

    async def _take_up(self, partition: int, token: int) -> None:
        """A partition's lease was acquired: open its store (restored from its backup first where another store
        held it), learn whether it is a takeover, settle what it left open (alongside new work), subscribe."""
        path = self.store_path(partition)
        store = await self.backups.take_up(partition, token, path, self.keeper, self.settings)
        self.stores[partition] = store
        # Start-up reconciliation runs beside new work: the in-flight map keeps a key from running twice.
        await self.leftovers.settle(partition, store)
        # A receipt committed just before a crash may never have been published; its request would come
        # back only after the ack wait. Publishing it again now is harmless: outcomes are deduplicated.
        for outcome in await store.recent_receipts(since_s=4 * self.settings.ack_wait_s + 10):
            await self.outcomes.publish(
                with_note(outcome, Asked.STORE_RECEIPT, Answer.REPUBLISHED), context_from(None)
            )
        await self.feeds.open(partition)

    async def _put_down(self, partition: int) -> None:
        """A partition is released or lost: stop taking its work, let its keys in flight finish, close its store."""
        await self.feeds.close(partition)
        self.leftovers.cancel(partition)
        deadline = time.monotonic() + DRAIN_S
        while self._busy.get(partition, 0) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.backups.put_down(partition, self.stores.pop(partition, None))

    async def _on_request(self, msg: Msg) -> None:
        meta, request = msg.metadata, action_request_decoder.decode(msg.data)
        await self.handle(request, context_from(msg.headers), meta.sequence.stream, meta.num_delivered)

    async def _on_intent(self, msg: Msg) -> None:
        """An intent pulled straight from its run's journal (issue 33), served as a request; its receipt is
        appended into the same journal, right after it where it can be (`JournalReceipts`)."""
        meta, request = msg.metadata, intent_request(msg, self.ns)
        seq = meta.sequence.stream
        reply = self.receipts.reply_to(seq, intent_head(msg, self.ns))
        await self.handle(request, context_from(msg.headers), seq, meta.num_delivered, reply)

    async def handle(
        self,
        request: ActionRequest,
        ctx: Context,
        stream_seq: int,
        deliveries: int,
        reply: Reply | None = None,
    ) -> None:
        # Bounded: the attributes of a request that has not been verified yet are a caller's text.
        with span(
            SpanName.EXECUTOR_CALL,
            ctx,
            run_id=request.run_id[:200],
            step_no=request.step_no,
            idempotency_key=request.key[:200],
            tool=request.tool[:200],
            service=f"executor.{self.family}",
        ) as served:
            await self._serve(request, served, stream_seq, deliveries, reply or self.outcomes.publish)

    async def _serve(
        self, request: ActionRequest, ctx: Context, stream_seq: int, deliveries: int, reply: Reply
    ) -> None:
        # Before the tool lookup, the argument check and the intent row: a request the runtime did not sign for
        # exactly this run, key, tool and input, or one past its expiry, is refused with no outcome at all (an
        # outcome would let its sender inject an answer into a real run) and never reaches a provider. A
        # `resolve` capability is the runtime re-sending a journaled request: the store decides, as for any
        # redelivery.
        refusal = self.verifier.check(request, datetime.now(UTC))
        if refusal is not None:
            raise CapabilityRefused(
                reason=refusal,
                key=request.key[:200],
                tool=request.tool[:200],
                run_id=request.run_id[:200],
                family=request.family[:200],
            )
        tool = self.tools.get(request.tool)
        if tool is None:
            raise PoisonMessage(f"executor {self.family} has no tool {request.tool!r}", key=request.key)
        contract = tool.contract
        missing = tool.missing(request.args)
        if missing:
            # Refused before any intent: nothing was attempted, so the run gets a definitive, typed answer.
            error = ErrorInfo(
                code=ErrorCode.INVALID_TOOL_ARGUMENTS.value,
                message=f"{request.tool} needs {', '.join(missing)}; nothing was sent to the provider",
                details={"key": request.key, "missing": missing},
            )
            await reply(refused(request, error, deliveries), ctx)
            # Also a dead letter: a request the runtime should never have built is a bug someone must see.
            raise PoisonMessage(error.message, key=request.key, missing=missing)
        if contract.effect is Effect.READ:
            await reply(
                await self._run(request, tool, attempts=1, deliveries=deliveries, look_first=False, ctx=ctx),
                ctx,
            )
            return
        partition = partition_of(request.key, self.settings.partitions)
        self._store_for(request.key)  # not held here: retry later, so the message reaches the owner
        self._busy[partition] = self._busy.get(partition, 0) + 1
        try:
            # One key is never executed twice at once: wait for whoever holds it (a delivery, or the settling of
            # a left-over intent), then answer from its receipt.
            while (running := self._inflight.get(request.key)) is not None:
                await running
            store = self._store_for(request.key)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._inflight[request.key] = done
            try:
                await self._handle_keyed(store, request, tool, ctx, stream_seq, deliveries, reply)
            finally:
                self._inflight.pop(request.key, None)
                done.set_result(None)
        finally:
            self._busy[partition] -= 1

    async def _handle_keyed(
        self,
        store: ActionStore,
        request: ActionRequest,
        tool: Tool,
        ctx: Context,
        stream_seq: int,
        deliveries: int,
        reply: Reply,
    ) -> None:
        plan, record, undone = await self.records.plan(store, request, tool, stream_seq, deliveries)
        if undone is not None and being_undone(record, request, undone):
            # Another run's effect whose compensation is under way: neither "still there" nor "undone" yet.
            detail = (
                f"{request.key} is being undone by {undone.key}, whose outcome is not settled; "
                "ask again once it is"
            )
            if deliveries >= self.max_deliver - 1:
                await reply(unknown_outcome(request, detail, 0, deliveries), ctx)
                return
            raise OutcomeStillUnknown(detail, key=request.key)
        attempts, look_first = 1, False
        sent_at: float | None = None
        match plan:
            case Replay(outcome=outcome):
                await reply(with_note(outcome, Asked.STORE_RECEIPT, Answer.REPLAYED), ctx)
                return
            case Conflict(outcome=outcome):
                PROVIDER_CALLS_BY_TOOL(request.tool, "conflict").inc()  # refused uncalled: other input
                await reply(with_note(outcome, Asked.STORE_CONFLICT, Answer.CONFLICT), ctx)
                return
            case Execute():
                pass
            case Resolve(attempts=attempts, sent_at=sent_at):
                look_first = True
        try:
            outcome = await self._run(request, tool, attempts, deliveries, look_first, store, ctx, sent_at)
        except OutcomeStillUnknown as exc:
            await store.mark_unknown(request.key)
            if exc.final or deliveries >= self.max_deliver - 1:
                # Out of redeliveries, or no later ask can tell (a final unknown): tell the run the outcome is
                # unknown (it hands off); the reconciler goes on asking.
                outcome = unknown_outcome(request, exc.message, attempts, deliveries)
                await reply(msgspec.structs.replace(outcome, evidence=exc.evidence), ctx)
                return
            raise
        crash_point("executor.after_provider_ack")
        await self.records.settle(store, request, receipt_of(outcome, record), stream_seq)
        crash_point("executor.after_receipt")
        outcome = credited(outcome, record)
        await reply(outcome, ctx)
        crash_point("executor.after_outcome_published")

    async def _run(
        self,
        request: ActionRequest,
        tool: Tool,
        attempts: int,
        deliveries: int,
        look_first: bool,
        store: ActionStore | None = None,
        ctx: Context | None = None,
        sent_at: float | None = None,
    ) -> ActionOutcome:
        """`call_until_known`, each new attempt made durable first, here and beside the store (with a store)."""
        attempted = functools.partial(self.records.attempted, store, request) if store is not None else None
        return await call_until_known(
            self.providers,
            request,
            tool,
            attempts,
            deliveries,
            look_first,
            clock_skew_s=self.settings.clock_skew_s,
            sent_at=sent_at,
            ctx=ctx,
            attempted=attempted,
        )

    def _store_for(self, key: str) -> ActionStore:
        partition = partition_of(key, self.settings.partitions)
        store = self.stores.get(partition)
        if store is None:
            raise PartitionNotOwned(family=self.family, partition=partition, key=key)
        return store
