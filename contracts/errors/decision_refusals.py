"""Decisions a manager or an operator cannot take: an approval or a dead letter that is not there, one already
settled, a replay its consumer would not take safely."""

from __future__ import annotations

from dataclasses import field

from crashsafe.contracts.errors.crashsafe_error import NOT_SENT, CrashsafeError, ErrorCode


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
