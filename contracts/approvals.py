"""Approvals as records: one per held-back action, decided exactly once (KV compare-and-set), read by everyone."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import msgspec


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class ApprovalRecord(msgspec.Struct, frozen=True, kw_only=True):
    """`<ns>_approvals`, key `approval.<approval_id>`: created by the runtime when a rule holds an action back,
    moved from `pending` exactly once (by a manager, the guest's confirmation, or the expiry timer)."""

    approval_id: str
    run_id: str
    tenant: str
    guest_id: str
    session_id: str
    tool: str
    args: dict[str, Any]
    input_hash: str
    amount_cents: int | None = None
    currency: str = ""
    approver: str  # an Approver
    rule: str
    reason: str
    requested_at: datetime
    expires_at: datetime
    status: str = ApprovalStatus.PENDING.value
    decided_by: str = ""
    decided_at: datetime | None = None
    decision_reason: str = ""


Approver_ = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Reason = Annotated[str, msgspec.Meta(max_length=1000)]


class ApprovalDecisionBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of `POST /v1/approvals/{id}`."""

    decision: Annotated[str, msgspec.Meta(pattern="^(approve|reject)$")]
    approver: Approver_
    reason: Reason = ""
