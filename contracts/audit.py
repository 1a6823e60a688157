"""What `crashsafe audit` reports: a journaled intent as the audit sees it, and each disagreement it finds."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from crashsafe.contracts.run_events import ActionCompleted, ActionRequested
from crashsafe.contracts.tool_messages import OutcomeStatus


class FindingKind(StrEnum):
    """The audit's own findings; an agent's audit rules add kinds of their own (a reservation charged twice)."""

    EFFECT_WITHOUT_INTENT = "effect_without_intent"
    DUPLICATE_EFFECT = "duplicate_effect"
    SUCCESS_WITHOUT_EFFECT = "success_without_effect"
    EFFECT_NOT_JOURNALED = "effect_not_journaled"
    # A run of one tenant acted on (or was shown) what was made for another tenant's guest.
    OTHER_TENANTS_GUEST = "other_tenants_guest"


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    key: str
    run_id: str
    detail: str


@dataclass(frozen=True, slots=True)
class Intent:
    """One keyed action a run journaled, with its receipt if one was journaled."""

    run_id: str
    request: ActionRequested
    completed: ActionCompleted | None
    run_terminal: bool
    tenant: str = ""  # the tenant whose run journaled it (its run.started's)

    @property
    def succeeded(self) -> bool:
        return self.completed is not None and self.completed.status == OutcomeStatus.SUCCEEDED


@dataclass(frozen=True, slots=True)
class ProviderEffect:
    """One effect a provider holds, as its listing names it (the sandbox's ledger; a real provider's list API)."""

    kind: str
    key: str
    ref: str | None = None
