"""Typed errors with stable codes, the facts a person needs to act, and how a machine should retry them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

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


def _facts(**values: Any) -> dict[str, Any]:
    """The typed fields that are set, for the wire: an unset optional fact is left out, never sent as null."""
    return {name: value for name, value in values.items() if value is not None}


class CrashsafeError(Exception):
    """Root of every error crashsafe raises on purpose.

    Each subclass declares its facts as typed keyword fields, writes a message that says what to do next, and
    builds `details()` (`ErrorInfo.details` on the wire) from those fields. `**extra` is kept only so that
    subclasses and call sites written before the typed fields (`CrashsafeError(message, key=...)`) still run;
    new code declares fields instead."""

    code: ClassVar[ErrorCode] = ErrorCode.INVALID_REQUEST
    retry: ClassVar[RetryClass] = RetryClass.NONE

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def details(self) -> dict[str, Any]:
        """The error's facts as `ErrorInfo.details`: its typed fields, then any untyped extras."""
        return dict(self.extra)

    def info(self) -> ErrorInfo:
        return ErrorInfo(
            code=self.code.value, message=self.message, retry=self.retry.value, details=self.details()
        )


# Bad input at the door ---------------------------------------------------------------------------------------


class InvalidRequest(CrashsafeError):
    """The request cannot be read (not JSON, a bad Idempotency-Key); `message` says what to fix."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key

    def details(self) -> dict[str, Any]:
        return _facts(key=self.key)


class UnprocessableBody(InvalidRequest):
    """Well-formed JSON whose fields are missing, unknown or of the wrong type (HTTP 422, code invalid_request)."""

    def __init__(self, message: str, *, agent: str | None = None) -> None:
        super().__init__(message)
        self.agent = agent

    def details(self) -> dict[str, Any]:
        return _facts(agent=self.agent)


class UnknownAgent(UnprocessableBody):
    """A guest event or a run names an agent this deployment does not run (HTTP 422)."""

    def __init__(self, agent: str, *, known: list[str]) -> None:
        super().__init__(
            f"unknown agent {agent!r}; this deployment runs {known}: pass one as ?agent=, or none for the default",
            agent=agent[:64],
        )
        self.known = known

    def details(self) -> dict[str, Any]:
        return super().details() | _facts(known=self.known)


class InvalidSetting(CrashsafeError):
    """A setting (an environment variable or a flag) the product cannot use; the process stops before serving."""

    code = ErrorCode.INVALID_SETTING

    def __init__(self, *, variable: str, value: str, expected: str) -> None:
        super().__init__(f"{variable}={value!r} is not usable: {expected}")
        self.variable = variable
        self.value = value
        self.expected = expected

    def details(self) -> dict[str, Any]:
        return _facts(variable=self.variable, value=self.value[:200], expected=self.expected)


class BodyTooLarge(CrashsafeError):
    code = ErrorCode.BODY_TOO_LARGE

    def __init__(self, *, size: int, limit: int) -> None:
        super().__init__(f"body is {size} bytes; the limit is {limit}: send a shorter text")
        self.size = size
        self.limit = limit

    def details(self) -> dict[str, Any]:
        return {"size": self.size, "limit": self.limit}


class IdempotencyConflict(CrashsafeError):
    """The same key arrived with a different input: never a second effect."""

    code = ErrorCode.IDEMPOTENCY_CONFLICT

    def __init__(self, *, key: str, run_id: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was already used with a different body; use a new key for a new request"
        )
        self.key = key
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return {"key": self.key, "run_id": self.run_id}


class RunNotFound(CrashsafeError):
    code = ErrorCode.RUN_NOT_FOUND

    def __init__(self, message: str | None = None, *, run_id: str) -> None:
        super().__init__(message or f"no run {run_id}; check the run_id that POST /v1/events returned")
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id}


# The broker and the model -------------------------------------------------------------------------------------


class RunVersionConflict(CrashsafeError):
    """Another writer appended to the run first: re-fold and decide again, never append blind.

    Raised where the append is refused (the broker), which knows the run's subject, `<ns>.run.<run_id>`."""

    code = ErrorCode.RUN_VERSION_CONFLICT
    retry = RetryClass.RETRY_LATER

    def __init__(self, *, subject: str, expected_seq: int) -> None:
        super().__init__(f"{subject} moved past sequence {expected_seq}; re-fold the run and decide again")
        self.subject = subject
        self.expected_seq = expected_seq

    def details(self) -> dict[str, Any]:
        return {"subject": self.subject, "expected_seq": self.expected_seq}


