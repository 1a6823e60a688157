"""The root of every error crashsafe raises on purpose: stable codes, retry classes, the wire shape (ErrorInfo),
and how an error declares its facts once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, dataclass_transform

import msgspec


class ErrorCode(StrEnum):
    """Stable error codes; a value is never reused for a different meaning.

    Open on the wire: `ErrorInfo.code` and `DeadLetter.code` are `str`, because a provider's own codes pass
    through (`amount_mismatch`) and a newer writer may add codes an older reader must still decode. An agent's
    refusals in its own terms are its own codes, in its own package (an `ErrorInfo.code` string); values once
    listed here and moved to an agent stay taken (docs/decisions.md)."""

    INVALID_REQUEST = "invalid_request"
    BODY_TOO_LARGE = "body_too_large"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    RUN_NOT_FOUND = "run_not_found"
    RUN_VERSION_CONFLICT = "run_version_conflict"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_TOOL_ARGUMENTS = "invalid_tool_arguments"
    PROVIDER_REJECTED = "provider_rejected"
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    OUTCOME_UNKNOWN = "outcome_unknown"
    MODEL_UNAVAILABLE = "model_unavailable"
    BROKER_UNAVAILABLE = "broker_unavailable"
    POISON_MESSAGE = "poison_message"
    SUBJECT_FULL = "subject_full"
    # A handler raised something that is not a CrashsafeError (a bug) on every delivery: a dead letter's code.
    HANDLER_FAILED = "handler_failed"
    INVALID_SETTING = "invalid_setting"
    PARTITION_NOT_OWNED = "partition_not_owned"
    LEASE_CONFLICT = "lease_conflict"
    TOOL_ARGUMENTS_TOO_LARGE = "tool_arguments_too_large"
    TOOL_ARGUMENTS_TOO_DEEP = "tool_arguments_too_deep"
    MODEL_ANSWER_TOO_LARGE = "model_answer_too_large"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    TOO_MANY_ACTIVE_RUNS = "too_many_active_runs"
    CAPABILITY_REFUSED = "capability_refused"
    OUTCOME_REFUSED = "outcome_refused"
    STREAM_MISSING = "stream_missing"
    NOT_PERMITTED = "not_permitted"
    # A tool call in a model answer that was not run because a call before it waits for approval.
    NOT_RUN = "not_run"
    NOT_ALLOWED = "not_allowed"  # a policy rule refused the action (`run.policy_denied`)
    APPROVAL_NOT_PENDING = "approval_not_pending"  # a decision on an approval already decided or expired
    APPROVAL_NOT_FOUND = "approval_not_found"
    SESSION_OF_ANOTHER_GUEST = (
        "session_of_another_guest"  # a message in a session whose run is another guest's
    )
    INVALID_CATALOG = "invalid_catalog"
    # A refund of a payment not among the guest's payments found in the run.
    UNKNOWN_PAYMENT = "unknown_payment"
    # A replayed key whose effect a compensation undid (a released hold): no stale receipt, no effect.
    ACTION_UNDONE = "action_undone"
    CATALOG_REVISION_GONE = (
        "catalog_revision_gone"  # a run's pinned catalog revision left the bucket's history
    )
    PROFILE_UNREADABLE = "profile_unreadable"  # a guest's KV record that does not decode (slice R)
    # A projection not delivered within its retry policy (issue 10): its dead letter and `ops.projection_failed`.
    PROJECTION_EXHAUSTED = "projection_exhausted"
    # Dead letters an operator acts on (issue 11): none at that sequence, one already settled, one not replayable.
    DEAD_LETTER_NOT_FOUND = "dead_letter_not_found"
    DEAD_LETTER_SETTLED = "dead_letter_settled"
    REPLAY_REFUSED = "replay_refused"
    # An agent's own code raised, answered with the wrong type, or asked for a move that makes no progress.
    AGENT_FAULT = "agent_fault"
    # A registry's synthetic probe names a tool that is not a read: refused when the registry is built.
    PROBE_WRITES = "probe_writes"
    # A message delivered more often than its consumer's limit without being settled: dead-lettered, never dropped.
    DELIVERIES_EXHAUSTED = "deliveries_exhausted"
    # A guest's message refused because the session's run took its whole share of turns (409) or has too many
    # messages waiting to be read (429, Retry-After).
    TURN_LIMIT_REACHED = "turn_limit_reached"
    RUN_INBOX_FULL = "run_inbox_full"
    # A contracting step (`crashsafe infra contract`) while processes of an older release are alive (issue 30).
    UPGRADE_BLOCKED = "upgrade_blocked"
    # What a release finds on the broker that it must not change in place (issue 30): a durable of another shape,
    # a stream of another retention; and a service's seam that does not work yet (it stays unready).
    CONSUMER_SHAPE_CHANGED = "consumer_shape_changed"
    STREAM_SHAPE_CHANGED = "stream_shape_changed"
    SEAM_BROKEN = "seam_broken"
    # A registry a deployment cannot run as it is (an agent registered with projection tools it does not declare).
    INVALID_REGISTRY = "invalid_registry"
    # An adopter's provider client built an answer of a kind it may not give (an executor's own `replayed`).
    PROVIDER_ANSWER_INVALID = "provider_answer_invalid"
    # A message for a run whose journal was archived and purged (issue 31, months of runs): refused, never a
    # journal started again from nothing.
    RUN_ARCHIVED = "run_archived"
    ARCHIVE_UNAVAILABLE = "archive_unavailable"  # the journals' archive could not be read or written
    # A partition store's backup could not be written or read (CRASHSAFE_STORE_BACKUP_DIR): the partition is not
    # taken up from an unreadable backup; a backup round not written is tried again at the next.
    STORE_BACKUP_UNAVAILABLE = "store_backup_unavailable"


class RetryClass(StrEnum):
    """What a consumer does with a message whose handling raised this error."""

    RETRY_LATER = "retry_later"  # nak with a delay; the same message is tried again
    POISON = "poison"  # term it and record a dead letter; retrying cannot help
    UNKNOWN_OUTCOME = "unknown_outcome"  # never retry blind: reconcile by key first
    NONE = "none"  # a final answer; nothing to retry


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An error as it travels in events, outcomes and HTTP bodies.

    `code` is an `ErrorCode` or a provider's own code, `retry` a `RetryClass`: both `str` on the wire (open)."""

    code: str
    message: str
    retry: str = RetryClass.NONE.value
    details: dict[str, Any] = {}


