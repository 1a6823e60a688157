"""The projector's pure decisions: what one delivery attempt's answer means, which run events plan projections,
and the audit records of a journal. No clock, no I/O: the shell passes `now` and what the receiver said."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec

from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.projections import RetryPolicy
from crashsafe.contracts.run_events import RUN_ENDS, RUN_WAITS, event_id
from crashsafe.contracts.tool_messages import Answer


@dataclass(frozen=True, slots=True)
class Delivered:
    """The receiver has it (its answer to the call, or its record found by key)."""


@dataclass(frozen=True, slots=True)
class RetryIn:
    """Not delivered yet: try again in `delay_s` (already scaled; a receiver's Retry-After included)."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class Dead:
    """Trying again cannot help (a typed refusal) or may no longer (the policy is spent): an operator acts."""

    code: str
    reason: str


Decision = Delivered | RetryIn | Dead


def quick_delay_s(policy: RetryPolicy, attempt: int) -> float:
    """The pause after failed attempt `attempt` (1-based): the back-off's values while the quick attempts last
    (its last value repeated), then one try every `long_every_s`."""
    if attempt >= policy.attempts or not policy.backoff_s:
        return policy.long_every_s
    return policy.backoff_s[min(attempt, len(policy.backoff_s)) - 1]


def after_attempt(
    policy: RetryPolicy,
    attempt: int,
    answer_kind: str,
    planned_at: datetime,
    now: datetime,
    retry_after_s: float | None = None,
    scale: float = 1.0,
    detail: str = "",
) -> Decision:
    """What attempt `attempt` of a projection planned at `planned_at` leads to, given the receiver's answer.

    `ok`/`found`: delivered. `rejected` (the receiver's typed refusal): dead at once. Anything else (`unknown`:
    timeout, 5xx, 408/429, garbage; `absent`): retry after the policy's pause, or the receiver's Retry-After if
    that is longer, unless `give_up_after_s` has passed since it was planned. The policy's durations are
    multiplied by `scale` (a shortened clock in tests); a Retry-After is the receiver's clock and is not."""
    if answer_kind in (Answer.OK, Answer.FOUND):
        return Delivered()
    if answer_kind == Answer.REJECTED:
        return Dead(
            ErrorCode.PROVIDER_REJECTED.value,
            f"the receiver refused it: {detail}" if detail else "the receiver refused it",
        )
    elapsed_s = (now - planned_at).total_seconds()
    if elapsed_s >= policy.give_up_after_s * scale:
        return Dead(
            ErrorCode.PROJECTION_EXHAUSTED.value,
            f"not delivered after {attempt} attempts over {elapsed_s:.1f}s (last: {detail or answer_kind})",
        )
    delay_s = quick_delay_s(policy, attempt) * scale
    if retry_after_s is not None and retry_after_s > delay_s:
        delay_s = retry_after_s
    return RetryIn(delay_s)


class Trigger(StrEnum):
    """Which of a run's projections an event calls for."""

    ALL = "all"  # the run ended (or was known to have ended): every projection and the audit trail
    AUDIT = "audit"  # a long wait begins: flush the audit trail so far, nothing else (the run may still undo)


TERMINAL = RUN_ENDS
LONG_WAIT = RUN_WAITS


def trigger(event_type: str, ended: bool, after_end: bool = False) -> Trigger | None:
    """The planner's rule: a terminal event, an event the runtime marked as appended after its run ended
    (`Crashsafe-Run-Ended`: a late receipt after a hand-off, whichever replica saw the end, restarted or not),
    or any event of a run this replica knows has ended, plans everything; an approval request flushes the audit
    trail; the rest nothing (no journal is read for an event of a run still going)."""
    if event_type in TERMINAL or ended or after_end:
        return Trigger.ALL
    if event_type in LONG_WAIT:
        return Trigger.AUDIT
    return None


class _Envelope(msgspec.Struct, kw_only=True):
    type: str
    run_id: str
    at: str


_envelope = msgspec.json.Decoder(_Envelope)
_event = msgspec.json.Decoder(dict[str, Any])


def envelope_of(raw: bytes) -> tuple[str, str]:
    """A journaled event's type and run, read without decoding the event (the planner sees every event of every
    run and plans on few). Raises `msgspec.DecodeError`/`ValidationError` on bytes that are not an event."""
    envelope = _envelope.decode(raw)
    return envelope.type, envelope.run_id


def audit_records(
    events: Sequence[bytes], upto: int, tenant: str, run_id: str | None = None
) -> list[dict[str, Any]]:
    """The audit receiver's records of a run's events 1..upto, each as journaled (its JSON, not re-encoded by
    this version: a field a newer writer added stays in, so every projector sends the same body per event id),
    less an intent's capability.
    Each is recorded under `run_id`, the journal it is in (its subject's), whatever its body claims: an event
    naming another run must not take that run's event id. Without `run_id`, the first event's run.

    Raises `msgspec.DecodeError` on bytes that are not an event (a corrupt journal is a dead task, not a guess)."""
    records: list[dict[str, Any]] = []
    for position, raw in enumerate(events[:upto], start=1):
        envelope = _envelope.decode(raw)
        run_id = run_id or envelope.run_id
        body = _event.decode(raw)
        # An intent's capability (the journal carries it to its executor, issue 33) is the runtime's word to the
        # executor alone: never sent on, by any release (the record must be the same from every projector).
        if body.get("capability") is not None:  # (a null one stays: 0.2 sends it so)
            del body["capability"]
        records.append(
            {
                "event_id": event_id(run_id, position),
                "run_id": run_id,
                "tenant": tenant,
                "type": envelope.type,
                "at": envelope.at,
                "event": body,
            }
        )
    return records


def chunks(records: Sequence[dict[str, Any]], size: int) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """Records in fixed position ranges (1..size, size+1..2*size, …) as (first, last, records): a range is the
    same request whichever task sends it, so a journal of MBs goes in bounded requests."""
    out: list[tuple[int, int, list[dict[str, Any]]]] = []
    for start in range(0, len(records), size):
        part = list(records[start : start + size])
        out.append((start + 1, start + len(part), part))
    return out
