"""Bad input at the door: a request that cannot be read, a body that does not fit, a setting the product cannot
use, a key reused with another body, a run that is not there."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from crashsafe.contracts.errors.crashsafe_error import NOT_SENT, CrashsafeError, ErrorCode


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