# A field that shapes the message or the handling but is not one of the facts `details()` sends: the caller's
# words, the evidence kept for the outcome, a value derived from the facts.
NOT_SENT: Mapping[str, bool] = MappingProxyType({"sent": False})


@dataclass_transform(kw_only_default=True, eq_default=False, field_specifiers=(field,))
class CrashsafeError(Exception):
    """Root of every error crashsafe raises on purpose; never raised itself (a walk of the sources checks it).

    A subclass declares its facts once, as typed class-level fields: subclassing makes it a dataclass, so those
    fields are its (keyword) constructor, and `details()` (`ErrorInfo.details` on the wire) sends the ones that
    are set, in declared order. A field marked `metadata=NOT_SENT` is kept on the error but not sent.
    `explain()` writes the message from the fields; a class whose caller writes it declares `message` itself."""

    code: ClassVar[ErrorCode]
    retry: ClassVar[RetryClass] = RetryClass.NONE
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    message: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # repr stays Exception's (the message); eq stays identity, so an error stays hashable.
        dataclass(kw_only=True, eq=False, repr=False)(cls)

    def __post_init__(self) -> None:
        self.message = self.explain()
        super().__init__(self.message)

    def explain(self) -> str:
        """The message: what happened and what to do next. By default the caller's own words (`message`)."""
        return self.message

    @classmethod
    def facts(cls) -> tuple[str, ...]:
        """The names `details()` may send, in declared order: every field not marked `NOT_SENT`."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("sent", True))

    def details(self) -> dict[str, Any]:
        """The facts as `ErrorInfo.details`: an unset optional fact (None) is left out, never sent as null."""
        return {name: value for name in self.facts() if (value := getattr(self, name)) is not None}

    def info(self) -> ErrorInfo:
        return ErrorInfo(
            code=self.code.value, message=self.message, retry=self.retry.value, details=self.details()
        )
