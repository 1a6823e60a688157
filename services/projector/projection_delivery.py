"""Delivering one projection task to its receiver: one attempt, its receipt durable in KV, then its message settled.

Every handler here settles its own message (the delivery loop's `settles_itself`): a retry is a nak with the
projection's own delay, a dead task is dead-lettered with its receipt written before the message is termed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import msgspec
from nats.aio.msg import Msg

from crashsafe.contracts.errors import NOT_SENT, BrokerUnavailable, CrashsafeError, ErrorCode, LeaseConflict
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
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.streams import KvSpec
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.domain.projection_rules import (
    Dead,
    Decision,
    Delivered,
    RetryIn,
    after_attempt,
    audit_records,
    chunks,
)
from crashsafe.domain.record_ttls import kept_ttl
from crashsafe.domain.registry import HttpOperation, ProviderAnswer, PythonOperation, Tool
from crashsafe.services.platform import metrics
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.tracing import annotate, context_from, span
from crashsafe.services.platform.tracing import current as current_trace
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.records.run_journal import RunJournal

# How often a receipt is written again after compare-and-set clashes before the task is retried instead.
_SAVE_ATTEMPTS = 5
# crashsafe_projections{tool,result}: each attempt's decision, counted once it is made.
_PROJECTIONS = metrics.Children(metrics.PROJECTIONS_DELIVERED)
_RESULT: dict[type, str] = {Delivered: "delivered", RetryIn: "retry", Dead: "dead"}


class Undeliverable(CrashsafeError):
    """A task that can never be delivered as it stands (its journal is shorter than it says, or corrupt)."""

    code = ErrorCode.POISON_MESSAGE

    message: str = field(kw_only=False, metadata=NOT_SENT)
    key: str


class GiveUp(Protocol):
    """Give up on a message: the delivery loop's `dead_letter`, bound to this service."""

    def __call__(
        self,
        msg: Msg,
        reason: str,
        code: ErrorCode | str,
        details: dict[str, Any] | None = None,
        settle: bool = True,
        msg_id: str | None = None,
    ) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One delivery's attempt, decided: what its receipt and its message's settling need."""

    msg: Msg
    task: ProjectionTask
    record_key: str
    revision: int  # the receipt's KV revision this attempt read (0: none yet)
    receipt: ProjectionRecord  # pending, as of this attempt
    detail: str  # the receiver's answer, for the log


class ProjectionDelivery:
    """The workers of every projection tool: each key delivered by one of them at a time in this replica."""

    def __init__(
        self,
        broker: Broker,
        ns: Namespace,
        records: KvSpec,
        providers: Providers,
        logger: logging.Logger,
        dead_letter: GiveUp,
        *,
        time_scale: float,
        audit_chunk: int,
    ) -> None:
        self.broker = broker
        self.ns = ns
        self.records = records
        self.providers = providers
        self.logger = logger
        self.dead_letter = dead_letter
        self.scale = time_scale
        self.audit_chunk = audit_chunk
        self._inflight: dict[str, asyncio.Future[None]] = {}

    def worker(self, tool: Tool) -> Callable[[Msg], Awaitable[None]]:
        """The handler of `tool`'s tasks: a task that cannot be this tool's is dead-lettered unread."""

        async def on_task(msg: Msg) -> None:
            try:
                task = task_decoder.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                reason = f"a projection task that does not decode: {exc}"
                await self.dead_letter(msg, reason, ErrorCode.POISON_MESSAGE)
                return
            try:
                self.ns.run_events(task.run_id)  # a run id that is no subject token names no journal
            except ValueError:
                reason = f"task names no run: {task.run_id[:64]!r}"
                await self.dead_letter(msg, reason, ErrorCode.POISON_MESSAGE)
                return
            if task.tool != tool.name:
                reason = f"task for {task.tool[:64]!r} on {tool.name}'s subject"
                await self.dead_letter(msg, reason, ErrorCode.POISON_MESSAGE, {"key": task.key[:200]})
                return
            await self._one_at_a_time(msg, task, tool)

        return on_task

    async def _one_at_a_time(self, msg: Msg, task: ProjectionTask, tool: Tool) -> None:
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
                await self.deliver(msg, task, tool)
        finally:
            self._inflight.pop(task.key, None)
            done.set_result(None)

    async def deliver(self, msg: Msg, task: ProjectionTask, tool: Tool) -> None:
        """Settled already (acked), or one attempt decided, its receipt written and its message settled."""
        record_key = self.ns.projection_record_key(task.tool, task.key)
        entry = await self.broker.kv_get(self.records, record_key)
        record = _decoded(entry.value) if entry is not None else None
        if _nothing_to_do(record, task, msg.metadata.num_delivered, datetime.now(UTC)):
            await msg.ack()
            return
        pending = record if record is not None and record.status is ProjectionStatus.PENDING else None
        attempt = max(msg.metadata.num_delivered, pending.attempts + 1 if pending else 1)
        planned_at = min(task.planned_at, pending.planned_at) if pending else task.planned_at
        answer, decision = await self._decide(task, tool, attempt, planned_at)
        receipt = ProjectionRecord(
            tool=task.tool,
            key=task.key,
            run_id=task.run_id,
            status=ProjectionStatus.PENDING,
            attempts=attempt,
            planned_at=planned_at,
            updated_at=datetime.now(UTC),
            provider_ref=answer.ref,
            detail=answer.detail[:500],
        )
        annotate(current_trace(), outcome=type(decision).__name__.lower())
        _PROJECTIONS(task.tool, _RESULT[type(decision)]).inc()
        revision = entry.revision if entry is not None else 0
        done = _Attempt(msg, task, record_key, revision, receipt, answer.detail)
        match decision:
            case Delivered():
                await self._delivered(done)
            case RetryIn(delay_s=delay_s):
                await self._retry(done, delay_s)
            case Dead(code=code, reason=reason):
                await self._dead(done, code, reason)

    async def _decide(
        self, task: ProjectionTask, tool: Tool, attempt: int, planned_at: datetime
    ) -> tuple[ProviderAnswer, Decision]:
        """One attempt at the receiver (none for a task missing its arguments), and what the rules make of it."""
        assert tool.projection is not None
        # The audit trail's records are read from the journal at delivery; any other task carries its arguments.
        missing = [] if task.tool == AUDIT_TRAIL_TOOL else tool.missing(task.args)
        if missing:
            answer = ProviderAnswer(Answer.REJECTED, {}, detail=f"no {', '.join(missing)}")
            return answer, Dead(
                ErrorCode.INVALID_TOOL_ARGUMENTS.value, f"{task.tool} needs {', '.join(missing)}"
            )
        try:
            answer = await self._attempt(task, tool, attempt)
        except Undeliverable as exc:
            return ProviderAnswer(Answer.REJECTED, {}, detail=exc.message), Dead(exc.code.value, exc.message)
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
        return answer, decision

    async def _delivered(self, done: _Attempt) -> None:
        receipt = msgspec.structs.replace(done.receipt, status=ProjectionStatus.DELIVERED, detail="")
        await self._save(done.record_key, receipt, done.revision)
        crash_point("projector.before_ack")
        await done.msg.ack()
        task = done.task
        log(self.logger, logging.INFO, "delivered", tool=task.tool, key=task.key, attempts=receipt.attempts)

    async def _retry(self, done: _Attempt, delay_s: float) -> None:
        later = msgspec.structs.replace(
            done.receipt, next_attempt_at=done.receipt.updated_at + timedelta(seconds=delay_s)
        )
        if await self._save(done.record_key, later, done.revision):
            await done.msg.nak(delay=delay_s)
        else:
            await done.msg.ack()  # another delivery of the key got it there meanwhile
        log(
            self.logger,
            logging.WARNING,
            "projection not delivered; retrying",
            tool=done.task.tool,
            key=done.task.key,
            attempt=done.receipt.attempts,
            delay_s=round(delay_s, 3),
            detail=done.detail,
        )

    async def _dead(self, done: _Attempt, code: str, reason: str) -> None:
        task, attempt, record_key = done.task, done.receipt.attempts, done.record_key
        current = await self.broker.kv_get(self.records, record_key)
        theirs = _decoded(current.value) if current is not None else None
        if theirs is not None and theirs.status is ProjectionStatus.DELIVERED:
            await done.msg.ack()  # another delivery of the key got it there meanwhile: no alarm to raise
            return
        # Evidence first: a crash after it and before the receipt dead-letters it again (never none).
        details = {"key": task.key[:200], "tool": task.tool, "attempts": attempt}
        await self.dead_letter(
            done.msg, reason, code, details, settle=False, msg_id=f"dead:{record_key}:{attempt}"
        )
        failed = ProjectionFailed(
            tool=task.tool,
            key=task.key,
            run_id=task.run_id,
            tenant=task.tenant,
            attempts=attempt,
            code=code,
            reason=reason,
            planned_at=done.receipt.planned_at,
            at=done.receipt.updated_at,
        )
        await self.broker.publish(
            self.ns.ops("projection_failed", task.tool),
            task_encoder.encode(failed),
            msg_id=f"failed:{record_key}:{attempt}",
        )
        dead = msgspec.structs.replace(done.receipt, status=ProjectionStatus.DEAD, detail=reason[:500])
        await self._save(record_key, dead, done.revision)
        await done.msg.term()

    async def _attempt(self, task: ProjectionTask, tool: Tool, attempt: int) -> ProviderAnswer:
        """One attempt: the audit trail's records in ranges; any other tool asked by key first (attempt > 1, where
        it has a lookup), then called with the task's key. The receiver deduplicates either way."""
        timeout = tool.contract.timeout_s
        if task.tool == AUDIT_TRAIL_TOOL:
            return await self._audit(task, tool, timeout)
        asks_by_key = isinstance(tool.operation, HttpOperation | PythonOperation)
        if attempt > 1 and asks_by_key and self.providers.can_look_up(tool):
            found = await self.providers.lookup(tool, task.key, timeout, task.args)
            if found.kind in (Answer.FOUND, Answer.REJECTED):
                return found
        return await self.providers.call(tool, _request(task, tool, task.args, task.key), timeout)

    async def _audit(self, task: ProjectionTask, tool: Tool, timeout: float) -> ProviderAnswer:
        stored = await RunJournal(self.broker, self.ns).stored(task.run_id)
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
        value, ttl = task_encoder.encode(record), kept_ttl(self.broker.retention.receipts_s)
        for _ in range(_SAVE_ATTEMPTS):
            try:
                await self.broker.kv_write(self.records, record_key, value, revision=revision, ttl_s=ttl)
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


def _nothing_to_do(
    record: ProjectionRecord | None, task: ProjectionTask, deliveries: int, now: datetime
) -> bool:
    """This delivery has nothing to deliver: its receipt already says how the task ended, or already holds it."""
    if record is None:
        return False
    if record.status is ProjectionStatus.DELIVERED:
        return True  # planned again, or redelivered after its receipt: the receiver has it
    if record.status is ProjectionStatus.DEAD:
        return (
            task.planned_at <= record.updated_at
        )  # the same plan, dead already (a redelivery after its letter)
    # A fresh copy (planned again, published twice) of a task whose next attempt is already scheduled: that message
    # carries on; two would double the attempts on a receiver that is struggling. Should the scheduled one be lost,
    # the receipt goes stale and the reconciler publishes it again.
    return (
        record.status is ProjectionStatus.PENDING
        and deliveries == 1
        and record.next_attempt_at is not None
        and record.next_attempt_at > now
    )


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


def _decoded(value: bytes) -> ProjectionRecord | None:
    try:
        return record_decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # an unreadable receipt is no receipt: deliver again (the receiver deduplicates)
