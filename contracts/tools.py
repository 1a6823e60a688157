"""Tool contracts as data: what a tool changes, how long it may take, how it may be retried, how it is keyed."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec


class Effect(StrEnum):
    READ = "read"  # no side effect; safe to repeat
    WRITE = "write"  # changes the world; keyed; a timeout is an unknown outcome
    MONEY = "money"  # moves money; keyed; never retried blind


class RetryRule(StrEnum):
    RETRY = "retry"  # retry with backoff up to max_attempts
    KEYED = "keyed"  # retry only with the same key, after a status check says the provider never saw it
    NEVER_BLIND = "never_blind"  # as KEYED; an unresolvable outcome goes to reconciliation, never a retry


class KeyRule(StrEnum):
    NONE = "none"
    RUN_STEP = "run_id:step_no"


class ToolContract(msgspec.Struct, frozen=True, kw_only=True):
    """One registry entry; the executor enforces it, the model only ever sees name, description and parameters."""

    name: str
    family: str
    effect: Effect
    timeout_s: float
    retry: RetryRule
    max_attempts: int = 1
    key_rule: KeyRule = KeyRule.RUN_STEP
    compensation: str | None = None
    description: str = ""
    parameters: dict[str, Any] = {}

    @property
    def keyed(self) -> bool:
        return self.key_rule is not KeyRule.NONE
