"""Approval records in `<ns>_approvals` and their expiry schedules in `<NS>_TIMERS`: read by everyone, created by the
runtime, moved from pending exactly once by compare-and-set on the record's KV revision (the gateway for a
manager, the runtime for the guest's answer and the expiry). The pure rules are services/runtime/core/approvals.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from contracts.approvals import ApprovalRecord
from contracts.errors import CrashsafeError, LeaseConflict
from contracts.streams import approvals_spec
from contracts.subjects import Header, Namespace, StreamKind
from contracts.tool_messages import RunWake, tool_encoder
from services.platform.jetstream import Broker

record_encoder = msgspec.json.Encoder()
record_decoder = msgspec.json.Decoder(ApprovalRecord)
MAX_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Stored:
    record: ApprovalRecord
    revision: int


class ApprovalRecords:
    def __init__(self, broker: Broker, ns: Namespace) -> None:
        self.broker = broker
        self.ns = ns
        self.spec = approvals_spec(ns)

    async def get(self, approval_id: str) -> Stored | None:
        entry = await self.broker.kv_get(self.spec, self.ns.approval_key(approval_id))
        if entry is None or not entry.value:
            return None
        return Stored(record_decoder.decode(entry.value), entry.revision)

    async def scan(self) -> list[ApprovalRecord]:
        entries = await self.broker.kv_scan(self.spec, self.ns.approvals_all)
        return [record_decoder.decode(e.value) for e in entries if e.value]

    async def create(self, record: ApprovalRecord) -> Stored:
        """The record as stored: created if absent (idempotent: a second create reads the first)."""
        key = self.ns.approval_key(record.approval_id)
        for _ in range(MAX_ROUNDS):
            stored = await self.get(record.approval_id)
            if stored is not None:
                return stored
            try:
                revision = await self.broker.kv_write(
                    self.spec, key, record_encoder.encode(record), revision=0
                )
                return Stored(record, revision)
            except LeaseConflict:
                continue  # created meanwhile by another replica: read it
        raise LeaseConflict(key=key, expected_revision=0)

    async def move(
        self, approval_id: str, change: Callable[[ApprovalRecord], ApprovalRecord | None]
    ) -> tuple[Stored | None, bool]:
        """Apply `change` by compare-and-set; (the record as it then is, whether this call moved it). `change`
        returns None when the record may not move (already decided): nothing is written."""
        key = self.ns.approval_key(approval_id)
        for _ in range(MAX_ROUNDS):
            stored = await self.get(approval_id)
            if stored is None:
                return None, False
            updated = change(stored.record)
            if updated is None:
                return stored, False
            try:
                revision = await self.broker.kv_write(
                    self.spec, key, record_encoder.encode(updated), revision=stored.revision
                )
                return Stored(updated, revision), True
            except LeaseConflict:
                continue  # someone decided it (or wrote it) first: read what it says now
        raise LeaseConflict(key=key, expected_revision=0)

    async def ensure_timer(self, record: ApprovalRecord) -> None:
        """The record's expiry schedule, unless it is there already: at `expires_at` the server publishes a wake
        of the run to `timer.fired.<run_id>` (and purges the schedule). Re-publishing replaces it (roll-up)."""
        subject = self.ns.approval_timer(record.approval_id)
        present = await self.broker.last_on_subject(self.ns.stream(StreamKind.TIMERS), subject)
        if present is not None and present.headers.get(Header.SCHEDULE):
            return
        wake = RunWake(
            run_id=record.run_id,
            reason=f"approval {record.approval_id} expires",
            at=record.expires_at,
            by="timer",
        )
        await self.broker.publish(
            subject,
            tool_encoder.encode(wake),
            headers={
                Header.SCHEDULE.value: f"@at {schedule_time(record.expires_at)}",
                Header.SCHEDULE_TARGET.value: self.ns.timer_fired(record.run_id),
            },
            timeout_s=5.0,
        )

    async def cancel_timer(self, approval_id: str) -> None:
        """Purge a decided approval's schedule, so it never fires a needless wake (best effort: a schedule that
        fires anyway wakes a run that finds its approval decided, and does nothing)."""
        try:
            await self.broker.publish(
                self.ns.timer_cancelled(approval_id),
                b"",
                headers={
                    Header.SCHEDULE_NEXT.value: "purge",
                    Header.SCHEDULER.value: self.ns.approval_timer(approval_id),
                },
                timeout_s=5.0,
            )
        except CrashsafeError:
            pass


def schedule_time(at: datetime) -> str:
    """RFC 3339 in whole seconds, rounded up, so the schedule never fires before the expiry it stands for."""
    at = at.astimezone(UTC)
    whole = at.replace(microsecond=0) + timedelta(seconds=math.ceil(at.microsecond / 1_000_000))
    return whole.strftime("%Y-%m-%dT%H:%M:%SZ")