class SubjectFull(CrashsafeError):
    """A publish to a subject that holds one message (discard new per subject) found it taken.

    For an inbound subject that is the run's lasting guard: read the message already there and compare."""

    code = ErrorCode.SUBJECT_FULL

    def __init__(self, *, subject: str) -> None:
        super().__init__(f"{subject} already holds its one message; read it instead of publishing another")
        self.subject = subject

    def details(self) -> dict[str, Any]:
        return {"subject": self.subject}


class BrokerUnavailable(CrashsafeError):
    """NATS or JetStream did not answer; `message` names the call. Retried later: the message was not acked."""

    code = ErrorCode.BROKER_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    def __init__(self, message: str, *, subject: str | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.subject = subject
        self.url = url

    def details(self) -> dict[str, Any]:
        return _facts(subject=self.subject, url=self.url)


class ModelUnavailable(CrashsafeError):
    """The model did not answer usably; the step is asked again later (nothing was journaled for it)."""

    code = ErrorCode.MODEL_UNAVAILABLE
    retry = RetryClass.RETRY_LATER

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(
            f"{message}; the step is asked again later (check CRASHSAFE_MODEL and OPENAI_BASE_URL)"
        )
        self.model = model

    def details(self) -> dict[str, Any]:
        return _facts(model=self.model)


# Messages nobody can handle -----------------------------------------------------------------------------------


class PoisonMessage(CrashsafeError):
    """A message retrying cannot help: terminated and dead-lettered with `reason`, for a person to look at.

    `**extra` carries call-site facts with no field of their own (`missing=[...]` for unusable arguments)."""

    code = ErrorCode.POISON_MESSAGE
    retry = RetryClass.POISON

    def __init__(
        self, reason: str, *, key: str | None = None, run_id: str | None = None, **extra: Any
    ) -> None:
        super().__init__(f"{reason}; retrying cannot help: dead-lettered, fix what published it", **extra)
        self.reason = reason
        self.key = key
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return _facts(key=self.key, run_id=self.run_id) | super().details()


# Partition ownership ------------------------------------------------------------------------------------------


class PartitionNotOwned(CrashsafeError):
    """This replica does not hold the partition's lease (never had it, released it, or lost it while paused):
    it must not commit an intent or a receipt for it. Retried later, so the message reaches the owner."""

    code = ErrorCode.PARTITION_NOT_OWNED
    retry = RetryClass.RETRY_LATER

    def __init__(self, *, family: str, partition: int, key: str | None = None, why: str = "not held") -> None:
        super().__init__(
            f"executor {family} does not hold partition {partition} ({why}); the message comes back to its owner"
        )
        self.family = family
        self.partition = partition
        self.key = key
        self.why = why

    def details(self) -> dict[str, Any]:
        return _facts(family=self.family, partition=self.partition, key=self.key, why=self.why)


class LeaseConflict(CrashsafeError):
    """A key-value write expected a revision the key no longer has: someone else wrote it first."""

    code = ErrorCode.LEASE_CONFLICT
    retry = RetryClass.RETRY_LATER

    def __init__(self, *, key: str, expected_revision: int) -> None:
        super().__init__(f"{key} moved past revision {expected_revision}; read it again before writing")
        self.key = key
        self.expected_revision = expected_revision

    def details(self) -> dict[str, Any]:
        return {"key": self.key, "expected_revision": self.expected_revision}


# Clients and quotas at the gateway ----------------------------------------------------------------------------


class Unauthenticated(CrashsafeError):
    """No usable API key (HTTP 401). `reason`: missing, malformed, invalid (unknown id or wrong secret: one answer,
    so a guess learns nothing) or revoked (said only to a holder of the right secret). Never carries the key."""

    code = ErrorCode.UNAUTHENTICATED

    def __init__(self, reason: str) -> None:
        advice = {
            "missing": "send Authorization: Bearer <key> (crashsafe keys create makes one)",
            "malformed": "the key is csk_<key_id>_<secret>, as crashsafe keys create printed it",
            "invalid": "this key is not known; check it, or ask an operator for a new one",
            "revoked": "this key was revoked; ask an operator for a new one",
        }[reason]
        super().__init__(f"not authenticated ({reason}): {advice}")
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"reason": self.reason}


class Forbidden(CrashsafeError):
    """The key is good but lacks the scope this call needs (HTTP 403)."""

    code = ErrorCode.FORBIDDEN

    def __init__(self, *, scope: str, key_id: str) -> None:
        super().__init__(f"key {key_id} lacks scope {scope!r}; ask an operator for a key that has it")
        self.scope = scope
        self.key_id = key_id

    def details(self) -> dict[str, Any]:
        return {"scope": self.scope, "key_id": self.key_id}


