"""The business identity of an action: which idempotency key a planned call takes, and when a new attempt at
the same intent needs a person's decision instead of the model's. Pure: everything comes from the journal.

A tool keyed `KeyRule.BUSINESS` is keyed by what it does, not by when it was asked (`keys.business_key`): the
same room held in two answers, a confirmation sent three times, a hold asked again by the session's next run,
all name one key, and the executor's store answers the repeats with the first receipt. Two things make a
deliberate new attempt at the same intent (`:a2`, `:a3`, ...), both read from this run's journal:

- the effect of the current attempt was undone (its compensation succeeded: a released hold): the intent may
  be acted on again, and answering it with the stale receipt would hand the guest a hold that is gone;
- a money action failed definitively (a declined charge) and the guest approved a retry
  (`run.approval_decided` approved, for a `RETRY_RULE` request, of exactly this prepared input). Until then the
  model asking again is held for the guest's approval: a new charge is never the model's decision.

Across runs the executor's store is the memory: a later run asking for a hold an earlier run released is
answered `action_undone` (failed, no effect: the executor holds the release next to the hold, `keys.partition_key`)
instead of the released hold's receipt, and its next ask is attempt 2. A charge declined in an earlier run
is answered, in a later run, by its stored failed receipt; asking again after that is held for approval as
above. Limits: docs/architecture.md, "Keys"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.keys import KeyScheme, business_key
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import Origin
from crashsafe.contracts.tool_messages import OutcomeStatus, first_made_by
from crashsafe.contracts.tools import Effect, KeyRule, ToolContract
from crashsafe.domain.policy_verdicts import Allow, Hold
from crashsafe.domain.run_state import RunState

# The rule a held retry names (`run.approval_requested.rule`): counted by `attempt_of` once approved.
RETRY_RULE = "retry_after_failure"
RETRY_TTL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Keyed:
    """The key a planned call takes, and what the identity check says about acting on it now."""

    key: str
    verdict: Allow | Hold


def identity_of(state: RunState, contract: ToolContract, prepared: dict[str, Any]) -> dict[str, Any] | None:
    """The values that name this action's business identity, or None when the tool has none (or the prepared
    arguments lack one of its fields: then it is keyed by step, never by a guess)."""
    if contract.key_rule is not KeyRule.BUSINESS or not contract.identity_kind or not contract.identity:
        return None
    values: dict[str, Any] = {}
    for name in contract.identity:
        value = prepared.get(name)
        if value is None or value == "":
            return None
        values[name] = value
    return values | dict(contract.identity_fixed)


def _completed(state: RunState, key: str) -> list[OutcomeStatus]:
    return [done.status for req, done in state.completed if req.key == key]


def _undone(state: RunState, key: str) -> bool:
    """A compensation of this key succeeded (`compensation_key(key, kind)`), here or, as the executor answered
    a replay (`action_undone`), in another run: its effect no longer exists."""
    if any(
        req.key == key and done.error is not None and done.error.code == ErrorCode.ACTION_UNDONE
        for req, done in state.completed
    ):
        return True
    prefix = key + ":"
    return any(
        req.origin == Origin.COMPENSATION
        and req.key.startswith(prefix)
        and ":" not in req.key.removeprefix(prefix)
        and done.status == OutcomeStatus.SUCCEEDED
        for req, done in state.completed
    )


def handed_by_another_run(state: RunState, key: str) -> bool:
    """This run holds the key's effect only as another run's stored receipt (the session's earlier run made and
    paid the hold; this run asked for the same room): that run made it, and only it may undo it. Undoing it
    here would release a hold another run paid for."""
    made = [
        done for req, done in state.completed if req.key == key and done.status == OutcomeStatus.SUCCEEDED
    ]
    return bool(made) and all(first_made_by(done.evidence) not in (None, state.run_id) for done in made)


def approved_retries(state: RunState, input_hash: str) -> int:
    """Retries of exactly this prepared input the guest approved in this run."""
    held = {
        r.approval_id for r in state.approval_requests if r.rule == RETRY_RULE and r.input_hash == input_hash
    }
    return sum(
        1
        for d in state.approvals
        if d.approval_id in held and d.decision == ApprovalStatus.APPROVED and d.input_hash == input_hash
    )


def attempt_of(
    state: RunState, contract: ToolContract, kind: str, tenant: str, values: dict[str, Any], input_hash: str
) -> int:
    """The attempt a new ask for this identity is: past every undone attempt, and past every approved retry."""
    attempt = 1 + (approved_retries(state, input_hash) if contract.effect is Effect.MONEY else 0)
    while _undone(state, business_key(kind, tenant, values, attempt)):
        attempt += 1
    return attempt


def choose_key(
    state: RunState, contract: ToolContract, prepared: dict[str, Any], input_hash: str, step_key: str
) -> Keyed:
    """The key for a call the model (or a plan) asks for; `step_key` (`run_id:step_no`) if the tool has no
    business identity. A money action whose current attempt failed definitively is held for the guest."""
    if state.started.key_scheme != KeyScheme.BUSINESS:
        return Keyed(step_key, Allow())  # a run journaled before business keys keeps its step keys
    values = identity_of(state, contract, prepared)
    if values is None:
        return Keyed(step_key, Allow())
    kind, tenant = contract.identity_kind, state.started.tenant
    attempt = attempt_of(state, contract, kind, tenant, values, input_hash)
    key = business_key(kind, tenant, values, attempt)
    if contract.effect is Effect.MONEY and OutcomeStatus.FAILED in _completed(state, key):
        amount = prepared.get("amount_cents")
        return Keyed(
            key,
            Hold(
                rule=RETRY_RULE,
                reason=f"{contract.name} for this {kind} already failed (key {key}); trying again needs the guest",
                approver=Approver.GUEST.value,
                ttl_s=RETRY_TTL_S,
                amount_cents=amount if isinstance(amount, int) else None,
                currency=str(prepared.get("currency", "")),
                question=f"The last {contract.name} attempt failed. Shall I try it once more?",
            ),
        )
    return Keyed(key, Allow())
