"""The executor shell: owns partitions of a tool family's keys, their SQLite stores, and every provider call."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from dataclasses import field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.capabilities import CapabilityVerifier
from crashsafe.contracts.errors import (
    NOT_SENT,
    CapabilityRefused,
    CrashsafeError,
    ErrorCode,
    ErrorInfo,
    InvalidSetting,
    PartitionNotOwned,
    PoisonMessage,
    RetryClass,
)
from crashsafe.contracts.keys import CompensationKind, compensation_key, partition_of
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.streams import ConsumerSpec, executor_consumer, leases_spec
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    Evidence,
    action_request_decoder,
    tool_encoder,
)
from crashsafe.contracts.tools import Effect, ToolContract
from crashsafe.domain import key_facts
from crashsafe.domain.execution import (
    CallAgain,
    Conflict,
    Done,
    Execute,
    LookUp,
    Next,
    Plan,
    Record,
    Replay,
    Resolve,
    StillUnknown,
    after_call,
    after_lookup,
    being_undone,
    classify,
    credited,
    made_by_another,
    receipt_of,
    refused,
    unknown_outcome,
)
from crashsafe.domain.partition_ownership import (
    Holder,
    fenced,
    holder_decoder,
    lease_encoder,
    member_decoder,
    takeover,
)
from crashsafe.domain.registry import KvOperation, ProviderAnswer, Registry, Tool
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.partitions import PartitionKeeper
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform import metrics, probes
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.deliveries import Deliveries
from crashsafe.services.platform.jetstream import Broker, Subscription
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import executor_streams, require
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import annotate, context_from, headers_for, span
from crashsafe.services.providers import provider_views
from crashsafe.services.providers.kv_effects import KvEffects
from crashsafe.services.providers.provider_calls import Providers

MAX_DELIVER = 12
# Left-over intents settled at once after a partition is taken up (each one lookup, maybe a call).
LEFTOVER_CONCURRENCY = 32
# How long a released partition waits for its keys in flight before its store closes (the fence covers the rest).
DRAIN_S = 10.0


class OutcomeStillUnknown(CrashsafeError):
    """Neither the call nor the lookup could tell what happened; the message comes back later to ask again."""

    code = ErrorCode.OUTCOME_UNKNOWN
    retry = RetryClass.RETRY_LATER

    message: str = field(kw_only=False, metadata=NOT_SENT)
    # What was asked and answered on the way, for the outcome the message gets when it comes back.
    evidence: list[Evidence] = field(default_factory=list, kw_only=False, metadata=NOT_SENT)
    key: str


# Metric children per tool (and outcome), made once; a provider's answer kind as the metric names it.
_PROVIDER_CALLS = metrics.Children(metrics.PROVIDER_CALLS)
_PROVIDER_CALL_SECONDS = metrics.Children(metrics.PROVIDER_CALL_SECONDS)
_LOOKUPS = metrics.Children(metrics.LOOKUPS)
_CALL_OUTCOME = {Answer.OK: "succeeded", Answer.REJECTED: "failed", Answer.UNKNOWN: "unknown"}


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
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._busy: dict[int, int] = {}  # keyed deliveries being handled, per partition
        self._leftovers: dict[int, set[asyncio.Task[None]]] = {}
        self._leftover_slots = asyncio.Semaphore(LEFTOVER_CONCURRENCY)
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
        )

    def store_path(self, partition: int) -> Path:
        return self.settings.data_dir / f"{self.ns.name}-{self.family}-p{partition}.sqlite3"

    @property
    def partitions(self) -> list[int]:
        """The partitions this replica holds now (their leases, stores and consumers)."""
        return sorted(self.stores)

    async def start(self) -> None:
        await require(self.broker, executor_streams(self.ns))
        # Takes the partitions that are free now and returns; the keeper takes the rest as others let go.
        await self.keeper.start()
        # The provider's by-key view for the console (read-only lookups; issue 11).
        self._views = await provider_views.serve(
            self.broker, self.ns, self.family, self.tools, self.providers, self.logger
        )
        log(self.logger, logging.INFO, "executor ready", family=self.family, partitions=self.partitions)

    async def close(self) -> None:
        if self._views is not None:
            await self.broker.unsubscribe(self._views)
        await (
            self.keeper.close()
        )  # every partition handed back: unsubscribed, its keys finished, store closed
        await self.deliveries.drain()
        for store in list(self.stores.values()):
            await store.close()
        self.stores.clear()

    def ops_checks(self) -> dict[str, probes.Check]:
        """Readiness, asked afresh each time (partitions move): NATS and its streams; in shared mode its member
        record alive, with an explicit list each listed partition's lease held; every held partition's store
        answering and its consumer present."""
        checks = probes.basic_checks(self.broker, executor_streams(self.ns))
        keeper = self.keeper
        if keeper.static is None:
            checks["member"] = self._member_alive
        else:
            for p in keeper.static:
                checks[f"lease:{p}"] = functools.partial(self._lease_held, p)
        for p, store in sorted(self.stores.items()):
            checks[f"store:{p}"] = functools.partial(_store_answers, store)
        checks.update(probes.consumer_checks(self.broker, self._consumers()))
        return checks

    def ops_samplers(self) -> list[probes.Sampler]:
        return [probes.lag_sampler(self.broker, self._consumers)]

    def _consumers(self) -> list[ConsumerSpec]:
        return [
            executor_consumer(
                self.ns, self.family, p, self.settings.ack_wait_s, self.max_deliver, self.settings.lease_s
            )
            for p in sorted(self._subscriptions)
        ]

    async def _member_alive(self) -> str | None:
        keeper = self.keeper
        entry = await self.broker.kv_get(keeper.spec, self.ns.member_key(self.family, keeper.me))
        if entry is None:
            return f"member record of {keeper.me} expired (lease rounds not landing)"
        if member_decoder.decode(entry.value).incarnation != self.incarnation:
            return f"member record of {keeper.me} belongs to another process life"
        return None

    async def _lease_held(self, partition: int) -> str | None:
        why = fenced(self.keeper.tenures.get(partition), time.monotonic())
        if why is not None:
            return f"partition {partition}: {why}"
        if partition not in self._subscriptions:
            return f"partition {partition}: lease held, store and consumer still being taken up"
        return None

    async def _take_up(self, partition: int, token: int) -> None:
        """A partition's lease was acquired: open its store, learn whether it is a takeover, settle what it left
        open (alongside new work), then subscribe its consumer."""
        store = await ActionStore.open(self.store_path(partition), self.synchronous)
        try:
            spec = leases_spec(self.ns, self.settings.stream_replicas)
            holder_key = self.ns.holder_key(self.family, partition)
            entry = await self.broker.kv_get(spec, holder_key)
            holder = holder_decoder.decode(entry.value) if entry is not None else None
            taken = takeover(holder, store.store_id)
            await store.record_tenure(token, self.keeper.me, holder.store if holder else None, taken)
            store.clock_skew_s = self.settings.clock_skew_s
            store.fence = functools.partial(self.keeper.check, partition)
            record = Holder(store=store.store_id, owner=self.keeper.me, token=token)
            await self.broker.kv_write(spec, holder_key, lease_encoder.encode(record), revision=None)
        except BaseException:
            await store.close()
            raise
        self.stores[partition] = store
        if taken:
            log(
                self.logger,
                logging.WARNING,
                "partition taken over from another store; keys it never saw are looked up first",
                partition=partition,
                previous_store=holder.store if holder else None,
            )
        # Start-up reconciliation runs beside new work: the in-flight map keeps a key from running twice.
        await self._settle_leftovers(partition, store)
        # A receipt committed just before a crash may never have been published; its request would come
        # back only after the ack wait. Publishing it again now is harmless: outcomes are deduplicated.
        for outcome in await store.recent_receipts(since_s=4 * self.settings.ack_wait_s + 10):
            await self._publish(
                self._with_note(outcome, Asked.STORE_RECEIPT, Answer.REPUBLISHED), context_from(None)
            )
        consumer = executor_consumer(
            self.ns, self.family, partition, self.settings.ack_wait_s, self.max_deliver, self.settings.lease_s
        )
        await self.broker.ensure_consumer(consumer)
        self._subscriptions[partition] = await self.broker.subscribe(
            consumer, self.deliveries.dispatch(self._on_request), room=self.deliveries.room
        )

    async def _put_down(self, partition: int) -> None:
        """A partition is released or lost: stop taking its work, let its keys in flight finish, close its store."""
        subscription = self._subscriptions.pop(partition, None)
        if subscription is not None:
            await self.broker.unsubscribe(subscription)
        for task in self._leftovers.pop(partition, set()):
            task.cancel()  # its intent stays open; the next owner settles it
        deadline = time.monotonic() + DRAIN_S
        while self._busy.get(partition, 0) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        store = self.stores.pop(partition, None)
        if store is not None:
            await store.close()

    async def _settle_leftovers(self, partition: int, store: ActionStore) -> None:
        loop = asyncio.get_running_loop()
        for request, attempts, sent_at in await store.open_intents():
            if request.key in self._inflight:
                continue  # a delivery of the key is settling it already
            done: asyncio.Future[None] = loop.create_future()
            self._inflight[request.key] = done
            task = asyncio.create_task(self._settle_leftover(store, request, attempts, sent_at, done))
            tasks = self._leftovers.setdefault(partition, set())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _settle_leftover(
        self,
        store: ActionStore,
        request: ActionRequest,
        attempts: int,
        sent_at: float,
        done: asyncio.Future[None],
    ) -> None:
        try:
            async with self._leftover_slots:
                await self._resolve_leftover(store, request, attempts, sent_at)
        finally:
            if self._inflight.get(request.key) is done:
                del self._inflight[request.key]
            done.set_result(None)

    async def _on_request(self, msg: Msg) -> None:
        request = action_request_decoder.decode(msg.data)
        ctx = context_from(msg.headers)
        meta = msg.metadata
        await self.handle(request, ctx, meta.sequence.stream, meta.num_delivered)

    async def handle(self, request: ActionRequest, ctx: Context, stream_seq: int, deliveries: int) -> None:
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
            await self._serve(request, served, stream_seq, deliveries)

    async def _serve(self, request: ActionRequest, ctx: Context, stream_seq: int, deliveries: int) -> None:
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
            await self._publish(refused(request, error, deliveries), ctx)
            # Also a dead letter: a request the runtime should never have built is a bug someone must see.
            raise PoisonMessage(error.message, key=request.key, missing=missing)
        if contract.effect is Effect.READ:
            await self._publish(
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
                await self._handle_keyed(store, request, tool, ctx, stream_seq, deliveries)
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
    ) -> None:
        # The common case is a key never seen: try to commit its intent first, and read the record only if it exists.
        record: Record | None
        if await store.begin(request, stream_seq):
            crash_point("executor.after_intent")
            # A key this store never saw may be known beside it (asked by another run, on another store).
            record, undone = await self._learn(store, request)
            if record is not None:
                if undone is None and record.status.settled:
                    undone = await self._undone(store, request, tool)
                plan: Plan = classify(record, request, deliveries, undone)
            elif store.inherits(request):
                # Asked before this store took the partition over, and no facts: the previous holder may have
                # sent one call (a second would have left facts), no later than the takeover.
                plan = Resolve(attempts=1, sent_at=store.takeover_at)
            else:
                plan = Execute()
        else:
            record = await store.get(request.key)
            undone = (
                await self._undone(store, request, tool)
                if record is not None and record.status.settled
                else None
            )
            plan = classify(record, request, deliveries, undone)
        if undone is not None and being_undone(record, request, undone):
            # Another run's effect whose compensation is under way: neither "still there" nor "undone" yet.
            detail = (
                f"{request.key} is being undone by {undone.key}, whose outcome is not settled; "
                "ask again once it is"
            )
            if deliveries >= self.max_deliver - 1:
                await self._publish(unknown_outcome(request, detail, 0, deliveries), ctx)
                return
            raise OutcomeStillUnknown(detail, key=request.key)
        attempts, look_first = 1, False
        sent_at: float | None = None
        match plan:
            case Replay(outcome=outcome):
                await self._publish(self._with_note(outcome, Asked.STORE_RECEIPT, Answer.REPLAYED), ctx)
                return
            case Conflict(outcome=outcome):
                _PROVIDER_CALLS(
                    request.tool, "conflict"
                ).inc()  # refused before any call: the key's input differs
                await self._publish(self._with_note(outcome, Asked.STORE_CONFLICT, Answer.CONFLICT), ctx)
                return
            case Execute():
                pass
            case Resolve(attempts=attempts, sent_at=sent_at):
                look_first = True
        try:
            outcome = await self._run(request, tool, attempts, deliveries, look_first, store, ctx, sent_at)
        except OutcomeStillUnknown as exc:
            await store.mark_unknown(request.key)
            if deliveries >= self.max_deliver - 1:
                # Out of redeliveries: tell the run the outcome is unknown (it hands off); the reconciler goes on asking.
                outcome = unknown_outcome(request, exc.message, attempts, deliveries)
                await self._publish(msgspec.structs.replace(outcome, evidence=exc.evidence), ctx)
                return
            raise
        crash_point("executor.after_provider_ack")
        await self._settle(store, request, receipt_of(outcome, record), stream_seq)
        crash_point("executor.after_receipt")
        outcome = credited(outcome, record)
        await self._publish(outcome, ctx)
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
        """Call, and on an unknown answer look up by key; call again (same key) only once the provider has no
        record of it and no earlier call whose answer was unknown can still be in its hands. `sent_at`: when a
        previous life's (or a previous store's) last call with the key was sent (wall clock), if there was one."""
        trail: list[Evidence] = []
        contract = tool.contract
        # When the last call whose answer was unknown was sent (wall clock), and the clock skew to allow for (a
        # previous life's time may come from another host): it may commit until the window passes.
        unknown_sent_at, skew = sent_at, (self.settings.clock_skew_s if sent_at is not None else 0.0)

        def note(asked: str, answer: ProviderAnswer) -> ProviderAnswer:
            trail.append(
                Evidence(
                    asked=asked,
                    key=request.key,
                    answer=answer.kind,
                    detail=answer.detail,
                    at=datetime.now(UTC),
                )
            )
            return answer

        async def call(sent_wall: float) -> Next:
            nonlocal unknown_sent_at, skew
            started = time.monotonic()
            answer = note(
                Asked.PROVIDER_CALL,
                await self.providers.call(tool, request, self._timeout(request, contract), ctx=ctx),
            )
            _PROVIDER_CALL_SECONDS(request.tool).observe(time.monotonic() - started)
            _PROVIDER_CALLS(request.tool, _CALL_OUTCOME.get(answer.kind, str(answer.kind))).inc()
            maker = made_by_another(key_facts.shared(request.key), answer, attempts)
            if maker is not None:  # the call's evidence line says whose effect this is
                trail[-1] = msgspec.structs.replace(trail[-1], detail=maker)
            if answer.kind == Answer.UNKNOWN:
                unknown_sent_at, skew = sent_wall, 0.0
            return after_call(request, contract, answer, attempts, deliveries)

        def in_flight_left() -> float:
            return key_facts.in_flight_left(contract.in_flight_window_s, unknown_sent_at, time.time(), skew)

        step: Next = LookUp() if look_first else await call(time.time())
        while True:
            match step:
                case Done(outcome=outcome):
                    return msgspec.structs.replace(outcome, evidence=trail)
                case LookUp(delay_s=delay):
                    if not self.providers.can_look_up(tool):
                        raise OutcomeStillUnknown(
                            f"{request.tool} has no lookup; cannot resolve {request.key}",
                            trail,
                            key=request.key,
                        )
                    if delay:
                        await asyncio.sleep(delay)  # the provider's Retry-After
                    answer = note(
                        Asked.PROVIDER_LOOKUP,
                        await self.providers.lookup(
                            tool, request.key, self._timeout(request, contract), request.args, ctx=ctx
                        ),
                    )
                    _LOOKUPS(request.tool, str(answer.kind)).inc()
                    step = after_lookup(request, contract, answer, attempts, deliveries, in_flight_left())
                case CallAgain(delay_s=delay):
                    await asyncio.sleep(delay)
                    attempts += 1
                    now = time.time()
                    if store is not None:
                        # Durable before the call, here and beside the store: a next life or a next store
                        # counts on from here and waits out this call's window before calling again.
                        await self._attempted(store, request, attempts, now)
                        await store.attempt(request.key, attempts, now)
                    step = await call(now)
                case StillUnknown(detail=detail):
                    raise OutcomeStillUnknown(
                        f"outcome of {request.key} still unknown: {detail}", trail, key=request.key
                    )

    def _timeout(self, request: ActionRequest, contract: ToolContract) -> float:
        # The deadline passed down: never wait longer than the run has left, nor less than a sliver.
        remaining = (request.deadline_at - datetime.now(UTC)).total_seconds()
        return max(
            min(contract.timeout_s, request.timeout_s, remaining if remaining > 0 else contract.timeout_s),
            0.2,
        )

    async def _resolve_leftover(
        self, store: ActionStore, request: ActionRequest, attempts: int, sent_at: float
    ) -> None:
        tool = self.tools.get(request.tool)
        if tool is None:
            return
        try:
            record = await store.get(request.key)
            outcome = await self._run(request, tool, attempts, 1, True, store, sent_at=sent_at)
        except OutcomeStillUnknown as exc:
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
            await self._settle(store, request, receipt_of(outcome, record), None)
        except PartitionNotOwned:
            log(
                self.logger,
                logging.WARNING,
                "left-over intent: partition lost before its receipt",
                key=request.key,
            )
            return
        outcome = credited(outcome, record)
        await self._publish(outcome, context_from(None))
        log(
            self.logger,
            logging.INFO,
            "resolved left-over intent",
            run_id=request.run_id,
            key=request.key,
            via=outcome.via,
            status=outcome.status,
        )

    async def _undone(self, own: ActionStore, request: ActionRequest, tool: Tool) -> Record | None:
        """The record of a compensation of this key, if a store this executor holds has one. A business key's
        compensation is partitioned with the key it undoes (`keys.partition_key`), so the key's own store has it;
        a step key's may be in a partition another replica owns (its run never asks for it again anyway). A
        store that took its partition over may have missed a compensation the previous store ran: the key's
        facts say."""
        if tool.contract.compensation is None:
            return None
        for kind in CompensationKind:
            key = compensation_key(request.key, kind)
            store = self.stores.get(partition_of(key, self.settings.partitions))
            record = await store.get(key) if store is not None else None
            if record is not None:
                return record
        if own.takeover_at is not None and key_facts.shared(request.key):
            facts, _ = await self.facts.read(request.key)
            undone = key_facts.undone_record(facts) if facts is not None else None
            if undone is not None:
                return undone
            # Not marked undone (yet): a compensation begun on another store has facts of its own.
            for kind in CompensationKind:
                begun, _ = await self.facts.read(compensation_key(request.key, kind))
                if begun is not None:
                    return key_facts.as_record(begun)
        return None

    async def _learn(self, store: ActionStore, request: ActionRequest) -> tuple[Record | None, Record | None]:
        """A key this store has just begun: its facts beside the store, if another store or run asked for it
        first (adopted into this store, which answers it from now on), and the compensation that undid it.
        A shared key's first ask is recorded there now (one compare-and-set); a step key's facts are only
        read, and only when it was asked before this store took its partition over."""
        partition = partition_of(request.key, self.settings.partitions)
        if key_facts.shared(request.key):
            mine = key_facts.first_asked(request, time.time(), self._token(partition), store.store_id)
            known = await self.facts.first(mine, store.fence)
        elif store.inherits(request):
            known, _ = await self.facts.read(request.key)
        else:
            return None, None
        if known is None:
            return None, None
        record = key_facts.as_record(known)
        await store.adopt(record)
        return record, key_facts.undone_record(known)

    async def _attempted(
        self, store: ActionStore, request: ActionRequest, attempts: int, sent_at: float
    ) -> None:
        partition = partition_of(request.key, self.settings.partitions)
        token = self._token(partition)

        def change(current: key_facts.KeyFacts | None) -> key_facts.KeyFacts:
            base = current or key_facts.first_asked(request, sent_at, token, store.store_id)
            return key_facts.attempted(base, attempts, sent_at, token, store.store_id)

        await self.facts.change(request.key, change, token, store.fence, partition)

    async def _settle(
        self, store: ActionStore, request: ActionRequest, receipt: ActionOutcome, stream_seq: int | None
    ) -> None:
        """Commit the receipt: beside the store first (a shared key, or one whose attempts left facts there),
        then in it; and a compensation's success on the key it undid, so no store replays the undone effect."""
        partition = partition_of(request.key, self.settings.partitions)
        token = self._token(partition)
        if key_facts.shared(receipt.key) or receipt.attempts > 1:

            def change(current: key_facts.KeyFacts | None) -> key_facts.KeyFacts:
                base = current or key_facts.first_asked(request, time.time(), token, store.store_id)
                return key_facts.settled(base, receipt, token, store.store_id)

            await self.facts.change(receipt.key, change, token, store.fence, partition)
        base_key = key_facts.undoes(receipt)
        if base_key is not None:

            def mark(current: key_facts.KeyFacts | None) -> key_facts.KeyFacts | None:
                if current is None:
                    return None  # never asked through the facts (a key from before them): its store knows
                return key_facts.undone(current, receipt.key, token, store.store_id)

            await self.facts.change(base_key, mark, token, store.fence, partition)
        await store.finish(receipt, stream_seq)

    def _token(self, partition: int) -> int:
        """The lease token this replica holds the partition under (0 if none: every fenced write then refuses)."""
        tenure = self.keeper.tenures.get(partition)
        return tenure.token if tenure is not None else 0

    @staticmethod
    def _with_note(outcome: ActionOutcome, asked: str, answer: str) -> ActionOutcome:
        note = Evidence(
            asked=asked,
            key=outcome.key,
            answer=answer,
            detail="answered from the action store",
            at=datetime.now(UTC),
        )
        return msgspec.structs.replace(outcome, evidence=[*outcome.evidence, note])

    def _store_for(self, key: str) -> ActionStore:
        partition = partition_of(key, self.settings.partitions)
        store = self.stores.get(partition)
        if store is None:
            raise PartitionNotOwned(family=self.family, partition=partition, key=key)
        return store

    async def _publish(self, outcome: ActionOutcome, ctx: Context) -> None:
        annotate(ctx, outcome=outcome.status, via=outcome.via)
        await self.broker.publish(
            self.ns.outcomes(self.family, outcome.run_id),
            tool_encoder.encode(outcome),
            # No message id: JetStream deduplicates per stream, not per subject, so a predictable id would let any
            # publisher to the outcomes stream (another family, a wake) reserve this one and have it dropped as a
            # duplicate. The runtime records a repeated outcome once (record_outcome), which is all the id bought.
            headers=headers_for(ctx),
        )
        log(
            self.logger,
            logging.DEBUG,
            "outcome",
            run_id=outcome.run_id,
            step_no=outcome.step_no,
            key=outcome.key,
            status=outcome.status,
            via=outcome.via,
        )


async def _store_answers(store: ActionStore) -> str | None:
    await store.ping()
    return None
