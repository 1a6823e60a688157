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
    """How an action's idempotency key is chosen (docs/architecture.md, "Keys": the rule per tool and why)."""

    NONE = "none"  # a read: no effect, nothing to deduplicate
    RUN_STEP = "run_id:step_no"  # one effect per step of one run: for writes with no business identity
    # The action's business identity (`ToolContract.identity` fields of the prepared arguments, the tenant, the
    # contract's `identity_kind`): the same intent in another step or run is the same action (keys.business_key).
    BUSINESS = "business"


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
    # How long a request whose answer was unknown may still be in the provider's hands (and commit). Until it
    # has passed, a lookup saying "never saw the key" is not proof, and the key is not called again.
    # None: twice the timeout.
    in_flight_s: float | None = None
    # KeyRule.BUSINESS: what the action is (the key's first token, e.g. "hold"), the prepared arguments that
    # name its business identity, and fixed values that belong to it but are not arguments (an email's template).
    identity_kind: str = ""
    identity: tuple[str, ...] = ()
    identity_fixed: dict[str, str] = {}
    # Arguments the model gives that are kept out of the identity on purpose (a slot picked for a pet, vet and
    # day already held): asked again with another value, the key is answered `idempotency_conflict` carrying the
    # effect it already made. Any other model argument outside the identity is pointed out by
    # `crashsafe.testing.identity_gaps`.
    outside_identity: tuple[str, ...] = ()

    @property
    def keyed(self) -> bool:
        return self.key_rule is not KeyRule.NONE

    @property
    def in_flight_window_s(self) -> float:
        return self.in_flight_s if self.in_flight_s is not None else 2 * self.timeout_s
