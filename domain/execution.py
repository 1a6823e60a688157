"""The executor's pure decisions: what to do with a request given its stored record, and what an answer means."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.tool_messages import (
    ANOTHER_REQUEST,
    FIRST_MADE_FOR,
    ActionOutcome,
    ActionRequest,
    Answer,
    Asked,
    Evidence,
    OutcomeStatus,
    RecordStatus,
    Via,
    first_made_by,
    first_made_detail,
)
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.registry import ProviderAnswer
from crashsafe.domain.unknown_finality import StillUnknown, final_unknown

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Record:
    """What the action store holds for one key."""

    key: str
    input_hash: str
    status: RecordStatus
    attempts: int
    outcome: ActionOutcome | None
    # Wall clock when the latest call with the key was sent (None: not known); with `attempts`, what a previous
    # life or a previous store leaves to the next: until the tool's in-flight window passes, "absent" is no proof.
    sent_at: float | None = None
    # The run and step whose request first asked for the key ("" if not known): the effect is theirs.
    run_id: str = ""
    step_no: int = 0


@dataclass(frozen=True, slots=True)
class Execute:
    """Never seen: commit the intent, then call the provider."""


@dataclass(frozen=True, slots=True)
class Replay:
    """Already decided: send the stored receipt again; the provider is not called."""

    outcome: ActionOutcome


@dataclass(frozen=True, slots=True)
class Conflict:
    """The key was used with other input: a typed conflict, and the provider is never reached."""

    outcome: ActionOutcome


@dataclass(frozen=True, slots=True)
class Resolve:
    """An intent with no receipt (a previous life died, or the answer was lost): ask the provider by key first.
    `sent_at`: when its latest call was sent (wall clock), if known; the key is not called again before the
    tool's in-flight window from then has passed."""

    attempts: int
    sent_at: float | None = None


Plan = Execute | Replay | Conflict | Resolve


def classify(
    record: Record | None, request: ActionRequest, deliveries: int, undone: Record | None = None
) -> Plan:
    """`undone`: the record of a compensation of this key (`<key>:release`, `<key>:refund`), if the store has
    one: a settled success means the effect no longer exists, and a replay to another asker must say so."""
    if record is None:
        return Execute()
    if record.input_hash != request.input_hash:
        error = ErrorInfo(
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
            message=f"key {request.key} was first used with different input; nothing was sent to the provider",
            details={
                "key": request.key,
                "stored_input_hash": record.input_hash,
                "input_hash": request.input_hash,
            },
        )
        return Conflict(
            _outcome(
                request,
                OutcomeStatus.CONFLICT,
                error=error,
                via=Via.CONFLICT,
                attempts=0,
                deliveries=deliveries,
            )
        )
    if record.status.settled and record.outcome is not None:
        stored = record.outcome
        another_asker = (stored.run_id, stored.step_no) != (request.run_id, request.step_no)
        if (
            another_asker
            and stored.status == OutcomeStatus.SUCCEEDED
            and undone is not None
            and undone.status == RecordStatus.SUCCEEDED
        ):
            return Replay(_undone(request, stored, undone.key, deliveries))
        # The receipt answers whoever asked now: a key names a business action, so another step or another run
        # of the tenant may ask for it again, and must hear back on its own subject and step. Who first made it
        # is said in the evidence (`first_asked_by`).
        return Replay(
            ActionOutcome(
                run_id=request.run_id,
                step_no=request.step_no,
                tool=stored.tool,
                key=stored.key,
                status=stored.status,
                result=stored.result,
                error=stored.error,
                provider_ref=stored.provider_ref,
                via=Via.REPLAY if stored.via == Via.CALL else stored.via,
                attempts=stored.attempts,
                deliveries=deliveries,
                # A receipt that already names its maker (a provider's replay) keeps it: the store's first asker
                # only asked, another request made it.
                evidence=[*stored.evidence]
                if first_made_by(stored.evidence) is not None
                else [*stored.evidence, first_asked_by(stored)],
            )
        )
    return Resolve(attempts=record.attempts, sent_at=record.sent_at)


def being_undone(record: Record | None, request: ActionRequest, undone: Record | None) -> bool:
    """Whether the key's stored success is another asker's and a compensation of it has begun but not settled:
    the effect may be gone already (the release reached the provider; its receipt, and the key's "undone" mark,
    are written after), so it is replayed to no one as still there until the compensation settles."""
    if record is None or undone is None or record.outcome is None or not record.status.settled:
        return False
    stored = record.outcome
    another_asker = (stored.run_id, stored.step_no) != (request.run_id, request.step_no)
    return another_asker and stored.status == OutcomeStatus.SUCCEEDED and not undone.status.settled


