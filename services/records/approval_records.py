"""Approval records in `<ns>_approvals` and their expiry schedules in `<NS>_TIMERS`: read by everyone, created by the
runtime, moved from pending exactly once by compare-and-set on the record's KV revision (the gateway for a
manager, the runtime for the guest's answer and the expiry). The pure rules are domain/approval_flow.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus
from crashsafe.contracts.errors import (
    ApprovalNotFound,
    ApprovalNotPending,
    CrashsafeError,
    LeaseConflict,
    UnprocessableBody,
)
from crashsafe.contracts.headers import Header
from crashsafe.contracts.run_events import RunStarted, decode_event
from crashsafe.contracts.streams import approvals_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.tool_messages import RunWake, tool_encoder
from crashsafe.domain import approval_flow as approval_rules
from crashsafe.domain.access import require_not_starter
from crashsafe.domain.record_ttls import approval_ttl
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.run_asks import wake_run
from crashsafe.services.records.run_journal import RunJournal

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
                    self.spec, key, record_encoder.encode(record), revision=0, ttl_s=self._ttl(record)
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
                    self.spec,
                    key,
                    record_encoder.encode(updated),
                    revision=stored.revision,
                    ttl_s=self._ttl(updated),
                )
                return Stored(updated, revision), True
            except LeaseConflict:
                continue  # someone decided it (or wrote it) first: read what it says now
        raise LeaseConflict(key=key, expected_revision=0)

    def _ttl(self, record: ApprovalRecord) -> int | None:
        """Kept past its expiry while pending, past its decision once decided (domain/record_ttls.py)."""
        return approval_ttl(record, datetime.now(UTC), self.broker.retention.approvals_s)

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


# A manager's decision, shared by the API (POST /v1/approvals/{id}) and the console's approvals page -------------


def shown(
    records: list[ApprovalRecord], sees: Callable[[str], bool], wanted: str | None, now: datetime
) -> list[ApprovalRecord]:
    """The records a client sees (its tenant's; an admin all), newest first, filtered by what each means now."""
    return [
        r
        for r in sorted(records, key=lambda r: r.requested_at, reverse=True)
        if sees(r.tenant) and (wanted is None or approval_rules.current_status(r, now) == wanted)
    ]


async def visible(records: ApprovalRecords, sees: Callable[[str], bool], approval_id: str) -> Stored:
    """One record, if the client sees it: another tenant's gets the answer a missing one gets."""
    if not approval_id.startswith("apr_") or len(approval_id) > 128:
        raise ApprovalNotFound(approval_id=approval_id[:64])
    try:
        stored = await records.get(approval_id)
    except ValueError:  # not a literal key token
        stored = None
    if stored is None or not sees(stored.record.tenant):
        raise ApprovalNotFound(approval_id=approval_id)
    return stored


async def started_by(broker: Broker, ns: Namespace, run_id: str) -> str:
    """The id of the client key that started the run, as its run.started says ("": not recorded, or no run)."""
    first = await RunJournal(broker, ns).first(run_id)  # an archived run's from its archive
    started = decode_event(first.data) if first is not None else None
    return started.started_by if isinstance(started, RunStarted) else ""


async def decide(
    broker: Broker,
    settings: Settings,
    sees: Callable[[str], bool],
    approval_id: str,
    decision: ApprovalStatus,
    decided_by: str,
    reason: str,
    *,
    input_hash: str | None = None,
    decider: str = "",
) -> Stored:
    """Move a pending record once (compare-and-set), then wake its run, which journals what the record says.
    Decided or expired already: ApprovalNotPending naming the status, nothing changes. `input_hash`: the action
    the decider saw (the console's form); a record bound to other arguments is refused. `decider`: the deciding
    client key's id; the key that started the run is refused (ApproverStartedRun), whatever its scopes."""
    records = ApprovalRecords(broker, settings.namespace)
    stored = await visible(records, sees, approval_id)
    if decider:
        run_id = stored.record.run_id
        require_not_starter(decider, await started_by(broker, settings.namespace, run_id), run_id)
    if input_hash is not None and input_hash != stored.record.input_hash:
        raise UnprocessableBody(
            f"approval {approval_id} is bound to another action than the one decided on; reload the page"
        )

    def change(record: ApprovalRecord) -> ApprovalRecord | None:
        now = datetime.now(UTC)
        return approval_rules.decide(
            record, decision.value, decided_by, reason, now
        ) or approval_rules.expired(record, now)

    moved, ours = await records.move(approval_id, change)
    if moved is None:
        raise ApprovalNotFound(approval_id=approval_id)
    crash_point("gateway.after_approval_decided")
    # The run journals the decision (or the expiry this call found) whoever wins: wake it either way.
    if ours or moved.record.status != ApprovalStatus.PENDING:
        await wake_run(
            broker,
            settings,
            moved.record.run_id,
            f"approval {approval_id} is {moved.record.status}",
            "gateway:approvals",
        )
    if not ours or moved.record.status != decision:
        raise ApprovalNotPending(
            approval_id=approval_id, status=moved.record.status, decided_by=moved.record.decided_by
        )
    return moved
