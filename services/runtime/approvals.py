"""The runtime's side of approvals: the record of a held action and its expiry timer (I/O around core.approvals)."""

from __future__ import annotations

from contracts.run_events import ApprovalDecided, ApprovalRequested
from opentelemetry.context import Context

from services.runtime.core.decide import DecideApproval
from services.runtime.core.state import RunState


class ApprovalDesk:
    async def wait(
        self, state: RunState, approval: ApprovalRequested, ctx: Context
    ) -> ApprovalDecided | None:
        """Make sure the approval's record and expiry timer exist; the decision to journal if it has one."""
        return None

    async def decide(self, state: RunState, move: DecideApproval, ctx: Context) -> ApprovalDecided:
        """Decide the record once (compare-and-set) and return what it then says."""
        raise NotImplementedError
