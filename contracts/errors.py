"""Typed errors with stable codes, the facts a person needs to act, and how a machine should retry them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec


class ErrorCode(StrEnum):
    """Stable error codes; a value is never reused for a different meaning."""

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


class RetryClass(StrEnum):
    """What a consumer does with a message whose handling raised this error."""

    RETRY_LATER = "retry_later"  # nak with a delay; the same message is tried again
    POISON = "poison"  # term it and record a dead letter; retrying cannot help
    UNKNOWN_OUTCOME = "unknown_outcome"  # never retry blind: reconcile by key first
    NONE = "none"  # a final answer; nothing to retry


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An error as it travels in events, outcomes and HTTP bodies."""

    code: str
    message: str
    retry: str = RetryClass.NONE.value
    details: dict[str, Any] = {}


class CrashsafeError(Exception):
    """Root of every error crashsafe raises on purpose."""

    code: ErrorCode = ErrorCode.INVALID_REQUEST
    retry: RetryClass = RetryClass.NONE

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def info(self) -> ErrorInfo:
        return ErrorInfo(
            code=self.code.value, message=self.message, retry=self.retry.value, details=self.details
        )


class InvalidRequest(CrashsafeError):
    code = ErrorCode.INVALID_REQUEST


class BodyTooLarge(CrashsafeError):
    code = ErrorCode.BODY_TOO_LARGE


class IdempotencyConflict(CrashsafeError):
    """The same key arrived with a different input: never a second effect."""

    code = ErrorCode.IDEMPOTENCY_CONFLICT


class RunNotFound(CrashsafeError):
    code = ErrorCode.RUN_NOT_FOUND


class RunVersionConflict(CrashsafeError):
    """Another writer appended to the run first: re-fold and decide again, never append blind."""

    code = ErrorCode.RUN_VERSION_CONFLICT
    retry = RetryClass.RETRY_LATER


class BrokerUnavailable(CrashsafeError):
    code = ErrorCode.BROKER_UNAVAILABLE
    retry = RetryClass.RETRY_LATER


class ModelUnavailable(CrashsafeError):
    code = ErrorCode.MODEL_UNAVAILABLE
    retry = RetryClass.RETRY_LATER


class PoisonMessage(CrashsafeError):
    code = ErrorCode.POISON_MESSAGE
    retry = RetryClass.POISON
