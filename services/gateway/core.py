"""The gateway's pure rules: which key a request carries, which run it lands on, how errors map to HTTP."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from contracts.errors import (
    BodyTooLarge,
    BrokerUnavailable,
    CrashsafeError,
    IdempotencyConflict,
    InvalidRequest,
    RunNotFound,
    RunVersionConflict,
    UnprocessableBody,
)
from contracts.inbound import MAX_BODY_BYTES, GuestMessage, guest_message_decoder
from contracts.keys import inbound_hash, run_id_for

MAX_KEY_LENGTH = 200

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
    RunVersionConflict: 409,
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


def admit(body: bytes, idempotency_key: str | None, agent: str = "booking") -> Admission:
    """Parse and bind a guest event to its run; raises typed errors and publishes nothing on bad input."""
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
    key = idempotency_key if idempotency_key is not None else message.event_id
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters; send such a key, or no header to use"
            " the event_id",
            key=key[:MAX_KEY_LENGTH],
        )
    return Admission(
        key=key, run_id=run_id_for(key), input_hash=inbound_hash(message, agent), message=message
    )


def conflict(key: str, run_id: str) -> IdempotencyConflict:
    return IdempotencyConflict(key=key, run_id=run_id)
