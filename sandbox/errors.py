"""Typed provider errors, so the shell maps a stable code to a status and callers branch on codes, not text."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable wire codes of the sandbox provider; values are never reused for a different meaning."""

    MISSING_IDEMPOTENCY_KEY = "missing_idempotency_key"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    INVALID_REQUEST = "invalid_request"
    INVALID_DATES = "invalid_dates"
    NOT_FOUND = "not_found"
    HOTEL_NOT_FOUND = "hotel_not_found"
    BOOKING_NOT_FOUND = "booking_not_found"
    PAYMENT_NOT_FOUND = "payment_not_found"
    HOTEL_UNAVAILABLE = "hotel_unavailable"
    BOOKING_RELEASED = "booking_released"
    AMOUNT_MISMATCH = "amount_mismatch"
    CURRENCY_MISMATCH = "currency_mismatch"
    GUEST_MISMATCH = "guest_mismatch"
    REFUND_EXCEEDS_PAYMENT = "refund_exceeds_payment"
    STREAMING_UNSUPPORTED = "streaming_unsupported"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INJECTED_FAULT = "injected_fault"
    # A lookup by key: the provider holds no write made with that key (the one answer that means "absent").
    KEY_NOT_FOUND = "key_not_found"
    # A lookup by key older than the retention window: the provider no longer says what became of it.
    KEY_EXPIRED = "key_expired"
    # A write whose key is still being processed by an earlier request: ask again later.
    IDEMPOTENCY_KEY_IN_USE = "idempotency_key_in_use"
    CARD_DECLINED = "card_declined"
    RATE_LIMITED = "rate_limited"
    # The audit trail already holds this event id with a different body: the sender is not replaying its journal.
    EVENT_ID_CONFLICT = "event_id_conflict"


class ErrorType(StrEnum):
    """The family of a refusal, as Stripe's `error.type`: what kind of problem, before which one (`code`)."""

    INVALID_REQUEST = "invalid_request_error"
    IDEMPOTENCY = "idempotency_error"
    CARD = "card_error"
    RATE_LIMIT = "rate_limit_error"
    API = "api_error"


_TYPE_BY_CODE: dict[ErrorCode, ErrorType] = {
    ErrorCode.IDEMPOTENCY_CONFLICT: ErrorType.IDEMPOTENCY,
    ErrorCode.IDEMPOTENCY_KEY_IN_USE: ErrorType.IDEMPOTENCY,
    ErrorCode.EVENT_ID_CONFLICT: ErrorType.IDEMPOTENCY,
    ErrorCode.CARD_DECLINED: ErrorType.CARD,
    ErrorCode.RATE_LIMITED: ErrorType.RATE_LIMIT,
    ErrorCode.INJECTED_FAULT: ErrorType.API,
}


def error_type(code: ErrorCode) -> ErrorType:
    return _TYPE_BY_CODE.get(code, ErrorType.INVALID_REQUEST)


# Context values stay scalar so every error body is flat, language-neutral JSON.
Context = str | int | None


class SandboxError(Exception):
    """Root of every refusal the sandbox gives; `code` is the contract, `message` says what to do next."""

    def __init__(self, code: ErrorCode, message: str, **context: Context) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context = context

    def to_body(self) -> dict[str, dict[str, Context]]:
        return {
            "error": {
                "type": error_type(self.code).value,
                "code": self.code.value,
                "message": self.message,
                **self.context,
            }
        }


class MissingIdempotencyKey(SandboxError):
    """A write arrived without a usable Idempotency-Key, so it could not be made safe to retry."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.MISSING_IDEMPOTENCY_KEY,
            "Send an Idempotency-Key header (1-255 characters) with every write; "
            "reuse it only to retry the same request.",
        )


class IdempotencyConflict(SandboxError):
    """The key was already used with a different body: retrying can never succeed, the caller has a bug."""

    def __init__(self, key: str, kind: str) -> None:
        super().__init__(
            ErrorCode.IDEMPOTENCY_CONFLICT,
            f"Idempotency-Key {key!r} was already used for a different {kind} request. "
            "Resend the original body to get the original result, or use a new key for a new request.",
            key=key,
            kind=kind,
        )
        self.key = key
        self.kind = kind


class InvalidRequest(SandboxError):
    """The body or parameters can never be accepted as sent; nothing was recorded."""


class NotFound(SandboxError):
    """A referenced hotel, booking, payment or idempotency key does not exist here."""


class StateConflict(SandboxError):
    """The request is well formed but the resource's state forbids it (sold out, already released)."""


class KeyExpired(SandboxError):
    """A lookup by a key the provider saw, but longer ago than it keeps keys: it cannot say what became of it."""

    def __init__(self, key: str, kind: str, retention_s: int) -> None:
        super().__init__(
            ErrorCode.KEY_EXPIRED,
            f"Idempotency-Key {key!r} is older than the {retention_s} s this provider keeps keys; "
            "what it did is no longer known by key. Reconcile from your own records or the provider's listing.",
            key=key,
            kind=kind,
            retention_s=retention_s,
        )


class KeyInUse(SandboxError):
    """Another request with this key is still being processed; nothing is decided yet."""

    def __init__(self, key: str) -> None:
        super().__init__(
            ErrorCode.IDEMPOTENCY_KEY_IN_USE,
            f"A request with Idempotency-Key {key!r} is still in progress; retry after it finishes "
            "(the same key will then answer with its result).",
            key=key,
        )


class CardDeclined(SandboxError):
    """The charge was attempted and refused by the card's issuer: a definitive answer, no money moved."""

    def __init__(self, payment_id: str, key: str) -> None:
        super().__init__(
            ErrorCode.CARD_DECLINED,
            "The card was declined; ask the guest for another payment method.",
            payment_id=payment_id,
            key=key,
        )


class EventIdConflict(SandboxError):
    """An audit record reuses an event id the trail holds with another body; nothing of its batch was stored."""

    def __init__(self, event_id: str) -> None:
        super().__init__(
            ErrorCode.EVENT_ID_CONFLICT,
            f"The audit trail already holds event {event_id!r} with a different body; an event id names one "
            "journaled event forever. Resend the journal's own event, or fix the sender's numbering.",
            event_id=event_id,
        )
        self.event_id = event_id