def credited(outcome: ActionOutcome, record: Record | None) -> ActionOutcome:
    """An outcome settled for a key another run or step asked for first (its intent was open, then this request
    came): the effect is the first asker's, and the evidence says so, so this run never undoes or pays for it
    as its own. A provider's answer to this request is never proof that this request made the effect."""
    if record is None or not record.run_id:
        return outcome
    if (record.run_id, record.step_no) == (outcome.run_id, outcome.step_no):
        return outcome
    line = Evidence(
        asked=Asked.STORE_RECEIPT,
        key=outcome.key,
        answer=Answer.REPLAYED,
        detail=first_made_detail(record.run_id, record.step_no),
        at=outcome.evidence[-1].at if outcome.evidence else _EPOCH,
    )
    return msgspec.structs.replace(outcome, evidence=[*outcome.evidence, line])


def receipt_of(outcome: ActionOutcome, record: Record | None) -> ActionOutcome:
    """The receipt the store keeps: the first asker's, whoever's request settled it, so a replay to anyone else
    names them (`first_asked_by`)."""
    if record is None or not record.run_id:
        return outcome
    return msgspec.structs.replace(outcome, run_id=record.run_id, step_no=record.step_no)


def _undone(request: ActionRequest, stored: ActionOutcome, undone_key: str, deliveries: int) -> ActionOutcome:
    """A definitive answer with no effect: the key's effect was made, then undone by a compensation. The stale
    receipt (a released hold's "held") is never handed to a new asker; the run may try a new attempt."""
    error = ErrorInfo(
        code=ErrorCode.ACTION_UNDONE,
        message=(
            f"{request.tool} for key {request.key} was done for {stored.run_id} and then undone ({undone_key});"
            " nothing was sent to the provider. Ask again to act anew."
        ),
        details={"key": request.key, "undone_by": undone_key, "first_run_id": stored.run_id},
    )
    outcome = _outcome(
        request, OutcomeStatus.FAILED, error=error, via=Via.REPLAY, attempts=0, deliveries=deliveries
    )
    return msgspec.structs.replace(outcome, evidence=[first_asked_by(stored)])


def first_asked_by(stored: ActionOutcome) -> Evidence:
    """The evidence line a replay carries: the run and step whose request made the effect."""
    return Evidence(
        asked=Asked.STORE_RECEIPT,
        key=stored.key,
        answer=Answer.REPLAYED,
        detail=first_made_detail(stored.run_id, stored.step_no),
        at=stored.evidence[-1].at if stored.evidence else _EPOCH,
    )


@dataclass(frozen=True, slots=True)
class Done:
    outcome: ActionOutcome


@dataclass(frozen=True, slots=True)
class LookUp:
    """The write's outcome is unknown: ask the provider by the same key before anything else (after
    `delay_s`, the provider's Retry-After)."""

    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CallAgain:
    """Call again with the same key after `delay_s`: a read that failed, or a write the provider says it has no
    record of, once no earlier call of ours can still be in its hands."""

    delay_s: float


Next = Done | LookUp | CallAgain | StillUnknown


def after_call(
    request: ActionRequest,
    contract: ToolContract,
    answer: ProviderAnswer,
    attempts: int,
    deliveries: int,
    via: Via = Via.CALL,
) -> Next:
    if answer.kind == Answer.OK:
        return Done(
            _outcome(
                request,
                OutcomeStatus.SUCCEEDED,
                result=answer.body,
                ref=answer.ref,
                via=via,
                attempts=attempts,
                deliveries=deliveries,
            )
        )
    if answer.kind == Answer.REJECTED:
        return Done(_refused_by_provider(request, answer, via, attempts, deliveries))
    if contract.keyed:
        return LookUp(delay_s=answer.retry_after_s or 0.0)
    # A read that failed: retry it while the contract allows, else a definitive failure (reads have no effect).
    if attempts < contract.max_attempts:
        return CallAgain(delay_s=max(_backoff(attempts), answer.retry_after_s or 0.0))
    return Done(_unavailable(request, answer, attempts, deliveries))


def made_by_another(key_shared: bool, answer: ProviderAnswer, attempts: int) -> str | None:
    """The evidence detail for a call whose answer the provider says it replayed (`Idempotent-Replayed`), if
    that answer is proof another request made the effect: our first call with a shared key had no earlier call
    of ours to replay (from the second attempt on, the replay may be of our own earlier call, and a step key is
    only ever its own run's). A provider's replay never counts as "this run made it"."""
    if not (key_shared and answer.replayed and answer.kind == Answer.OK and attempts == 1):
        return None
    return f"{FIRST_MADE_FOR}{ANOTHER_REQUEST} (the provider replayed an earlier request's answer)"


