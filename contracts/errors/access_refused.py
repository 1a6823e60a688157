"""Clients and quotas at the gateway: no usable key, a key without the scope or the agent, and the limits that
answer 429 (rate, active runs, a full run inbox) or 409 (a run's turns taken)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from crashsafe.contracts.errors.crashsafe_error import NOT_SENT, CrashsafeError, ErrorCode, RetryClass

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


class ApproverStartedRun(Forbidden):
    """The key whose message started a run asked to decide one of its approvals (HTTP 403): an admin key too,
    which may otherwise both start runs and decide (`crashsafe up` mints one)."""

    scope: str = field(init=False, default="approvals:decide")
    run_id: str

    def explain(self) -> str:
        return (
            f"key {self.key_id} started run {self.run_id}, so it may not approve what that run holds back; decide"
            " with another key that has approvals:decide (`crashsafe up` writes one to <state-dir>/approver_key;"
            " crashsafe keys create --scope approvals:decide makes one)"
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
