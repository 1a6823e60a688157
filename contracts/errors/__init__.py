"""Typed errors with stable codes, the facts a person needs to act, and how a machine should retry them."""

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
    through (`amount_mismatch`) and a newer writer may add codes an older reader must still decode."""

    INVALID_REQUEST = "invalid_request"
    BODY_TOO_LARGE = "body_too_large"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    RUN_NOT_FOUND = "run_not_found"
    RUN_VERSION_CONFLICT = "run_version_conflict"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_TOOL_ARGUMENTS = "invalid_tool_arguments"
    UNKNOWN_BOOKING = "unknown_booking"
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
    # A message delivered more often than its consumer's limit without being settled: dead-lettered, never dropped.
    DELIVERIES_EXHAUSTED = "deliveries_exhausted"
    # A guest's message refused because the session's run took its whole share of turns (409) or has too many
    # messages waiting to be read (429, Retry-After).
    TURN_LIMIT_REACHED = "turn_limit_reached"
    RUN_INBOX_FULL = "run_inbox_full"


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


# Bad input at the door ---------------------------------------------------------------------------------------


class InvalidRequest(CrashsafeError):
    """The request cannot be read (not JSON, a bad Idempotency-Key); `message` says what to fix."""

    code = ErrorCode.INVALID_REQUEST

    message: str = field(kw_only=False, metadata=NOT_SENT)
    key: str | None = None


class UnprocessableBody(InvalidRequest):
    """Well-formed JSON whose fields are missing, unknown or of the wrong type (HTTP 422, code invalid_request)."""

    agent: str | None = None


class UnknownAgent(UnprocessableBody):
    """A guest event or a run names an agent this deployment does not run (HTTP 422)."""

    message: str = field(init=False, metadata=NOT_SENT)
    agent: str = field(kw_only=False)
    known: list[str]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.agent = self.agent[:64]  # the message names it whole; the facts keep a bounded name

    def explain(self) -> str:
        return (
            f"unknown agent {self.agent!r}; this deployment runs {self.known}: pass one as ?agent=, or none for"
            " the default"
        )


class InvalidSetting(CrashsafeError):
    """A setting (an environment variable or a flag) the product cannot use; the process stops before serving."""

    code = ErrorCode.INVALID_SETTING

    variable: str
    value: str
    expected: str

    def explain(self) -> str:
        return f"{self.variable}={self.value!r} is not usable: {self.expected}"

    def details(self) -> dict[str, Any]:
        return super().details() | {"value": self.value[:200]}  # a pasted blob is not echoed whole


class BodyTooLarge(CrashsafeError):
    """A body over the size limit; nothing was read further."""

    code = ErrorCode.BODY_TOO_LARGE

    size: int
    limit: int

    def explain(self) -> str:
        return f"body is {self.size} bytes; the limit is {self.limit}: send a shorter text"


class IdempotencyConflict(CrashsafeError):
    """The same key arrived with a different input: never a second effect."""

    code = ErrorCode.IDEMPOTENCY_CONFLICT

    key: str
    run_id: str

    def explain(self) -> str:
        return (
            f"Idempotency-Key {self.key!r} was already used with a different body; use a new key for a new"
            " request"
        )


class RunNotFound(CrashsafeError):
    """No run with this id (or another tenant's: the same answer); `message` may say why the id is wrong."""

    code = ErrorCode.RUN_NOT_FOUND

    message: str = field(default="", kw_only=False, metadata=NOT_SENT)
    run_id: str

    def explain(self) -> str:
        return self.message or f"no run {self.run_id}; check the run_id that POST /v1/events returned"


# The broker and the model -------------------------------------------------------------------------------------


class RunVersionConflict(CrashsafeError):
    """Another writer appended to the run first: re-fold and decide again, never append blind.

    Raised where the append is refused (the broker), which knows the run's subject, `<ns>.run.<run_id>`."""

    code = ErrorCode.RUN_VERSION_CONFLICT
    retry = RetryClass.RETRY_LATER

    subject: str
    expected_seq: int

    def explain(self) -> str:
        return f"{self.subject} moved past sequence {self.expected_seq}; re-fold the run and decide again"


class SubjectFull(CrashsafeError):
    """A publish to a subject that holds one message (discard new per subject) found it taken.

    For an inbound subject that is the run's lasting guard: read the message already there and compare."""

    code = ErrorCode.SUBJECT_FULL

    subject: str

    def explain(self) -> str:
        return f"{self.subject} already holds its one message; read it instead of publishing another"


class BrokerUnavailable(CrashsafeError):
    """NATS or JetStream did not answer; `message` names the call. Retried later: the message was not acked."""

    code = ErrorCode.BROKER_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    message: str = field(kw_only=False, metadata=NOT_SENT)
    subject: str | None = None
    url: str | None = None


class ModelUnavailable(CrashsafeError):
    """The model did not answer usably; the step is asked again later (nothing was journaled for it)."""

    code = ErrorCode.MODEL_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    problem: str = field(kw_only=False, metadata=NOT_SENT)
    model: str | None = None

    def explain(self) -> str:
        return f"{self.problem}; the step is asked again later (check CRASHSAFE_MODEL and OPENAI_BASE_URL)"


# Messages nobody can handle -----------------------------------------------------------------------------------


class PoisonMessage(CrashsafeError):
    """A message retrying cannot help: terminated and dead-lettered with `reason`, for a person to look at."""

    code = ErrorCode.POISON_MESSAGE
    retry = RetryClass.POISON

    reason: str = field(kw_only=False, metadata=NOT_SENT)
    key: str | None = None
    run_id: str | None = None
    missing: list[str] | None = None  # the arguments a tool needs that the request lacked

    def explain(self) -> str:
        return f"{self.reason}; retrying cannot help: dead-lettered, fix what published it"


# Partition ownership ------------------------------------------------------------------------------------------


class PartitionNotOwned(CrashsafeError):
    """This replica does not hold the partition's lease (never had it, released it, or lost it while paused):
    it must not commit an intent or a receipt for it. Retried later, so the message reaches the owner."""

    code = ErrorCode.PARTITION_NOT_OWNED
    retry = RetryClass.RETRY_LATER

    family: str
    partition: int
    key: str | None = None
    why: str = "not held"

    def explain(self) -> str:
        return (
            f"executor {self.family} does not hold partition {self.partition} ({self.why}); the message comes"
            " back to its owner"
        )


class LeaseConflict(CrashsafeError):
    """A key-value write expected a revision the key no longer has: someone else wrote it first."""

    code = ErrorCode.LEASE_CONFLICT
    retry = RetryClass.RETRY_LATER

    key: str
    expected_revision: int

    def explain(self) -> str:
        return f"{self.key} moved past revision {self.expected_revision}; read it again before writing"


# Clients and quotas at the gateway ----------------------------------------------------------------------------

_UNAUTHENTICATED_ADVICE = {
    "missing": "send Authorization: Bearer <key> (crashsafe keys create makes one)",
    "malformed": "the key is csk_<key_id>_<secret>, as crashsafe keys create printed it",
    "invalid": "this key is not known; check it, or ask an operator for a new one",
    "revoked": "this key was revoked; ask an operator for a new one",
}


class Unauthenticated(CrashsafeError):
    """No usable API key (HTTP 401). `reason`: missing, malformed, invalid (unknown id or wrong secret: one answer,
    so a guess learns nothing) or revoked (said only to a holder of the right secret). Never carries the key."""

    code = ErrorCode.UNAUTHENTICATED

    reason: str = field(kw_only=False)

    def explain(self) -> str:
        return f"not authenticated ({self.reason}): {_UNAUTHENTICATED_ADVICE[self.reason]}"


class Forbidden(CrashsafeError):
    """The key is good but lacks the scope this call needs (HTTP 403)."""

    code = ErrorCode.FORBIDDEN

    scope: str
    key_id: str

    def explain(self) -> str:
        return f"key {self.key_id} lacks scope {self.scope!r}; ask an operator for a key that has it"


class AgentNotAllowed(Forbidden):
    """A key asked for an agent it may not start (HTTP 403): a key names its agents (`crashsafe keys create
    --agent`), and the synthetic turn's tenant may start only its own (a leaked probe key can search hotels, never
    book or pay)."""

    scope: str = field(
        init=False, metadata=NOT_SENT
    )  # `agent:<name>`, for the logs; the facts name the agent
    agent: str
    allowed: str
    tenant: str

    def __post_init__(self) -> None:
        self.agent = self.agent[:64]
        self.scope = f"agent:{self.agent}"
        super().__post_init__()

    def explain(self) -> str:
        return (
            f"key {self.key_id} of tenant {self.tenant!r} may start only {self.allowed or 'no'} runs, not"
            f" {self.agent!r}; ask an operator for a key naming that agent (crashsafe keys create --agent)"
        )


class ApproverStartsRuns(Forbidden):
    """A key that may start runs (`events:write`) asked to decide an approval (HTTP 403): the key whose run asked
    for an action would approve it itself."""

    scope: str = field(init=False, default="approvals:decide")

    def explain(self) -> str:
        return (
            f"key {self.key_id} may start runs (events:write), so it may not approve what runs hold back; decide"
            " with a manager's key that has approvals:decide and not events:write"
        )


class RateLimited(CrashsafeError):
    """Too many requests for one `limit` (client, guest, run) right now (HTTP 429, `Retry-After`)."""

    code = ErrorCode.RATE_LIMITED
    retry = RetryClass.RETRY_LATER

    limit: str
    retry_after_s: float
    message: str = field(default="", metadata=NOT_SENT)

    def explain(self) -> str:
        return (
            self.message
            or f"too many requests for this {self.limit}; retry after {self.retry_after_s:.1f} s with the same body"
        )

    def details(self) -> dict[str, Any]:
        # Rounded on the wire only: the Retry-After header is the ceiling of the exact value.
        return super().details() | {"retry_after_s": round(self.retry_after_s, 3)}


class TooManyActiveRuns(RateLimited):
    """A guest or a session already has `cap` runs under way (HTTP 429): wait for one to end."""

    code = ErrorCode.TOO_MANY_ACTIVE_RUNS

    cap: int

    def explain(self) -> str:
        return f"this {self.limit} already has {self.cap} runs under way; send it again once one has ended"


class RunInboxFull(RateLimited):
    """The session's run has `cap` of the guest's messages it has not read yet (HTTP 429, `Retry-After`): the
    message was not accepted; send it again later (the same `event_id`), once the run has read what it has."""

    code = ErrorCode.RUN_INBOX_FULL

    limit: str = "run"
    run_id: str
    session_id: str
    waiting: int
    cap: int

    def explain(self) -> str:
        return (
            f"run {self.run_id} (session {self.session_id}) has {self.waiting} of your messages it has not read"
            f" yet (at most {self.cap}); this one was not accepted: send it again after"
            f" {self.retry_after_s:.0f} s with the same event_id"
        )


class TurnLimitReached(CrashsafeError):
    """The session's run has taken its `cap` messages (HTTP 409): no more join it. Nothing was accepted; wait for
    its reply and write again once it has ended (the session's next run takes it), or use a new session."""

    code = ErrorCode.TURN_LIMIT_REACHED

    run_id: str
    session_id: str
    cap: int

    def explain(self) -> str:
        return (
            f"run {self.run_id} (session {self.session_id}) has taken {self.cap} messages, its most; this one was"
            f" not accepted: wait for its reply (GET /v1/runs/{self.run_id}) and send it again once the run has"
            " ended"
        )


# Trust boundaries ---------------------------------------------------------------------------------------------


class CapabilityRefused(CrashsafeError):
    """An executor refused an action request whose capability is missing, forged, altered, expired or of the
    wrong origin (`reason`, a `crashsafe.contracts.capabilities.Refusal`). Nothing was attempted and no outcome is sent:
    whoever published it could otherwise inject an answer into a real run. Dead-lettered."""

    code = ErrorCode.CAPABILITY_REFUSED
    retry = RetryClass.POISON

    reason: str
    key: str
    tool: str
    run_id: str
    family: str

    def explain(self) -> str:
        return (
            f"capability refused ({self.reason}) for {self.tool} with key {self.key}: nothing was attempted; only"
            " the runtime signs action requests: check who published it, or that executors hold the runtime's"
            " current verification key (CRASHSAFE_CAPABILITY_VERIFY_KEYS)"
        )


class OutcomeRefused(CrashsafeError):
    """The runtime refused an outcome its run never asked for, or one from an executor family that does not own
    the tool (`reason`, a `crashsafe.contracts.capabilities.OutcomeRefusal`). Not journaled; dead-lettered."""

    code = ErrorCode.OUTCOME_REFUSED
    retry = RetryClass.POISON

    reason: str
    key: str
    tool: str
    run_id: str
    source: str

    def explain(self) -> str:
        return (
            f"outcome refused ({self.reason}) for {self.tool} with key {self.key} from {self.source!r}: not"
            " journaled; outcomes are accepted only for journaled requests, from the family that owns the tool"
        )


class StreamMissing(CrashsafeError):
    """A stream or bucket a service needs was never provisioned; services do not create streams."""

    code = ErrorCode.STREAM_MISSING
    retry = RetryClass.RETRY_LATER

    stream: str

    def explain(self) -> str:
        return (
            f"stream {self.stream} does not exist: run `crashsafe infra apply` (as the operator) to provision the"
            " namespace's streams and buckets, then start this service again"
        )


class NotPermitted(CrashsafeError):
    """NATS refused this process's user a publish: its role may not send there (docs/security.md)."""

    code = ErrorCode.NOT_PERMITTED
    retry = RetryClass.POISON

    user: str
    subject: str

    def explain(self) -> str:
        return (
            f"NATS user {self.user} may not publish to {self.subject}; nothing was stored. If this role should,"
            " change contracts/nats_permissions.py and regenerate the credentials' server config"
        )


# Approvals ----------------------------------------------------------------------------------------------------


class ApprovalNotFound(CrashsafeError):
    """No approval with this id, or another tenant's (the same answer: HTTP 404)."""

    code = ErrorCode.APPROVAL_NOT_FOUND

    approval_id: str

    def explain(self) -> str:
        return f"no approval {self.approval_id}; list the pending ones with GET /v1/approvals?status=pending"


class ApprovalNotPending(CrashsafeError):
    """A decision on an approval that was already decided or has expired (HTTP 409): nothing changed."""

    code = ErrorCode.APPROVAL_NOT_PENDING

    approval_id: str
    status: str
    decided_by: str = ""

    def explain(self) -> str:
        by = f" by {self.decided_by}" if self.decided_by else ""
        return (
            f"approval {self.approval_id} is {self.status}{by}, not pending: it can no longer be decided; a new"
            " request of the action needs a new approval"
        )


class SessionOfAnotherGuest(CrashsafeError):
    """A message names a session whose active run is another guest's (HTTP 409): it would become that run's turn
    (and could answer its approval), so it is refused; nothing was published."""

    code = ErrorCode.SESSION_OF_ANOTHER_GUEST
    retry = RetryClass.POISON

    session_id: str
    run_id: str

    def explain(self) -> str:
        return (
            f"session {self.session_id} is in use by another guest's run {self.run_id}; use a session id of your"
            " own"
        )


# The configuration catalog ------------------------------------------------------------------------------------


class InvalidCatalog(CrashsafeError):
    """A catalog that fails validation: refused at publish, and refused at reload (the last working one stays)."""

    code = ErrorCode.INVALID_CATALOG
    retry = RetryClass.POISON

    problems: list[str] = field(kw_only=False)
    revision: int | None = None

    def explain(self) -> str:
        at = f" (revision {self.revision})" if self.revision is not None else ""
        return (
            f"catalog{at} is invalid: {'; '.join(self.problems)}; fix it and check it with `crashsafe config"
            " validate`"
        )


class CatalogRevisionGone(CrashsafeError):
    """A run is pinned to a catalog revision the bucket no longer holds (more publishes than its history since
    the run started). Never answered with another revision: the run would change its rules half-way."""

    code = ErrorCode.CATALOG_REVISION_GONE
    retry = RetryClass.POISON

    revision: int
    agent: str
    run_id: str | None = None

    def explain(self) -> str:
        return (
            f"catalog revision {self.revision} (agent {self.agent}) is no longer in the catalog bucket's history;"
            " the run cannot go on under the rules it started with: hand it off (`crashsafe reconcile`) and"
            " publish less often than the bucket's history (docs/architecture.md, the catalog)"
        )


class AgentFault(CrashsafeError):
    """An agent's code (`prepare`, `compensations`, `script`) raised, answered something that is not what the
    runtime asks of it, or asked for a move that makes no progress (undo an effect already undone). Retrying
    cannot help (the agent is pure over the journal): the run is handed off with reason `agent_fault`."""

    code = ErrorCode.AGENT_FAULT
    retry = RetryClass.POISON

    agent: str
    hook: str
    problem: str

    def explain(self) -> str:
        return (
            f"agent {self.agent}'s {self.hook} {self.problem}; the run is handed to a person: fix the agent's code"
            " and redeploy (its journal replays as it stands)"
        )


class DeadLetterNotFound(CrashsafeError):
    """No dead letter at this sequence of the DEAD stream (or one of another tenant's runs: the same answer)."""

    code = ErrorCode.DEAD_LETTER_NOT_FOUND

    stream_seq: int

    def explain(self) -> str:
        return f"no dead letter {self.stream_seq}; list them with `crashsafe dead-letters list`"


class DeadLetterSettled(CrashsafeError):
    """A dead letter already replayed or discarded (HTTP 409): nothing was sent again."""

    code = ErrorCode.DEAD_LETTER_SETTLED

    stream_seq: int
    settled: str
    by: str

    def explain(self) -> str:
        return (
            f"dead letter {self.stream_seq} was already {self.settled} by {self.by}; nothing was sent again"
        )


class ReplayRefused(CrashsafeError):
    """A dead letter whose consumer would not take a second delivery safely (HTTP 409): `message` says what
    to do instead; nothing was sent."""

    code = ErrorCode.REPLAY_REFUSED

    message: str = field(kw_only=False, metadata=NOT_SENT)
    stream_seq: int
    subject: str
