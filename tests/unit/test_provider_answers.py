"""How the executor reads a provider's HTTP answers (services/providers/provider_calls.py): as a careful engineer would.

A failure only from the provider's typed refusal, "absent" only from its typed "no such key", a found record by
its own status, and everything else (5xx, 408, 429, a key in use, a body that is not the provider's) unknown."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain.registry import HttpOperation
from crashsafe.services.agents.booking.booking_tools import CREATE_BOOKING, CREATE_PAYMENT
from crashsafe.services.platform.provider_http import ProviderResponse
from crashsafe.services.providers.http_answers import read_answer, read_lookup, retry_after_s

PAYMENT = CREATE_PAYMENT.operation
BOOKING = CREATE_BOOKING.operation
assert isinstance(PAYMENT, HttpOperation) and isinstance(BOOKING, HttpOperation)

CHARGE = {"payment_id": "pay_1", "amount_cents": 24000, "status": "captured"}
HTML_404 = "<html><body><h1>404 Not Found</h1>nginx</body></html>"


def response(status: int, body: Any = None, text: str | None = None, **headers: str) -> ProviderResponse:
    content = text.encode() if text is not None else b"" if body is None else json.dumps(body).encode()
    return ProviderResponse(status, CIMultiDictProxy(CIMultiDict(headers)), content)


def typed(code: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"type": kind, "code": code, "message": f"{code}!"}}


# Calls --------------------------------------------------------------------------------------------------------


def test_a_success_is_ok_with_the_reference_named_by_the_operation() -> None:
    answer = read_answer(response(201, CHARGE), PAYMENT)
    assert (answer.kind, answer.body, answer.ref) == (Answer.OK, CHARGE, "pay_1")


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (402, typed("card_declined", "card_error"), "card_declined"),
        (409, typed("hotel_unavailable"), "hotel_unavailable"),
        (422, typed("amount_mismatch"), "amount_mismatch"),
        (404, typed("booking_not_found"), "booking_not_found"),
    ],
)
def test_only_the_providers_typed_refusal_is_a_definitive_failure(status: int, body: Any, code: str) -> None:
    answer = read_answer(response(status, body), PAYMENT)
    assert answer.kind == Answer.REJECTED and answer.body["code"] == code


@pytest.mark.parametrize(
    ("status", "body", "text", "said"),
    [
        (503, typed("injected_fault", "api_error"), None, "503"),
        (500, None, "oops", "500"),
        (408, typed("timeout"), None, "408"),
        (425, {}, None, "425"),
        (429, typed("rate_limited", "rate_limit_error"), None, "429"),
        (409, typed("idempotency_key_in_use", "idempotency_error"), None, "still in progress"),
        (404, None, HTML_404, "not JSON"),  # a wrong route or a gateway in front: not the provider speaking
        (404, {"message": "no Route matched with those values"}, None, "not the provider's"),
        (400, {"error": "bad gateway config"}, None, "not the provider's"),
        (200, None, '{"status": "ok", "data": {"id": ', "not JSON"),
        (302, {"location": "/elsewhere"}, None, "not the provider's"),
    ],
)
def test_answers_that_are_not_a_decision_are_unknown(
    status: int, body: Any, text: str | None, said: str
) -> None:
    answer = read_answer(response(status, body, text), PAYMENT)
    assert answer.kind == Answer.UNKNOWN and said in answer.detail, answer


def test_a_charge_answered_as_declined_or_pending_is_read_by_its_status() -> None:
    declined = read_answer(response(200, CHARGE | {"status": "declined"}), PAYMENT)
    assert (declined.kind, declined.body["code"], declined.ref) == (Answer.REJECTED, "declined", "pay_1")
    pending = read_answer(response(202, CHARGE | {"status": "pending"}), PAYMENT)
    assert pending.kind == Answer.UNKNOWN and "pending" in pending.detail
    # A booking has no such statuses: a released one found later is still the booking that was made.
    assert read_answer(response(200, {"booking_id": "bk_1", "status": "released"}), BOOKING).kind == Answer.OK


def test_retry_after_is_read_in_seconds_or_as_a_date_and_bounded() -> None:
    assert (
        read_answer(response(429, typed("rate_limited"), **{"Retry-After": "2"}), PAYMENT).retry_after_s
        == 2.0
    )
    assert retry_after_s(response(429, {}, **{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry_after_s(response(429, {}, **{"Retry-After": "86400"})) == 60.0
    assert retry_after_s(response(429, {}, **{"Retry-After": "soon"})) is None
    assert retry_after_s(response(429, {})) is None


# Lookups ------------------------------------------------------------------------------------------------------


def test_a_found_record_is_read_by_its_own_status() -> None:
    found = read_lookup(response(200, CHARGE), PAYMENT)
    assert (found.kind, found.body, found.ref) == (Answer.FOUND, CHARGE, "pay_1")
    declined = read_lookup(response(200, CHARGE | {"status": "declined"}), PAYMENT)
    assert (declined.kind, declined.ref) == (Answer.REJECTED, "pay_1")
    assert declined.body["record"]["status"] == "declined"
    pending = read_lookup(response(200, CHARGE | {"status": "pending"}), PAYMENT)
    assert pending.kind == Answer.UNKNOWN


def test_absent_only_from_the_providers_typed_no_such_key() -> None:
    assert read_lookup(response(404, typed("key_not_found")), PAYMENT).kind == Answer.ABSENT


@pytest.mark.parametrize(
    ("status", "body", "text"),
    [
        (404, None, HTML_404),  # a gateway's 404
        (404, {"detail": "Not Found"}, None),  # a framework's 404
        (404, typed("not_found"), None),  # the provider's own "no such route": not "no such key"
        (410, typed("key_expired"), None),  # past the retention window: it no longer says
        (503, typed("injected_fault", "api_error"), None),
        (429, typed("rate_limited", "rate_limit_error"), None),
        (200, None, "<html>"),
    ],
)
def test_any_other_lookup_answer_is_unknown(status: int, body: Any, text: str | None) -> None:
    assert read_lookup(response(status, body, text), PAYMENT).kind == Answer.UNKNOWN


def test_a_success_the_provider_says_it_replayed_is_read_as_replayed() -> None:
    """Issue 17: `Idempotent-Replayed: true` says the answer is an earlier request's; the executor never counts
    it as this request's effect."""
    fresh = read_answer(response(201, CHARGE), PAYMENT)
    replayed = read_answer(response(200, CHARGE, **{"Idempotent-Replayed": "true"}), PAYMENT)
    assert (fresh.replayed, replayed.replayed) == (False, True)
    assert (replayed.kind, replayed.body) == (Answer.OK, CHARGE)
