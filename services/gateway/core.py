"""The gateway's pure rules: which key a request carries, which run it lands on, how errors map to HTTP."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from contracts.errors import BodyTooLarge, CrashsafeError, ErrorCode, IdempotencyConflict, InvalidRequest
from contracts.inbound import MAX_BODY_BYTES, GuestMessage, guest_message_decoder
from contracts.keys import inbound_hash, run_id_for

MAX_KEY_LENGTH = 200

# One table from error code to HTTP status; nothing else picks a status.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.RUN_NOT_FOUND: 404,
    ErrorCode.BROKER_UNAVAILABLE: 503,
    ErrorCode.RUN_VERSION_CONFLICT: 409,
}
UNPROCESSABLE = 422


class UnprocessableBody(InvalidRequest):
    """Well-formed JSON whose fields are missing, unknown or of the wrong type."""


def status_for(error: CrashsafeError) -> int:
    if isinstance(error, UnprocessableBody):
        return UNPROCESSABLE
    return HTTP_STATUS.get(error.code, 500)


@dataclass(frozen=True, slots=True)
class Admission:
    key: str
    run_id: str
    input_hash: str
    message: GuestMessage


def admit(body: bytes, idempotency_key: str | None, agent: str = "booking") -> Admission:
    """Parse and bind a guest event to its run; raises typed errors and publishes nothing on bad input."""
    if len(body) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}", limit=MAX_BODY_BYTES)
    try:
        message = guest_message_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise UnprocessableBody(f"body does not match the guest event schema: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from exc
    key = idempotency_key if idempotency_key is not None else message.event_id
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters", key=key[:MAX_KEY_LENGTH]
        )
    return Admission(
        key=key, run_id=run_id_for(key), input_hash=inbound_hash(message, agent), message=message
    )


def conflict(key: str, run_id: str) -> CrashsafeError:
    return IdempotencyConflict(
        f"Idempotency-Key {key!r} was already used with a different body; use a new key for a new request",
        key=key,
        run_id=run_id,
    )