class AgentNotAllowed(Forbidden):
    """A key asked for an agent it may not start (HTTP 403): a key names its agents (`crashsafe keys create
    --agent`), and the synthetic turn's tenant may start only its own (a leaked probe key can search hotels, never
    book or pay)."""

    def __init__(self, *, agent: str, allowed: str, tenant: str, key_id: str) -> None:
        CrashsafeError.__init__(
            self,
            f"key {key_id} of tenant {tenant!r} may start only {allowed or 'no'} runs, not {agent[:64]!r}; ask an"
            " operator for a key naming that agent (crashsafe keys create --agent)",
        )
        self.scope = f"agent:{agent[:64]}"
        self.key_id = key_id
        self.agent = agent[:64]
        self.allowed = allowed
        self.tenant = tenant

    def details(self) -> dict[str, Any]:
        return {"agent": self.agent, "allowed": self.allowed, "tenant": self.tenant, "key_id": self.key_id}


class ApproverStartsRuns(Forbidden):
    """A key that may start runs (`events:write`) asked to decide an approval (HTTP 403): the key whose run asked
    for an action would approve it itself."""

    def __init__(self, *, key_id: str) -> None:
        CrashsafeError.__init__(
            self,
            f"key {key_id} may start runs (events:write), so it may not approve what runs hold back; decide with"
            " a manager's key that has approvals:decide and not events:write",
        )
        self.scope = "approvals:decide"
        self.key_id = key_id


class RateLimited(CrashsafeError):
    """Too many requests for one `limit` (client, guest, run) right now (HTTP 429, `Retry-After`)."""

    code = ErrorCode.RATE_LIMITED
    retry = RetryClass.RETRY_LATER

    def __init__(self, *, limit: str, retry_after_s: float, message: str | None = None) -> None:
        super().__init__(
            message
            or f"too many requests for this {limit}; retry after {retry_after_s:.1f} s with the same body"
        )
        self.limit = limit
        self.retry_after_s = retry_after_s

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit, "retry_after_s": round(self.retry_after_s, 3)}


class TooManyActiveRuns(RateLimited):
    """A guest or a session already has `cap` runs under way (HTTP 429): wait for one to end."""

    code = ErrorCode.TOO_MANY_ACTIVE_RUNS

    def __init__(self, *, limit: str, cap: int, retry_after_s: float) -> None:
        super().__init__(
            limit=limit,
            retry_after_s=retry_after_s,
            message=f"this {limit} already has {cap} runs under way; send it again once one has ended",
        )
        self.cap = cap

    def details(self) -> dict[str, Any]:
        return super().details() | {"cap": self.cap}


class RunInboxFull(RateLimited):
    """The session's run has `cap` of the guest's messages it has not read yet (HTTP 429, `Retry-After`): the
    message was not accepted; send it again later (the same `event_id`), once the run has read what it has."""

    code = ErrorCode.RUN_INBOX_FULL

    def __init__(self, *, run_id: str, session_id: str, waiting: int, cap: int, retry_after_s: float) -> None:
        super().__init__(
            limit="run",
            retry_after_s=retry_after_s,
            message=(
                f"run {run_id} (session {session_id}) has {waiting} of your messages it has not read yet (at most "
                f"{cap}); this one was not accepted: send it again after {retry_after_s:.0f} s with the same event_id"
            ),
        )
        self.run_id = run_id
        self.session_id = session_id
        self.waiting = waiting
        self.cap = cap

    def details(self) -> dict[str, Any]:
        return super().details() | {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "waiting": self.waiting,
            "cap": self.cap,
        }


class TurnLimitReached(CrashsafeError):
    """The session's run has taken its `cap` messages (HTTP 409): no more join it. Nothing was accepted; wait for
    its reply and write again once it has ended (the session's next run takes it), or use a new session."""

    code = ErrorCode.TURN_LIMIT_REACHED

    def __init__(self, *, run_id: str, session_id: str, cap: int) -> None:
        super().__init__(
            f"run {run_id} (session {session_id}) has taken {cap} messages, its most; this one was not accepted: "
            f"wait for its reply (GET /v1/runs/{run_id}) and send it again once the run has ended"
        )
        self.run_id = run_id
        self.session_id = session_id
        self.cap = cap

    def details(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "session_id": self.session_id, "cap": self.cap}


