"""The gateway's pure rules: which key a request carries, which run it lands on, how errors map to HTTP.

The inbound identity is (tenant, event_id) and nothing else: an `Idempotency-Key` header is ignored, because a
proxy or an HTTP library that adds a fresh one per retry would otherwise start a second run of the same event
(docs/architecture.md, "Keys")."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from crashsafe.contracts.errors import (
    ApprovalNotFound,
    ApprovalNotPending,
    ArchiveUnavailable,
    BodyTooLarge,
    BrokerUnavailable,
    CrashsafeError,
    DeadLetterNotFound,
    DeadLetterSettled,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    LeaseConflict,
    RateLimited,
    ReplayRefused,
    RunNotFound,
    RunVersionConflict,
    SessionOfAnotherGuest,
    TurnLimitReached,
    Unauthenticated,
    UnprocessableBody,
)
from crashsafe.contracts.inbound import MAX_BODY_BYTES, GuestMessage, guest_message_decoder
from crashsafe.contracts.keys import inbound_hash, run_id_for

# The one table from error to HTTP status; nothing else picks a status. Keyed by error class, not code, because
# one wire code can need two statuses (invalid_request: 400 unreadable, 422 readable but wrong); the most
# specific class in an error's ancestry wins, and an error that is not listed is a 500.
HTTP_STATUS: dict[type[CrashsafeError], int] = {
    InvalidRequest: 400,
    UnprocessableBody: 422,
    BodyTooLarge: 413,
    IdempotencyConflict: 409,
    RunNotFound: 404,
    BrokerUnavailable: 503,
    ArchiveUnavailable: 503,
    RunVersionConflict: 409,
    Unauthenticated: 401,
    Forbidden: 403,
    RateLimited: 429,
    # An active-runs record many writers fought over for every compare-and-set round: try again shortly.
    LeaseConflict: 503,
    ApprovalNotFound: 404,
    ApprovalNotPending: 409,
    SessionOfAnotherGuest: 409,
    TurnLimitReached: 409,
    DeadLetterNotFound: 404,
    DeadLetterSettled: 409,
    ReplayRefused: 409,
}
UNLISTED = 500


def status_for(error: CrashsafeError) -> int:
    return next((HTTP_STATUS[cls] for cls in type(error).__mro__ if cls in HTTP_STATUS), UNLISTED)


@dataclass(frozen=True, slots=True)
class Admission:
    key: str
    run_id: str
    input_hash: str
    message: GuestMessage


def admit(body: bytes, tenant: str, agent: str) -> Admission:
    """Parse and bind a guest event, for `agent` (the caller resolved `?agent=` against the registry's default),
    to its run; raises typed errors and publishes nothing on bad input."""
    if len(body) > MAX_BODY_BYTES:
        raise BodyTooLarge(size=len(body), limit=MAX_BODY_BYTES)
    try:
        message = guest_message_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise UnprocessableBody(
            f"body does not match the guest event schema: {exc}; fix that field (the body holds event_id,"
            " session_id, guest_id and text, and nothing else)"
        ) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}; send one JSON object") from exc
    key = message.event_id
    return Admission(
        key=key,
        run_id=run_id_for(tenant, key),
        input_hash=inbound_hash(message, agent),
        message=message,
    )


def too_large(content_length: str | None) -> BodyTooLarge | None:
    """The refusal a announced `Content-Length` earns before a byte of the body is read, if any."""
    if content_length is None:
        return None
    try:
        size = int(content_length)
    except ValueError:
        return None  # the HTTP server refuses an unreadable length itself
    return BodyTooLarge(size=size, limit=MAX_BODY_BYTES) if size > MAX_BODY_BYTES else None


def conflict(key: str, run_id: str) -> IdempotencyConflict:
    return IdempotencyConflict(key=key, run_id=run_id)
