"""How long the server keeps each run-scoped record after a write (its per-message TTL), pure: a record's TTL starts
where its last reader's need ends, so no TTL ever removes a record still in use. None: no TTL (kept forever)."""

from __future__ import annotations

import math
from datetime import datetime

from crashsafe.contracts.active import ActiveRuns
from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus


def _after(until: datetime | None, now: datetime, retention_s: int) -> int | None:
    """Whole seconds from `now` to `retention_s` past `until` (past `now` if `until` is gone or None)."""
    if retention_s <= 0:
        return None
    left = max((until - now).total_seconds(), 0.0) if until is not None else 0.0
    return math.ceil(left) + retention_s


def active_ttl(record: ActiveRuns, now: datetime, retention_s: int) -> int | None:
    """An active-runs record is kept `retention_s` past the latest deadline it holds: an entry still counting a
    run is never expired under the gateway's cap (an emptied record goes `retention_s` after its last write)."""
    latest = max(record.runs.values(), default=None)
    return _after(latest, now, retention_s)


def approval_ttl(record: ApprovalRecord, now: datetime, retention_s: int) -> int | None:
    """A pending approval is kept `retention_s` past its expiry (its timer or the reconciler moves it by then); a
    decided or expired one `retention_s` past this write, its decision (the run journals what it says)."""
    pending = record.status == ApprovalStatus.PENDING
    return _after(record.expires_at if pending else None, now, retention_s)


def kept_ttl(retention_s: int) -> int | None:
    """A record whose readers need it a fixed time after its last write (a session lane, a receipt, a mark)."""
    return retention_s if retention_s > 0 else None
