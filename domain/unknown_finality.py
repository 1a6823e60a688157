"""An outcome still unknown: whether asking again could ever tell (a final one goes to the run at once), and
the outcome the run is told.

Waiting helps only when a later ask can answer differently: a lookup that gave no answer may answer later, and
an "absent" from a provider may turn into "found" once an earlier call of ours commits (the in-flight window).
A tool with no lookup, or one whose lookup only ever says "absent" (an effect in the executor's own process:
the process that made the call is gone, and nothing of it is still in flight), with its attempts spent, gives
every later delivery the same dead end: no information arrives by waiting (docs/decisions.md, "A final unknown
is told at once")."""

from __future__ import annotations

from dataclasses import dataclass

from crashsafe.contracts.errors import ErrorCode, ErrorInfo, RetryClass
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, Answer, OutcomeStatus, Via


@dataclass(frozen=True, slots=True)
class StillUnknown:
    """Even the lookup could not answer: keep the intent open and resolve later; never retry blind. `final`: no
    later ask can change the answer (`final_unknown`), so the run is told now rather than at the delivery cap."""

    detail: str
    final: bool = False


def final_unknown(
    *,
    looks_up: bool,
    lookup_informative: bool,
    lookup: str | None,
    attempts: int,
    max_attempts: int,
    retry_after: bool,
) -> bool:
    """Whether an unknown outcome is final: no later ask of the provider can change it.

    `looks_up`: the tool can be asked by key at all; `lookup_informative`: its lookup can say more than
    "absent" (a real provider's record, not a local effect's); `lookup`: the lookup's answer kind (None if none
    was asked); `retry_after`: the provider asked for time (Retry-After), so the next ask may be answered."""
    if retry_after:
        return False
    if not looks_up:
        return True  # nothing can be asked, and a keyed write whose outcome is unknown is never called blind
    if lookup_informative:
        return False  # unknown may answer later; absent may still turn into found (the in-flight window)
    return lookup == Answer.ABSENT and attempts >= max_attempts


def without_lookup(tool: str, retry_after_s: float) -> StillUnknown:
    """An unknown answer from a tool that cannot be asked by key: it stays unknown, never called again."""
    final = final_unknown(
        looks_up=False,
        lookup_informative=False,
        lookup=None,
        attempts=0,
        max_attempts=0,
        retry_after=retry_after_s > 0,
    )
    return StillUnknown(
        detail=f"{tool} has no lookup by key, and a write whose outcome is unknown is never called again",
        final=final,
    )


def unknown_outcome(request: ActionRequest, detail: str, attempts: int, deliveries: int) -> ActionOutcome:
    """What the run is told: nobody can say whether the effect exists; never a failure (the run hands off, and
    the reconciler keeps asking by key)."""
    error = ErrorInfo(
        code=ErrorCode.OUTCOME_UNKNOWN,
        message=f"could not tell whether {request.tool} with key {request.key} took effect: {detail}; reconcile by key",
        retry=RetryClass.UNKNOWN_OUTCOME,
        details={"key": request.key},
    )
    return ActionOutcome(
        run_id=request.run_id,
        step_no=request.step_no,
        tool=request.tool,
        key=request.key,
        status=OutcomeStatus.UNKNOWN,
        error=error,
        via=Via.UNRESOLVED,
        attempts=attempts,
        deliveries=deliveries,
    )