# Trust boundaries ---------------------------------------------------------------------------------------------


class CapabilityRefused(CrashsafeError):
    """An executor refused an action request whose capability is missing, forged, altered, expired or of the
    wrong origin (`reason`, a `crashsafe.contracts.capabilities.Refusal`). Nothing was attempted and no outcome is sent:
    whoever published it could otherwise inject an answer into a real run. Dead-lettered."""

    code = ErrorCode.CAPABILITY_REFUSED
    retry = RetryClass.POISON

    def __init__(self, *, reason: str, key: str, tool: str, run_id: str, family: str) -> None:
        super().__init__(
            f"capability refused ({reason}) for {tool} with key {key}: nothing was attempted; only the runtime "
            "signs action requests: check who published it, or that executors hold the runtime's current "
            "verification key (CRASHSAFE_CAPABILITY_VERIFY_KEYS)"
        )
        self.reason = reason
        self.key = key
        self.tool = tool
        self.run_id = run_id
        self.family = family

    def details(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "key": self.key,
            "tool": self.tool,
            "run_id": self.run_id,
            "family": self.family,
        }


class OutcomeRefused(CrashsafeError):
    """The runtime refused an outcome its run never asked for, or one from an executor family that does not own
    the tool (`reason`, a `crashsafe.contracts.capabilities.OutcomeRefusal`). Not journaled; dead-lettered."""

    code = ErrorCode.OUTCOME_REFUSED
    retry = RetryClass.POISON

    def __init__(self, *, reason: str, key: str, tool: str, run_id: str, source: str) -> None:
        super().__init__(
            f"outcome refused ({reason}) for {tool} with key {key} from {source!r}: not journaled; outcomes are "
            "accepted only for journaled requests, from the family that owns the tool"
        )
        self.reason = reason
        self.key = key
        self.tool = tool
        self.run_id = run_id
        self.source = source

    def details(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "key": self.key,
            "tool": self.tool,
            "run_id": self.run_id,
            "source": self.source,
        }


class StreamMissing(CrashsafeError):
    """A stream or bucket a service needs was never provisioned; services do not create streams."""

    code = ErrorCode.STREAM_MISSING
    retry = RetryClass.RETRY_LATER

    def __init__(self, *, stream: str) -> None:
        super().__init__(
            f"stream {stream} does not exist: run `crashsafe infra apply` (as the operator) to provision the"
            " namespace's streams and buckets, then start this service again"
        )
        self.stream = stream

    def details(self) -> dict[str, Any]:
        return {"stream": self.stream}


class NotPermitted(CrashsafeError):
    """NATS refused this process's user a publish: its role may not send there (docs/security.md)."""

    code = ErrorCode.NOT_PERMITTED
    retry = RetryClass.POISON

    def __init__(self, *, user: str, subject: str) -> None:
        super().__init__(
            f"NATS user {user} may not publish to {subject}; nothing was stored. If this role should, change"
            " contracts/nats_permissions.py and regenerate the credentials' server config"
        )
        self.user = user
        self.subject = subject

    def details(self) -> dict[str, Any]:
        return {"user": self.user, "subject": self.subject}


# Approvals ----------------------------------------------------------------------------------------------------


class ApprovalNotFound(CrashsafeError):
    """No approval with this id, or another tenant's (the same answer: HTTP 404)."""

    code = ErrorCode.APPROVAL_NOT_FOUND
    retry = RetryClass.NONE

    def __init__(self, *, approval_id: str) -> None:
        super().__init__(
            f"no approval {approval_id}; list the pending ones with GET /v1/approvals?status=pending"
        )
        self.approval_id = approval_id

    def details(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id}


class ApprovalNotPending(CrashsafeError):
    """A decision on an approval that was already decided or has expired (HTTP 409): nothing changed."""

    code = ErrorCode.APPROVAL_NOT_PENDING
    retry = RetryClass.NONE

    def __init__(self, *, approval_id: str, status: str, decided_by: str = "") -> None:
        by = f" by {decided_by}" if decided_by else ""
        super().__init__(
            f"approval {approval_id} is {status}{by}, not pending: it can no longer be decided; a new"
            " request of the action needs a new approval"
        )
        self.approval_id = approval_id
        self.status = status
        self.decided_by = decided_by

    def details(self) -> dict[str, Any]:
        return _facts(approval_id=self.approval_id, status=self.status, decided_by=self.decided_by)


