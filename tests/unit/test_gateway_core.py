"""The gateway's pure rules (domain/admission.py): which key a guest event carries, which run it lands on,
and which HTTP status each error becomes. (The gateway over real HTTP: tests/e2e/test_gateway.py.)"""

from __future__ import annotations

import json

import pytest

from crashsafe.contracts.errors import (
    BodyTooLarge,
    BrokerUnavailable,
    CrashsafeError,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    ModelUnavailable,
    RateLimited,
    RunNotFound,
    RunVersionConflict,
    TooManyActiveRuns,
    Unauthenticated,
)
from crashsafe.contracts.inbound import MAX_BODY_BYTES, GuestMessage
from crashsafe.contracts.keys import inbound_hash, run_id_for
from crashsafe.domain.admission import UnprocessableBody, admit, conflict, status_for, too_large
from tests.support.stack import guest_event
from tests.support.world import BOOKING_TEXT


def raw(**fields: object) -> bytes:
    return json.dumps(guest_event("evt-1", **fields)).encode()  # type: ignore[arg-type]


def test_an_event_is_bound_to_the_run_of_its_tenant_and_event_id_and_the_hash_of_its_body() -> None:
    admission = admit(raw(), "acme", "booking")

    assert (admission.key, admission.run_id) == ("evt-1", run_id_for("acme", "evt-1"))
    assert admission.message == GuestMessage(
        event_id="evt-1", session_id="s-evt-1", guest_id="guest-1", text=BOOKING_TEXT
    )
    assert admission.input_hash == inbound_hash(admission.message, "booking")
    assert admit(raw(), "acme", agent="steps5").input_hash == inbound_hash(admission.message, "steps5")
    # Another tenant's same event id is another run.
    assert admit(raw(), "globex", "booking").run_id != admission.run_id


@pytest.mark.parametrize(
    ("body", "error", "status"),
    [
        pytest.param(b'{"event_id": ', InvalidRequest, 400, id="malformed-json"),
        pytest.param(raw(guest_id=42), UnprocessableBody, 422, id="wrong-type"),
        pytest.param(raw(amount_cents=1), UnprocessableBody, 422, id="unknown-field"),
        pytest.param(b" " * (MAX_BODY_BYTES + 1), BodyTooLarge, 413, id="too-large"),
    ],
)
def test_bad_input_is_a_typed_error_with_its_status(
    body: bytes, error: type[CrashsafeError], status: int
) -> None:
    with pytest.raises(error) as refused:
        admit(body, "acme", "booking")
    assert type(refused.value) is error and status_for(refused.value) == status


def test_one_table_maps_every_other_error_to_its_status() -> None:
    assert status_for(conflict("evt-1", "run_x")) == 409
    assert isinstance(conflict("evt-1", "run_x"), IdempotencyConflict)
    assert conflict("evt-1", "run_x").details() == {"key": "evt-1", "run_id": "run_x"}
    assert status_for(RunNotFound("no run", run_id="run_x")) == 404
    assert status_for(RunVersionConflict(subject="crashsafe.run.run_x", expected_seq=3)) == 409
    assert status_for(BrokerUnavailable("no JetStream")) == 503
    assert status_for(ModelUnavailable("model down")) == 500  # not the gateway's to answer: no entry


def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_413_with_the_sizes() -> None:
    body = raw()
    at_limit = body + b" " * (MAX_BODY_BYTES - len(body))  # trailing whitespace is still one JSON object
    assert len(at_limit) == MAX_BODY_BYTES and admit(at_limit, "acme", "booking").key == "evt-1"
    with pytest.raises(BodyTooLarge) as refused:
        admit(at_limit + b" ", "acme", "booking")
    assert refused.value.details() == {"size": MAX_BODY_BYTES + 1, "limit": MAX_BODY_BYTES}


def test_an_announced_length_over_the_limit_is_refused_before_the_body_is_read() -> None:
    assert too_large(None) is None and too_large(str(MAX_BODY_BYTES)) is None and too_large("x") is None
    refused = too_large(str(10 * 1024 * 1024))
    assert refused is not None and status_for(refused) == 413
    assert refused.details() == {"size": 10 * 1024 * 1024, "limit": MAX_BODY_BYTES}


def test_client_errors_have_their_statuses() -> None:
    assert status_for(Unauthenticated("missing")) == 401
    assert status_for(Forbidden(scope="runs:operate", key_id="0" * 16)) == 403
    assert status_for(RateLimited(limit="client", retry_after_s=0.5)) == 429
    assert status_for(TooManyActiveRuns(limit="guest", cap=3, retry_after_s=12.0)) == 429
