"""The projector shell: plans each ended run's projections from its journal and delivers them, one pull worker
per projection tool, each task's receipt durable in KV before its message is acknowledged."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.dead_letters import DeadLetter, dead_letter_encoder
from crashsafe.contracts.errors import (
    BrokerUnavailable,
    CrashsafeError,
    ErrorCode,
    LeaseConflict,
    UnknownAgent,
)
from crashsafe.contracts.projections import (
    AUDIT_TRAIL_TOOL,
    ProjectionFailed,
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
    record_decoder,
    task_decoder,
    task_encoder,
)
from crashsafe.contracts.run_events import decode_event
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.streams import (
    PLANNER_HISTORY_S,
    ConsumerSpec,
    projection_consumer,
    projections_spec,
    projector_planner_consumer,
)
from crashsafe.contracts.subjects import Header, StreamKind
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.domain.agent import ProjectionCall
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.projection_rules import (
    Dead,
    Decision,
    Delivered,
    RetryIn,
    Trigger,
    after_attempt,
    audit_records,
    chunks,
    envelope_of,
    trigger,
)
from crashsafe.domain.registry import HttpOperation, ProviderAnswer, Registry, Tool
from crashsafe.domain.run_state import RunState
from crashsafe.services.platform import metrics, probes
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker, StoredMessage, Subscription
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import require
from crashsafe.services.platform.pull_feed import Room
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import annotate, context_from, headers_for, span
from crashsafe.services.platform.tracing import current as current_trace
from crashsafe.services.providers.provider_calls import Providers

SERVICE = "projector"  # its dead letters: `<ns>.dead.projector`
# Deliveries one worker handles at once (one pull batch); a second replica shares the rest.
CONCURRENCY = 64
# Audit records per request: a journal of thousands of events goes in bounded bodies.
AUDIT_CHUNK = 200
# Runs this replica saw end, so a later event of one (a late outcome) plans it again without a journal read for
# every event of every run; bounded, and only an optimisation: the reconciler finds what a replica forgot.
ENDED_MEMORY = 100_000
# Deliveries of a message whose handler raised a bug before it is dead-lettered (a receiver's outage is not a
# bug: that is the retry policy's, in the receipt).
HANDLER_ATTEMPTS = 5
# How often a receipt is written again after compare-and-set clashes before the task is retried instead.
_SAVE_ATTEMPTS = 5


class Undeliverable(CrashsafeError):
    """A task that can never be delivered as it stands (its journal is shorter than it says, or corrupt)."""

    code = ErrorCode.POISON_MESSAGE

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key

    def details(self) -> dict[str, Any]:
        return {"key": self.key}


@dataclass(frozen=True, slots=True)
class _NoAgent:
    """A journal naming an agent this deployment no longer runs: its audit trail is still delivered."""

    name: str

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        return ()


class Claims:
    """Handlers for one consumer's pulled messages, run concurrently (bounded); each message's claim (its ack
    wait) is renewed with in-progress acks for as long as its handler runs, so a slow receiver never lets it go
    to another worker. The handler settles the message itself (ack, nak with a delay, term). One that raises a
    bug is tried again a few times (nak) and then dead-lettered: never a crash loop, never a message that
    circles for hours."""

    def __init__(
        self,
        logger: logging.Logger,
        heartbeat_s: float,
        give_up: Callable[[Msg, str], Awaitable[None]],
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.logger = logger
        self.heartbeat_s = heartbeat_s
        self.give_up = give_up
        # Reserved by the pull feeds before they ask: a message's callback starts its handler and never waits.
        self.room = Room(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    def dispatch(self, handler: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            task = asyncio.create_task(self._run(msg, handler))
            self._tasks.add(task)
            task.add_done_callback(self._done)

        return on_message

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.room.release(1)

    async def _run(self, msg: Msg, handler: Callable[[Msg], Awaitable[None]]) -> None:
        beat = asyncio.create_task(self._heartbeat(msg))
        try:
            await handler(msg)
        except (TimeoutError, nats.errors.Error, OSError, BrokerUnavailable) as exc:
            log(
                self.logger,
                logging.WARNING,
                "could not settle message; it will be redelivered",
                subject=msg.subject,
                error=str(exc),
            )
        except Exception as exc:  # a bug, or a message no rule expected: the worker goes on
            deliveries = msg.metadata.num_delivered
            self.logger.exception(
                "projector handler failed",
                extra={"fields": {"subject": msg.subject, "deliveries": deliveries}},
            )
            try:
                if deliveries >= HANDLER_ATTEMPTS:
                    await self.give_up(msg, f"{type(exc).__name__}: {exc}")
                else:
                    await msg.nak(delay=min(0.2 * 2**deliveries, 5.0))
            except (TimeoutError, nats.errors.Error, OSError, BrokerUnavailable):
                pass  # it comes back after its ack wait
        finally:
            beat.cancel()

    async def _heartbeat(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await msg.in_progress()
            except (nats.errors.Error, OSError):
                pass

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _request(task: ProjectionTask, tool: Tool, args: dict[str, Any], key: str) -> ActionRequest:
    """The providers adapter speaks action requests; a projection's is its key and arguments (no step, no
    capability: the projector's receivers are not an executor's, and only the projector publishes its tasks)."""
    now = datetime.now(UTC)
    return ActionRequest(
        run_id=task.run_id,
        step_no=0,
        tool=task.tool,
        family=tool.contract.family,
        args=args,
        key=key,
        input_hash="",
        timeout_s=tool.contract.timeout_s,
        deadline_at=now + timedelta(seconds=tool.contract.timeout_s),
        requested_at=now,
    )


# crashsafe_projections{tool,result}: each attempt's decision, counted once it is made.
_PROJECTIONS = metrics.Children(metrics.PROJECTIONS_DELIVERED)
_RESULT: dict[type, str] = {Delivered: "delivered", RetryIn: "retry", Dead: "dead"}


class Projector:
    """The planner on every run journal and a worker per projection tool, sharing one broker connection."""

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        registry: Registry,
        providers: Providers,
        logger: logging.Logger,
        *,
        concurrency: int = CONCURRENCY,
        audit_chunk: int = AUDIT_CHUNK,
        history_s: float = PLANNER_HISTORY_S,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.ns = settings.namespace
        self.registry = registry
        self.tools = registry.projections
        self.providers = providers
        self.logger = logger
        self.scale = settings.projection_time_scale
        self.audit_chunk = audit_chunk
        self.records = projections_spec(self.ns, settings.stream_replicas)
        self.heartbeat_s = max(settings.ack_wait_s / 4, 0.1)
        self.concurrency = concurrency
        self.history_s = history_s
        # One bound per consumer: a receiver that hangs holds its own worker's slots, not the planner's or
        # another receiver's.
        self._claims: list[Claims] = []
        self._subscriptions: list[Subscription] = []
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[None]] = {}

    async def start(self) -> None:
        kinds = (StreamKind.RUNS, StreamKind.PROJECTIONS, StreamKind.OPS, StreamKind.DEAD_LETTERS)
        await require(self.broker, [self.ns.stream(k) for k in kinds] + [self.records.stream])
        planner = projector_planner_consumer(self.ns, self.settings.ack_wait_s, self.history_s)
        await self.broker.ensure_consumer(planner)
        for name, tool in sorted(self.tools.items()):
            spec = projection_consumer(self.ns, name, self.settings.ack_wait_s)
            await self.broker.ensure_consumer(spec)
            handler = self._worker(tool)
            self._subscriptions.append(await self._subscribe(spec, handler))
        self._subscriptions.append(await self._subscribe(planner, self._on_run_event))
        log(self.logger, logging.INFO, "projector ready", tools=sorted(self.tools))

    def ops_checks(self) -> dict[str, probes.Check]:
        """Readiness: NATS, its streams and the receipts bucket, the planner's and every worker's durable."""
        kinds = (StreamKind.RUNS, StreamKind.PROJECTIONS, StreamKind.OPS, StreamKind.DEAD_LETTERS)
        return {
            **probes.basic_checks(self.broker, [self.ns.stream(k) for k in kinds], [self.records]),
            **probes.consumer_checks(self.broker, [self._planner(), *self._workers().values()]),
        }

    def ops_samplers(self) -> list[probes.Sampler]:
        workers = self._workers()
        backlog = {tool: metrics.PROJECTION_BACKLOG.labels(tool) for tool in workers}

        async def sample_backlog() -> None:
            # A worker's num_pending: tasks planned and not yet handed to any delivery.
            for tool, spec in workers.items():
                pending = await self.broker.consumer_pending(spec.stream, spec.durable)
                if pending is not None:
                    backlog[tool].set(pending)

        lag = probes.lag_sampler(self.broker, lambda: [self._planner(), *workers.values()])
        return [sample_backlog, lag]

    def _planner(self) -> ConsumerSpec:
        return projector_planner_consumer(self.ns, self.settings.ack_wait_s, self.history_s)

    def _workers(self) -> dict[str, ConsumerSpec]:
        return {
            name: projection_consumer(self.ns, name, self.settings.ack_wait_s) for name in sorted(self.tools)
        }

    async def close(self) -> None:
        for subscription in self._subscriptions:
            await self.broker.unsubscribe(subscription)
        self._subscriptions.clear()
        for claims in self._claims:
            await claims.drain()

    async def _subscribe(self, spec: ConsumerSpec, handler: Callable[[Msg], Awaitable[None]]) -> Subscription:
        """Pull `spec` into its own bounded claims, asking only for as many messages as it has room for."""

        async def give_up(msg: Msg, reason: str) -> None:
            await self._dead_letter(msg, reason, ErrorCode.HANDLER_FAILED)

        claims = Claims(self.logger, self.heartbeat_s, give_up, self.concurrency)
        self._claims.append(claims)
        return await self.broker.subscribe(spec, claims.dispatch(handler), room=claims.room)

    # Planning -----------------------------------------------------------------------------------------------

    async def _on_run_event(self, msg: Msg) -> None:
        # The run is the one whose subject it is (a literal token, by the consumer's filter), whatever the body
        # claims: a body naming another run must not make this event plan that one.
        run_id = msg.subject.rsplit(".", 1)[-1]
        try:
            event_type, _ = envelope_of(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._dead_letter(msg, f"a run event that does not decode: {exc}", ErrorCode.POISON_MESSAGE)
            return
        after_end = bool(msg.headers and msg.headers.get(Header.RUN_ENDED))
        which = trigger(event_type, run_id in self._ended, after_end)
        if which is None:
            await msg.ack()
            return
        try:
            planned = await self.plan_run(run_id, which, context_from(msg.headers))
        except Undeliverable as exc:
            await self._dead_letter(msg, exc.message, exc.code, {"run_id": run_id[:200]})
            return
        if planned:
            crash_point("projector.after_plan_publish")
        await msg.ack()

    async def plan_run(self, run_id: str, which: Trigger = Trigger.ALL, ctx: Context | None = None) -> int:
        """Read the run's journal, fold it, publish the tasks it calls for (`Nats-Msg-Id` = the task's key: a
        second plan within the duplicate window is dropped by the stream, after it by the receipt). Returns how
        many were published; raises Undeliverable for a journal that does not fold. `ctx`: the trace of the run
        event that triggered the plan, carried on each task, so its delivery joins the run's trace."""
        stored = await self.broker.read_subject(self.ns.stream(StreamKind.RUNS), self.ns.run_events(run_id))
        try:
            state = replay(decode_event(m.data) for m in stored)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise Undeliverable(f"run {run_id}'s journal does not fold: {exc}", key=run_id) from None
        if state is None:
            return 0
        if state.run_id != run_id:
            raise Undeliverable(
                f"the journal on run {run_id}'s subject opens run {state.run_id[:64]!r}", key=run_id
            )
        if state.outcome is not None:
            self._remember_ended(run_id)
        try:
            agent: Any = self.registry.agent(state.agent)
        except UnknownAgent:
            agent = _NoAgent(state.agent)
        try:
            tasks = plan(state, len(stored), agent, self.tools, datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 -- a journal no rule expected (a hostile event) must not wedge the planner
            raise Undeliverable(
                f"run {run_id}'s projections cannot be planned: {exc!r}", key=run_id
            ) from None
        if which is Trigger.AUDIT:
            tasks = [t for t in tasks if t.tool == AUDIT_TRAIL_TOOL]
        headers = headers_for(ctx) if ctx is not None else None
        for task in tasks:
            await self.broker.publish(
                self.ns.projection(task.tool, run_id),
                task_encoder.encode(task),
                msg_id=task.key,
                headers=headers,
            )
        if tasks:
            log(self.logger, logging.DEBUG, "planned", run_id=run_id, keys=[t.key for t in tasks])
        return len(tasks)

    def _remember_ended(self, run_id: str) -> None:
        self._ended[run_id] = None
        self._ended.move_to_end(run_id)
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    # Delivery -----------------------------------------------------------------------------------------------

    def _worker(self, tool: Tool) -> Callable[[Msg], Awaitable[None]]:
        async def on_task(msg: Msg) -> None:
            try:
                task = task_decoder.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await self._dead_letter(
                    msg, f"a projection task that does not decode: {exc}", ErrorCode.POISON_MESSAGE
                )
                return
            try:
                self.ns.run_events(task.run_id)  # a run id that is no subject token names no journal
            except ValueError:
                await self._dead_letter(
                    msg, f"task names no run: {task.run_id[:64]!r}", ErrorCode.POISON_MESSAGE
                )
                return
            if task.tool != tool.name:
                reason = f"task for {task.tool[:64]!r} on {tool.name}'s subject"
                await self._dead_letter(msg, reason, ErrorCode.POISON_MESSAGE, {"key": task.key[:200]})
                return
            # One key is never delivered twice at once by this replica (a task published twice).
            while (running := self._inflight.get(task.key)) is not None:
                await running
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._inflight[task.key] = done
            try:
                # The receivers' calls inside are `provider.call` spans under this one (the task's current span).
                with span(
                    SpanName.PROJECTION_DELIVERY,
                    context_from(msg.headers),
                    run_id=task.run_id,
                    idempotency_key=task.key,
                    tool=task.tool,
                    attempt=msg.metadata.num_delivered,
                ):
                    await self._deliver(msg, task, tool)
            finally:
                self._inflight.pop(task.key, None)
                done.set_result(None)

        return on_task

    async def _deliver(self, msg: Msg, task: ProjectionTask, tool: Tool) -> None:
        assert tool.projection is not None
        record_key = self.ns.projection_record_key(task.tool, task.key)
        entry = await self.broker.kv_get(self.records, record_key)
        record = _decoded(entry.value) if entry is not None else None
        if record is not None and record.status is ProjectionStatus.DELIVERED:
            await msg.ack()  # planned again, or redelivered after its receipt: the receiver has it
            return
        if (
            record is not None
            and record.status is ProjectionStatus.DEAD
            and task.planned_at <= record.updated_at
        ):
            await msg.ack()  # the same plan, dead already (a redelivery after the dead letter): stays dead
            return
        pending = record if record is not None and record.status is ProjectionStatus.PENDING else None
        if (
            pending is not None
            and msg.metadata.num_delivered == 1
            and pending.next_attempt_at is not None
            and pending.next_attempt_at > datetime.now(UTC)
        ):
            # A fresh copy (planned again, published twice) of a task whose next attempt is already scheduled:
            # that message carries on; two would double the attempts on a receiver that is struggling. Should the
            # scheduled one be lost, the receipt goes stale and the reconciler publishes it again.
            await msg.ack()
            return
        attempt = max(msg.metadata.num_delivered, pending.attempts + 1 if pending else 1)
        planned_at = min(task.planned_at, pending.planned_at) if pending else task.planned_at
        revision = entry.revision if entry is not None else 0
        # The audit trail's records are read from the journal at delivery; any other task carries its arguments.
        missing = [] if task.tool == AUDIT_TRAIL_TOOL else tool.missing(task.args)
        answer: ProviderAnswer
        decision: Decision
        if missing:
            answer = ProviderAnswer(Answer.REJECTED, {}, detail=f"no {', '.join(missing)}")
            decision = Dead(ErrorCode.INVALID_TOOL_ARGUMENTS.value, f"{task.tool} needs {', '.join(missing)}")
        else:
            try:
                answer = await self._attempt(task, tool, attempt)
            except Undeliverable as exc:
                answer = ProviderAnswer(Answer.REJECTED, {}, detail=exc.message)
                decision = Dead(exc.code.value, exc.message)
            else:
                if answer.kind in (Answer.OK, Answer.FOUND):
                    crash_point("projector.after_provider_call")
                decision = after_attempt(
                    tool.projection,
                    attempt,
                    answer.kind,
                    planned_at,
                    datetime.now(UTC),
                    answer.retry_after_s,
                    self.scale,
                    answer.detail,
                )
        now = datetime.now(UTC)
        base = ProjectionRecord(
            tool=task.tool,
            key=task.key,
            run_id=task.run_id,
            status=ProjectionStatus.PENDING,
            attempts=attempt,
            planned_at=planned_at,
            updated_at=now,
            provider_ref=answer.ref,
            detail=answer.detail[:500],
        )
        annotate(current_trace(), outcome=type(decision).__name__.lower())
        _PROJECTIONS(task.tool, _RESULT[type(decision)]).inc()
        match decision:
            case Delivered():
                await self._save(
                    record_key,
                    msgspec.structs.replace(base, status=ProjectionStatus.DELIVERED, detail=""),
                    revision,
                )
                crash_point("projector.before_ack")
                await msg.ack()
                log(self.logger, logging.INFO, "delivered", tool=task.tool, key=task.key, attempts=attempt)
            case RetryIn(delay_s=delay_s):
                later = msgspec.structs.replace(base, next_attempt_at=now + timedelta(seconds=delay_s))
                if await self._save(record_key, later, revision):
                    await msg.nak(delay=delay_s)
                else:
                    await msg.ack()  # another delivery of the key got it there meanwhile
                log(
                    self.logger,
                    logging.WARNING,
                    "projection not delivered; retrying",
                    tool=task.tool,
                    key=task.key,
                    attempt=attempt,
                    delay_s=round(delay_s, 3),
                    detail=answer.detail,
                )
            case Dead(code=code, reason=reason):
                current = await self.broker.kv_get(self.records, record_key)
                theirs = _decoded(current.value) if current is not None else None
                if theirs is not None and theirs.status is ProjectionStatus.DELIVERED:
                    await msg.ack()  # another delivery of the key got it there meanwhile: no alarm to raise
                    return
                # Evidence first: a crash after it and before the receipt dead-letters it again (never none).
                details = {"key": task.key[:200], "tool": task.tool, "attempts": attempt}
                await self._dead_letter(
                    msg, reason, code, details, settle=False, msg_id=f"dead:{record_key}:{attempt}"
                )
                failed = ProjectionFailed(
                    tool=task.tool,
                    key=task.key,
                    run_id=task.run_id,
                    tenant=task.tenant,
                    attempts=attempt,
                    code=code,
                    reason=reason,
                    planned_at=planned_at,
                    at=now,
                )
                await self.broker.publish(
                    self.ns.ops("projection_failed", task.tool),
                    task_encoder.encode(failed),
                    msg_id=f"failed:{record_key}:{attempt}",
                )
                await self._save(
                    record_key,
                    msgspec.structs.replace(base, status=ProjectionStatus.DEAD, detail=reason[:500]),
                    revision,
                )
                await msg.term()

    async def _attempt(self, task: ProjectionTask, tool: Tool, attempt: int) -> ProviderAnswer:
        """One attempt: the audit trail's records in ranges; any other tool asked by key first (attempt > 1, where
        it has a lookup), then called with the task's key. The receiver deduplicates either way."""
        timeout = tool.contract.timeout_s
        if task.tool == AUDIT_TRAIL_TOOL:
            return await self._audit(task, tool, timeout)
        operation = tool.operation
        if attempt > 1 and isinstance(operation, HttpOperation) and operation.lookup_path is not None:
            found = await self.providers.lookup(tool, task.key, timeout, task.args)
            if found.kind in (Answer.FOUND, Answer.REJECTED):
                return found
        return await self.providers.call(tool, _request(task, tool, task.args, task.key), timeout)

    async def _audit(self, task: ProjectionTask, tool: Tool, timeout: float) -> ProviderAnswer:
        stored: list[StoredMessage] = await self.broker.read_subject(
            self.ns.stream(StreamKind.RUNS), self.ns.run_events(task.run_id)
        )
        if len(stored) < task.upto or task.upto < 1:
            raise Undeliverable(
                f"run {task.run_id}'s journal has {len(stored)} events, the task names 1..{task.upto}",
                key=task.key,
            )
        try:
            records = audit_records([m.data for m in stored], task.upto, task.tenant, task.run_id)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise Undeliverable(f"run {task.run_id}'s journal does not decode: {exc}", key=task.key) from None
        accepted = duplicates = 0
        for first, last, part in chunks(records, self.audit_chunk):
            key = f"{task.key}:{first}-{last}"
            answer = await self.providers.call(tool, _request(task, tool, {"records": part}, key), timeout)
            if answer.kind != Answer.OK:
                return answer
            accepted += int(answer.body.get("accepted", 0) or 0)
            duplicates += int(answer.body.get("duplicates", 0) or 0)
        return ProviderAnswer(
            Answer.OK, {}, detail=f"{len(records)} records: {accepted} accepted, {duplicates} duplicates"
        )

    async def _save(self, record_key: str, record: ProjectionRecord, revision: int) -> bool:
        """Write the receipt by compare-and-set; never over a delivered one (another replica's). False: a
        delivered receipt is there already (ours is not written). A clash is read again and the write is
        compared against what was read, so a delivered receipt written in between is never overwritten."""
        value = task_encoder.encode(record)
        for _ in range(_SAVE_ATTEMPTS):
            try:
                await self.broker.kv_write(self.records, record_key, value, revision=revision)
                return True
            except LeaseConflict:
                pass
            current = await self.broker.kv_get(self.records, record_key)
            theirs = _decoded(current.value) if current is not None else None
            if (
                theirs is not None
                and theirs.status is ProjectionStatus.DELIVERED
                and record.status is not ProjectionStatus.DELIVERED
            ):
                return False
            revision = current.revision if current is not None else 0
        raise BrokerUnavailable(
            f"projection receipt {record_key} kept changing under {_SAVE_ATTEMPTS} writes; the task is retried",
            subject=self.ns.projections_bucket,
        )

    async def _dead_letter(
        self,
        msg: Msg,
        reason: str,
        code: str | ErrorCode,
        details: dict[str, Any] | None = None,
        *,
        settle: bool = True,
        msg_id: str | None = None,
    ) -> None:
        letter = DeadLetter(
            service=SERVICE,
            subject=msg.subject,
            stream_seq=msg.metadata.sequence.stream,
            deliveries=msg.metadata.num_delivered,
            reason=reason,
            code=str(code.value if isinstance(code, ErrorCode) else code),
            payload=msg.data.decode("utf-8", "replace")[:8192],
            at=datetime.now(UTC),
            details=details or {},
        )
        await self.broker.publish(
            self.ns.dead_letters(SERVICE), dead_letter_encoder.encode(letter), msg_id=msg_id
        )
        metrics.DEAD_LETTERS.labels(SERVICE, letter.code).inc()
        log(self.logger, logging.ERROR, "dead-lettered", subject=msg.subject, reason=reason, code=letter.code)
        if settle:
            await msg.term()


def _decoded(value: bytes) -> ProjectionRecord | None:
    try:
        return record_decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # an unreadable receipt is no receipt: deliver again (the receiver deduplicates)