class SessionOfAnotherGuest(CrashsafeError):
    """A message names a session whose active run is another guest's (HTTP 409): it would become that run's turn
    (and could answer its approval), so it is refused; nothing was published."""

    code = ErrorCode.SESSION_OF_ANOTHER_GUEST
    retry = RetryClass.POISON

    def __init__(self, *, session_id: str, run_id: str) -> None:
        super().__init__(
            f"session {session_id} is in use by another guest's run {run_id}; use a session id of your own"
        )
        self.session_id = session_id
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "run_id": self.run_id}


# The configuration catalog ------------------------------------------------------------------------------------


class InvalidCatalog(CrashsafeError):
    """A catalog that fails validation: refused at publish, and refused at reload (the last working one stays)."""

    code = ErrorCode.INVALID_CATALOG
    retry = RetryClass.POISON

    def __init__(self, problems: list[str], *, revision: int | None = None) -> None:
        at = f" (revision {revision})" if revision is not None else ""
        super().__init__(
            f"catalog{at} is invalid: {'; '.join(problems)}; fix it and check it with `crashsafe config validate`"
        )
        self.problems = problems
        self.revision = revision

    def details(self) -> dict[str, Any]:
        return _facts(problems=self.problems, revision=self.revision)


class CatalogRevisionGone(CrashsafeError):
    """A run is pinned to a catalog revision the bucket no longer holds (more publishes than its history since
    the run started). Never answered with another revision: the run would change its rules half-way."""

    code = ErrorCode.CATALOG_REVISION_GONE
    retry = RetryClass.POISON

    def __init__(self, *, revision: int, agent: str, run_id: str | None = None) -> None:
        super().__init__(
            f"catalog revision {revision} (agent {agent}) is no longer in the catalog bucket's history; the run"
            " cannot go on under the rules it started with: hand it off (`crashsafe reconcile`) and publish less"
            " often than the bucket's history (docs/architecture.md, the catalog)"
        )
        self.revision = revision
        self.agent = agent
        self.run_id = run_id

    def details(self) -> dict[str, Any]:
        return _facts(revision=self.revision, agent=self.agent, run_id=self.run_id)


class AgentFault(CrashsafeError):
    """An agent's code (`prepare`, `compensations`, `script`) raised, answered something that is not what the
    runtime asks of it, or asked for a move that makes no progress (undo an effect already undone). Retrying
    cannot help (the agent is pure over the journal): the run is handed off with reason `agent_fault`."""

    code = ErrorCode.AGENT_FAULT
    retry = RetryClass.POISON

    def __init__(self, *, agent: str, hook: str, problem: str) -> None:
        super().__init__(
            f"agent {agent}'s {hook} {problem}; the run is handed to a person: fix the agent's code and "
            "redeploy (its journal replays as it stands)"
        )
        self.agent = agent
        self.hook = hook
        self.problem = problem

    def details(self) -> dict[str, Any]:
        return {"agent": self.agent, "hook": self.hook, "problem": self.problem}


class DeadLetterNotFound(CrashsafeError):
    """No dead letter at this sequence of the DEAD stream (or one of another tenant's runs: the same answer)."""

    code = ErrorCode.DEAD_LETTER_NOT_FOUND

    def __init__(self, *, stream_seq: int) -> None:
        super().__init__(f"no dead letter {stream_seq}; list them with `crashsafe dead-letters list`")
        self.stream_seq = stream_seq

    def details(self) -> dict[str, Any]:
        return {"stream_seq": self.stream_seq}


class DeadLetterSettled(CrashsafeError):
    """A dead letter already replayed or discarded (HTTP 409): nothing was sent again."""

    code = ErrorCode.DEAD_LETTER_SETTLED

    def __init__(self, *, stream_seq: int, settled: str, by: str) -> None:
        super().__init__(f"dead letter {stream_seq} was already {settled} by {by}; nothing was sent again")
        self.stream_seq = stream_seq
        self.settled = settled
        self.by = by

    def details(self) -> dict[str, Any]:
        return {"stream_seq": self.stream_seq, "settled": self.settled, "by": self.by}


class ReplayRefused(CrashsafeError):
    """A dead letter whose consumer would not take a second delivery safely (HTTP 409): `message` says what
    to do instead; nothing was sent."""

    code = ErrorCode.REPLAY_REFUSED

    def __init__(self, message: str, *, stream_seq: int, subject: str) -> None:
        super().__init__(message)
        self.stream_seq = stream_seq
        self.subject = subject

    def details(self) -> dict[str, Any]:
        return {"stream_seq": self.stream_seq, "subject": self.subject}
