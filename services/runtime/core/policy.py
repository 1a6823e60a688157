"""The policy engine: an agent's rules (data, from the pinned catalog) checked against an action before it is
journaled as requested, purely from the run's journal. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contracts.catalog import AgentConfig
from contracts.run_events import Origin
from contracts.tools import ToolContract
from services.runtime.core.state import RunState


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Deny:
    """Journaled as `run.policy_denied`; the model is told `not_allowed`, nothing reaches an executor."""

    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Hold:
    """The action waits for `approver`'s approval of exactly these prepared arguments (`run.approval_requested`)."""

    rule: str
    reason: str
    approver: str
    ttl_s: float
    amount_cents: int | None = None
    currency: str = ""
    question: str = ""


Verdict = Allow | Deny | Hold


def check_policy(
    state: RunState,
    config: AgentConfig,
    contract: ToolContract,
    args: dict[str, Any],
    input_hash: str,
    origin: Origin,
    now: datetime,
) -> Verdict:
    """What the rules say about one prepared action. Compensations are never held back."""
    return Allow()