def after_lookup(
    request: ActionRequest,
    contract: ToolContract,
    lookup: ProviderAnswer,
    attempts: int,
    deliveries: int,
    in_flight_left_s: float = 0.0,
    lookup_informative: bool = True,
) -> Next:
    """What the answer to "what became of this key?" means, asked after an unknown answer (or a previous life).

    `in_flight_left_s`: how long an earlier call of ours whose answer was unknown may still be in the provider's
    hands (the tool's in-flight window, less the time since it was sent). An "absent" is never proof that no
    effect exists, since that call may yet commit: the key is called again only once the window has passed,
    and with the attempts spent the outcome stays unknown (the run hands off; the reconciler keeps asking).
    `lookup_informative`: False for a lookup that only ever says "absent" (`unknown_finality`)."""
    if lookup.kind == Answer.FOUND:
        return Done(
            _outcome(
                request,
                OutcomeStatus.SUCCEEDED,
                result=lookup.body,
                ref=lookup.ref,
                via=Via.PROVIDER_LOOKUP,
                attempts=attempts,
                deliveries=deliveries,
            )
        )
    if lookup.kind == Answer.REJECTED:  # the provider holds the key's record, refused (a declined charge)
        return Done(_refused_by_provider(request, lookup, Via.PROVIDER_LOOKUP, attempts, deliveries))
    if lookup.kind == Answer.ABSENT and attempts < contract.max_attempts:
        return CallAgain(delay_s=max(_backoff(attempts), in_flight_left_s, 0.0))
    final = final_unknown(
        looks_up=True,
        lookup_informative=lookup_informative,
        lookup=lookup.kind,
        attempts=attempts,
        max_attempts=contract.max_attempts,
        retry_after=bool(lookup.retry_after_s),
    )
    if lookup.kind == Answer.ABSENT and final:
        return StillUnknown(
            detail=f"{request.tool}'s lookup can only ever say absent (an effect in a process that is gone) and"
            f" {attempts} attempt(s) are spent; no later ask can tell, so this is not a failure",
            final=True,
        )
    if lookup.kind == Answer.ABSENT:
        return StillUnknown(
            detail=f"the provider has no record of the key after {attempts} attempt(s) whose answers were"
            " unknown; one may still commit, so this is not a failure"
        )
    return StillUnknown(detail=lookup.detail or "provider lookup gave no answer", final=final)


def _refused_by_provider(
    request: ActionRequest, answer: ProviderAnswer, via: Via, attempts: int, deliveries: int
) -> ActionOutcome:
    error = ErrorInfo(
        code=str(answer.body.get("code", ErrorCode.PROVIDER_REJECTED.value)),
        message=str(answer.body.get("message", answer.detail)),
        details={"provider": answer.body},
    )
    return _outcome(
        request, OutcomeStatus.FAILED, error=error, via=via, attempts=attempts, deliveries=deliveries
    )


def refused(request: ActionRequest, error: ErrorInfo, deliveries: int) -> ActionOutcome:
    """A request the executor will not attempt at all: definitive, and no effect exists."""
    return _outcome(
        request, OutcomeStatus.FAILED, error=error, via=Via.REFUSED, attempts=0, deliveries=deliveries
    )


def _backoff(attempts: int) -> float:
    return min(0.05 * 2.0 ** (attempts - 1), 1.0)


def _unavailable(
    request: ActionRequest, answer: ProviderAnswer, attempts: int, deliveries: int
) -> ActionOutcome:
    """A read that never got an answer: it has no effect, so giving up is a definitive failure."""
    error = ErrorInfo(
        code=ErrorCode.PROVIDER_UNAVAILABLE,
        message=(
            f"{request.tool} did not succeed after {attempts} attempt(s)"
            f" ({answer.detail or 'no answer'}); a read leaves no effect behind for key {request.key}"
        ),
        details={"key": request.key},
    )
    return _outcome(
        request, OutcomeStatus.FAILED, error=error, via=Via.CALL, attempts=attempts, deliveries=deliveries
    )


def _outcome(
    request: ActionRequest,
    status: OutcomeStatus,
    *,
    result: dict[str, Any] | None = None,
    error: ErrorInfo | None = None,
    ref: str | None = None,
    via: Via,
    attempts: int,
    deliveries: int,
) -> ActionOutcome:
    return ActionOutcome(
        run_id=request.run_id,
        step_no=request.step_no,
        tool=request.tool,
        key=request.key,
        status=status,
        result=result or {},
        error=error,
        provider_ref=ref,
        via=via,
        attempts=attempts,
        deliveries=deliveries,
    )
