"""The runtime's side of approvals: the record of a held action and its expiry timer (I/O around core.approvals)."""

from __future__ import annotations

from datetime import UTC, datetime

from opentelemetry.context import Context

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.run_events import ApprovalDecided, ApprovalRequested
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.approval_flow import decide, decided_event, expired, new_record
from crashsafe.domain.decide import DecideApproval
from crashsafe.domain.run_state import RunState
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.approval_records import ApprovalRecords


def utcnow() -> datetime:
    return datetime.now(UTC)


class ApprovalDesk:
    """Without a broker (unit tests of the runtime shell), nothing is ever decided: runs wait."""

    def __init__(self, broker: Broker | None = None, ns: Namespace | None = None) -> None:
        self.records = ApprovalRecords(broker, ns) if broker is not None and ns is not None else None

    async def wait(
        self, state: RunState, approval: ApprovalRequested, ctx: Context
    ) -> ApprovalDecided | None:
        """Make sure the approval's record and expiry timer exist; the decision to journal if it has one (a
        pending record past its expiry is moved to expired first). None: the run waits, holding nothing."""
        if self.records is None:
            return None
        stored = await self.records.create(new_record(state, approval))
        now = utcnow()
        if stored.record.status == ApprovalStatus.PENDING:
            if now < stored.record.expires_at:
                await self.records.ensure_timer(stored.record)
                return None
            moved, _ = await self.records.move(approval.approval_id, lambda r: expired(r, utcnow()))
            if moved is None:
                return None
            stored = moved
        await self.records.cancel_timer(approval.approval_id)
        return decided_event(stored.record, approval, now)

    async def decide(self, state: RunState, move: DecideApproval, ctx: Context) -> ApprovalDecided:
        """Decide the record once (compare-and-set) and return what it then says: a manager or the expiry may
        have decided it first, and that is what the run journals."""
        if self.records is None:
            raise RuntimeError("an approval desk without a broker cannot decide")
        approval = move.approval
        await self.records.create(new_record(state, approval))

        moved, _ = await self.records.move(
            approval.approval_id,
            lambda r: (
                decide(r, move.decision, move.decided_by, move.reason, utcnow()) or expired(r, utcnow())
            ),
        )
        assert moved is not None  # created just above; records are never deleted
        await self.records.cancel_timer(approval.approval_id)
        event = decided_event(moved.record, approval, utcnow(), move.turn_event_id)
        assert event is not None  # moved from pending, or already decided
        return event
