"""The sandbox's HTTP shell over real HTTP: idempotent providers with by-key lookup, faults, the scripted model
behind the real `openai` client. (The pure cores are tested in tests/unit/test_sandbox_rules.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from crashsafe.sandbox.app import serve
from tests.support.inprocess import sandbox_server
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT as LISBON
from tests.support.world import BOOKING_TOOLS as TOOL_NAMES
from tests.support.world import OFFERED_TOOLS as TOOLS
from tests.support.world import Sandbox


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sandbox_url() -> AsyncIterator[str]:
    async with sandbox_server() as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def http(sandbox_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sandbox_url, timeout=5) as client:
        yield client
        await Sandbox(client, sandbox_url).clear_faults()


@pytest_asyncio.fixture(loop_scope="session")
def sandbox(http: httpx.AsyncClient, sandbox_url: str) -> Sandbox:
    """The operator's view of the same sandbox: its ledger of effects."""
    return Sandbox(http, sandbox_url)


async def book(http: httpx.AsyncClient, guest: str, key: str | None = None) -> dict[str, Any]:
    body = {"hotel_id": "lis-1", "guest_id": guest, "check_in": "2031-12-01", "check_out": "2031-12-03"}
    response = await http.post("/bookings", json=body, headers={"Idempotency-Key": key or unique("bk")})
    assert response.status_code == 201, response.text
    booking: dict[str, Any] = response.json()
    return booking


async def test_http_search_returns_hotels_with_availability(http: httpx.AsyncClient) -> None:
    response = await http.get(
        "/hotels/search", params={"city": "paris", "check_in": "2031-12-01", "check_out": "2031-12-02"}
    )
    assert response.status_code == 200
    hotels = response.json()["hotels"]
    assert hotels[0] == {
        "hotel_id": "par-1",
        "name": "Hotel Rive Gauche",
        "city": "Paris",
        "nightly_rate_cents": 16000,
        "currency": "EUR",
        "available": True,
    }
    assert [h["available"] for h in hotels] == [True, True, False]
    bad = await http.get(
        "/hotels/search", params={"city": "Paris", "check_in": "2031-12-02", "check_out": "2031-12-01"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_dates"


async def test_http_idempotent_replay_conflict_and_lookup(http: httpx.AsyncClient, sandbox: Sandbox) -> None:
    guest, key = unique("guest"), unique("key")
    body = {"hotel_id": "lis-1", "guest_id": guest, "check_in": "2031-12-01", "check_out": "2031-12-03"}
    created = await http.post("/bookings", json=body, headers={"Idempotency-Key": key})
    assert created.status_code == 201 and "idempotent-replayed" not in created.headers
    assert created.json() | {"booking_id": None} == {
        "booking_id": None,
        "hotel_id": "lis-1",
        "hotel_name": "Casa do Alfama",
        "city": "Lisbon",
        "guest_id": guest,
        "check_in": "2031-12-01",
        "check_out": "2031-12-03",
        "nights": 2,
        "total_cents": 24000,
        "currency": "EUR",
        "status": "held",
        "key": key,
    }
    replay = await http.post("/bookings", json=dict(reversed(body.items())), headers={"Idempotency-Key": key})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == created.json()

    conflict = await http.post(
        "/bookings", json=body | {"hotel_id": "lis-2"}, headers={"Idempotency-Key": key}
    )
    assert conflict.status_code == 409
    assert (
        conflict.json()["error"]["code"] == "idempotency_conflict" and conflict.json()["error"]["key"] == key
    )

    found = await http.get(f"/bookings/by-key/{key}")
    assert found.status_code == 200 and found.json() == created.json()
    missing = await http.get(f"/bookings/by-key/{unique('never')}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "key_not_found"

    ledger = await sandbox.ledger(guest)
    assert ledger["counts"]["booking"] == 1 and [e["kind"] for e in ledger["entries"]] == ["booking"]


async def test_http_refusals_have_one_error_shape(http: httpx.AsyncClient) -> None:
    guest = unique("guest")
    keyless = await http.post("/bookings", json={"hotel_id": "lis-1"})
    assert keyless.status_code == 400 and keyless.json()["error"]["code"] == "missing_idempotency_key"
    invalid = await http.post(
        "/bookings", json={"hotel_id": "lis-1"}, headers={"Idempotency-Key": unique("k")}
    )
    assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "invalid_request"
    unknown = await http.post(
        "/bookings",
        json={"hotel_id": "xx-9", "guest_id": guest, "check_in": "2031-12-01", "check_out": "2031-12-02"},
        headers={"Idempotency-Key": unique("k")},
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "hotel_not_found"
    booking = await book(http, guest)
    wrong = await http.post(
        "/payments",
        json={"booking_id": booking["booking_id"], "guest_id": guest, "amount_cents": 100, "currency": "EUR"},
        headers={"Idempotency-Key": unique("p")},
    )
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "amount_mismatch"


async def test_http_payment_refund_release_email_and_crm(http: httpx.AsyncClient, sandbox: Sandbox) -> None:
    guest = unique("guest")
    booking = await book(http, guest)
    pay_key = unique("p")
    payment = await http.post(
        "/payments",
        json={
            "booking_id": booking["booking_id"],
            "guest_id": guest,
            "amount_cents": 24000,
            "currency": "EUR",
        },
        headers={"Idempotency-Key": pay_key},
    )
    assert payment.status_code == 201
    assert payment.json() | {"payment_id": None} == {
        "payment_id": None,
        "booking_id": booking["booking_id"],
        "guest_id": guest,
        "amount_cents": 24000,
        "currency": "EUR",
        "status": "captured",
        "key": pay_key,
    }
    assert (await http.get(f"/payments/by-key/{pay_key}")).json() == payment.json()
    refund_key = unique("r")
    refund = await http.post(
        f"/payments/{payment.json()['payment_id']}/refund",
        json={"amount_cents": 24000},
        headers={"Idempotency-Key": refund_key},
    )
    assert refund.status_code == 201 and refund.json()["status"] == "succeeded"
    assert (await http.get(f"/refunds/by-key/{refund_key}")).json()["refund_id"] == refund.json()["refund_id"]
    release_key = unique("rel")
    released = await http.post(
        f"/bookings/{booking['booking_id']}/release", headers={"Idempotency-Key": release_key}
    )
    assert released.status_code == 200 and released.json()["status"] == "released"
    assert (await http.get(f"/booking-releases/by-key/{release_key}")).json()["status"] == "released"
    email_key, crm_key = unique("e"), unique("c")
    email = await http.post(
        "/emails",
        json={"guest_id": guest, "template": "booking_confirmation", "booking_id": booking["booking_id"]},
        headers={"Idempotency-Key": email_key},
    )
    assert email.status_code == 201 and email.json()["email_id"].startswith("em_")
    crm = await http.post(
        "/crm/updates",
        json={"guest_id": guest, "booking_id": booking["booking_id"], "fields": {"vip": True}},
        headers={"Idempotency-Key": crm_key},
    )
    assert crm.status_code == 201 and crm.json()["fields"] == {"vip": True}
    assert (await http.get(f"/emails/by-key/{email_key}")).status_code == 200
    assert (await http.get(f"/crm/updates/by-key/{crm_key}")).status_code == 200
    counts = (await sandbox.ledger(guest))["counts"]
    assert counts == {
        "booking": 1,
        "booking_release": 1,
        "charge": 1,
        "refund": 1,
        "email": 1,
        "crm_update": 1,
    }


async def test_http_a_guests_payments_list_only_theirs_with_what_is_refunded_and_over_refunds_are_refused(
    http: httpx.AsyncClient,
) -> None:
    guest, other = unique("guest"), unique("guest")
    booking = await book(http, guest)
    await book(http, other)
    body = {"booking_id": booking["booking_id"], "guest_id": guest, "amount_cents": 24000, "currency": "EUR"}
    paid = (await http.post("/payments", json=body, headers={"Idempotency-Key": unique("p")})).json()
    refund_path = f"/payments/{paid['payment_id']}/refund"
    part = await http.post(refund_path, json={"amount_cents": 4000}, headers={"Idempotency-Key": unique("r")})
    assert part.status_code == 201
    listed = await http.get("/payments", params={"guest_id": guest})
    assert listed.status_code == 200
    assert listed.json() == {
        "payments": [
            {
                "payment_id": paid["payment_id"],
                "booking_id": booking["booking_id"],
                "guest_id": guest,
                "amount_cents": 24000,
                "currency": "EUR",
                "status": "captured",
                "refunded_cents": 4000,
            }
        ]
    }
    assert (await http.get("/payments", params={"guest_id": other})).json() == {"payments": []}
    assert (await http.get("/payments")).status_code == 422  # whose payments: always named
    over = await http.post(
        refund_path, json={"amount_cents": 20001}, headers={"Idempotency-Key": unique("r")}
    )
    assert over.status_code == 422 and over.json()["error"]["code"] == "refund_exceeds_payment"
    assert "20000 cents left to refund" in over.json()["error"]["message"]


async def test_http_fail_5xx_refuses_without_committing(http: httpx.AsyncClient) -> None:
    guest, key = unique("guest"), unique("k")
    armed = await http.put("/_faults", json={"target": "bookings", "fail_5xx": 1})
    assert armed.json()["faults"]["bookings"]["fail_5xx"] == 1
    body = {"hotel_id": "lis-1", "guest_id": guest, "check_in": "2031-12-01", "check_out": "2031-12-03"}
    failed = await http.post("/bookings", json=body, headers={"Idempotency-Key": key})
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "injected_fault"
    assert (await http.get(f"/bookings/by-key/{key}")).status_code == 404
    assert (await http.post("/bookings", json=body, headers={"Idempotency-Key": key})).status_code == 201
    assert (await http.get("/_faults")).json() == {"faults": {}, "in_flight": []}


async def test_http_drop_after_commit_loses_the_response_but_not_the_charge(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest = unique("guest")
    booking = await book(http, guest)
    await http.put("/_faults", json={"target": "payments", "drop_after_commit": 1})
    key = unique("p")
    body = {"booking_id": booking["booking_id"], "guest_id": guest, "amount_cents": 24000, "currency": "EUR"}
    started = time.perf_counter()
    with pytest.raises(httpx.RemoteProtocolError):  # the connection is aborted, no HTTP response at all
        await http.post("/payments", json=body, headers={"Idempotency-Key": key}, timeout=1)
    assert time.perf_counter() - started < 1

    ledger = await sandbox.ledger(guest)
    assert ledger["counts"]["charge"] == 1
    found = await http.get(f"/payments/by-key/{key}")
    assert found.status_code == 200 and found.json()["amount_cents"] == 24000
    # The keyed retry a careful caller makes is answered from the store: still one charge.
    retry = await http.post("/payments", json=body, headers={"Idempotency-Key": key})
    assert retry.status_code == 200 and retry.headers["Idempotent-Replayed"] == "true"
    assert (await sandbox.ledger(guest))["counts"]["charge"] == 1


async def test_http_malformed_and_latency_faults(http: httpx.AsyncClient) -> None:
    guest = unique("guest")
    booking = await book(http, guest)
    await http.put("/_faults", json={"target": "emails", "malformed": 1})
    key = unique("e")
    body = {"guest_id": guest, "template": "booking_confirmation", "booking_id": booking["booking_id"]}
    garbled = await http.post("/emails", json=body, headers={"Idempotency-Key": key})
    assert garbled.status_code == 200
    with pytest.raises(ValueError):
        garbled.json()
    assert (await http.get(f"/emails/by-key/{key}")).status_code == 200  # committed all the same

    await http.put("/_faults", json={"target": "search", "latency_ms": 150})
    started = time.perf_counter()
    assert (await http.get("/hotels/search", params={"city": "Lisbon"})).status_code == 200
    assert time.perf_counter() - started >= 0.15

    bad = await http.put("/_faults", json={"target": "nowhere", "fail_5xx": 1})
    assert bad.status_code == 422


async def test_http_wildcard_faults_leave_lookups_alone(http: httpx.AsyncClient) -> None:
    await http.put("/_faults", json={"target": "*", "fail_5xx": 1})
    assert (await http.get(f"/payments/by-key/{unique('none')}")).status_code == 404
    assert (await http.get("/hotels/search", params={"city": "Berlin"})).status_code == 503
    assert (await http.get("/hotels/search", params={"city": "Berlin"})).status_code == 200
    cleared = await http.delete("/_faults")
    assert cleared.status_code == 200 and cleared.json() == {"faults": {}}


async def test_openai_client_drives_the_scripted_conversation_end_to_end(
    sandbox_url: str, http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest = unique("guest")
    client = openai.AsyncOpenAI(base_url=f"{sandbox_url}/v1", api_key="sandbox", max_retries=0)
    items: list[dict[str, Any]] = [{"role": "user", "content": LISBON}]
    tools_called: list[str] = []
    try:
        first = await client.responses.create(model="scripted-booking", input=items, tools=TOOLS)  # type: ignore[arg-type]
        assert first.output[0].type == "function_call"
        assert first.output[0].name == "search_hotels"
        assert json.loads(first.output[0].arguments) == {
            "city": "Lisbon",
            "check_in": "2031-12-01",
            "check_out": "2031-12-03",
        }
        assert first.usage is not None and first.usage.total_tokens > 0 and first.output_text == ""
        response = first
        for step in range(8):
            call = response.output[0]
            if call.type != "function_call":
                break
            tools_called.append(call.name)
            output = await execute(http, guest, f"{guest}:{step}", call.name, json.loads(call.arguments))
            items += [
                call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(output)},
            ]
            response = await client.responses.create(model="scripted-booking", input=items, tools=TOOLS)  # type: ignore[arg-type]
    finally:
        await client.close()

    assert tools_called == TOOL_NAMES
    assert response.output[0].type == "message"
    assert response.output_text.startswith(
        "Your room at Casa do Alfama in Lisbon from 2031-12-01 to 2031-12-03"
    )
    assert "(EUR 240.00)" in response.output_text
    assert response.output_text.endswith("The confirmation email is on its way.")
    ledger = await sandbox.ledger(guest)
    assert ledger["counts"] == {  # the email and the CRM record are the projector's, after the run
        "booking": 1,
        "booking_release": 0,
        "charge": 1,
        "refund": 0,
        "email": 0,
        "crm_update": 0,
    }
    models = await http.get("/v1/models")
    assert models.json()["data"][0]["id"] == "scripted-booking"


async def execute(http: httpx.AsyncClient, guest: str, key: str, name: str, args: dict[str, Any]) -> Any:
    """A minimal executor: the server side fills in guest and amount, never the model."""
    send: dict[str, Callable[[], Any]] = {
        "search_hotels": lambda: http.get("/hotels/search", params=args),
        "create_booking": lambda: http.post(
            "/bookings", json=args | {"guest_id": guest}, headers={"Idempotency-Key": key}
        ),
    }
    if name == "create_payment":
        booking = (await http.get(f"/bookings/by-key/{guest}:1")).json()
        body = {
            "booking_id": args["booking_id"],
            "guest_id": guest,
            "amount_cents": booking["total_cents"],
            "currency": "EUR",
        }
        return (await http.post("/payments", json=body, headers={"Idempotency-Key": key})).json()
    return (await send[name]()).json()


async def test_model_endpoint_refuses_streaming_and_bad_input(http: httpx.AsyncClient) -> None:
    streaming = await http.post(
        "/v1/responses", json={"model": "scripted-booking", "input": "hi", "stream": True}
    )
    assert streaming.status_code == 400 and streaming.json()["error"]["code"] == "streaming_unsupported"
    bad = await http.post("/v1/responses", json={"model": "scripted-booking", "input": 42})
    assert bad.status_code == 422
    text = await http.post("/v1/responses", json={"model": "m", "input": "hello"})
    assert text.status_code == 200 and text.json()["model"] == "m"


async def test_reset_clears_state_and_faults(http: httpx.AsyncClient, sandbox: Sandbox) -> None:
    key = unique("k")
    await book(http, unique("guest"), key)
    await http.put("/_faults", json={"target": "model", "latency_ms": 10})
    assert (await http.post("/_reset")).json() == {"reset": True}
    assert (await http.get(f"/bookings/by-key/{key}")).status_code == 404
    assert (await http.get("/_faults")).json() == {"faults": {}, "in_flight": []}
    assert (await sandbox.ledger())["entries"] == []


# Stripe-grade semantics: keys in flight, callers that hang up, refusals in front, records with a status -------


async def pay_body(http: httpx.AsyncClient, guest: str) -> dict[str, Any]:
    booking = await book(http, guest)
    return {"booking_id": booking["booking_id"], "guest_id": guest, "amount_cents": 24000, "currency": "EUR"}


async def test_http_a_key_in_flight_answers_409_in_use_and_the_first_request_still_wins(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest = unique("guest")
    body, key = await pay_body(http, guest), unique("p")
    await sandbox.arm("payments", commit_delay_ms=1500)  # both arrive while the first holds the key

    answers = await asyncio.gather(
        *(http.post("/payments", json=body, headers={"Idempotency-Key": key}) for _ in range(2))
    )

    in_use, made = sorted(answers, key=lambda r: -r.status_code)
    assert (in_use.status_code, made.status_code) == (409, 201)
    error = in_use.json()["error"]
    assert (error["type"], error["code"], error["key"]) == (
        "idempotency_error",
        "idempotency_key_in_use",
        key,
    )
    assert (await sandbox.ledger(guest))["counts"]["charge"] == 1
    await sandbox.clear_faults()
    after = await http.post("/payments", json=body, headers={"Idempotency-Key": key})
    assert after.status_code == 200 and after.headers["Idempotent-Replayed"] == "true"


async def test_http_a_write_whose_caller_hung_up_still_commits(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest = unique("guest")
    body, key = await pay_body(http, guest), unique("p")
    await sandbox.arm("payments", commit_delay_ms=500)
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/payments", json=body, headers={"Idempotency-Key": key}, timeout=0.1)
    assert (await http.get(f"/payments/by-key/{key}")).status_code == 404  # not yet: the commit is slow

    found = await eventually(
        lambda: _found(http, f"/payments/by-key/{key}"), what="the abandoned charge to commit", timeout_s=10
    )
    assert found["amount_cents"] == 24000
    assert (await sandbox.ledger(guest))["counts"]["charge"] == 1


async def _found(http: httpx.AsyncClient, path: str) -> dict[str, Any] | None:
    response = await http.get(path)
    return dict(response.json()) if response.status_code == 200 else None


async def test_http_throttle_answers_429_with_retry_after_and_does_nothing(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest = unique("guest")
    body, key = await pay_body(http, guest), unique("p")
    await sandbox.arm("payments", throttle=1, retry_after_s=2)
    throttled = await http.post("/payments", json=body, headers={"Idempotency-Key": key})
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
    assert throttled.json()["error"]["type"] == "rate_limit_error"
    assert (await sandbox.ledger(guest))["counts"]["charge"] == 0
    assert (await http.post("/payments", json=body, headers={"Idempotency-Key": key})).status_code == 201


async def test_http_a_gateway_404_is_not_the_providers_answer(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    key = unique("k")
    await book(http, unique("guest"), key)
    await sandbox.arm("lookups", route_404=1)
    gateway = await http.get(f"/bookings/by-key/{key}")
    assert gateway.status_code == 404 and gateway.headers["content-type"].startswith("text/html")
    with pytest.raises(ValueError):
        gateway.json()
    assert (await http.get(f"/bookings/by-key/{key}")).status_code == 200


async def test_http_declined_and_pending_charges_are_records_with_their_own_status(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest = unique("guest")
    body = await pay_body(http, guest)
    await sandbox.arm("payments", decline=1)
    declined_key = unique("p")
    declined = await http.post("/payments", json=body, headers={"Idempotency-Key": declined_key})
    assert declined.status_code == 402
    assert (declined.json()["error"]["type"], declined.json()["error"]["code"]) == (
        "card_error",
        "card_declined",
    )
    record = await http.get(f"/payments/by-key/{declined_key}")
    assert record.status_code == 200 and record.json()["status"] == "declined"
    replay = await http.post("/payments", json=body, headers={"Idempotency-Key": declined_key})
    assert replay.status_code == 402 and replay.headers["Idempotent-Replayed"] == "true"

    await sandbox.arm("payments", pending=1, pending_ms=300)
    pending_key = unique("p")
    pending = await http.post("/payments", json=body, headers={"Idempotency-Key": pending_key})
    assert pending.status_code == 202 and pending.json()["status"] == "pending"

    async def captured() -> bool:
        return (await http.get(f"/payments/by-key/{pending_key}")).json()["status"] == "captured"

    await eventually(captured, what="the pending charge to settle", timeout_s=10)
    assert (await sandbox.ledger(guest))["counts"]["charge"] == 1  # the declined one moved no money


async def test_http_a_lagging_lookup_says_no_such_key_for_a_while(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    await sandbox.arm("lookups", lookup_lag_ms=400)
    key = unique("k")
    await book(http, unique("guest"), key)
    lagging = await http.get(f"/bookings/by-key/{key}")
    assert lagging.status_code == 404 and lagging.json()["error"]["code"] == "key_not_found"
    await eventually(
        lambda: _found(http, f"/bookings/by-key/{key}"), what="the lookup to catch up", timeout_s=10
    )


async def test_http_a_lookup_past_the_retention_window_says_the_key_expired() -> None:
    async with short_memory_sandbox() as url, httpx.AsyncClient(base_url=url, timeout=5) as http:
        key = unique("k")
        await book(http, unique("guest"), key)
        assert (await http.get(f"/bookings/by-key/{key}")).status_code == 200

        async def expired() -> httpx.Response | None:
            response = await http.get(f"/bookings/by-key/{key}")
            return response if response.status_code == 410 else None

        gone = await eventually(expired, what="the key to expire", timeout_s=10)
        assert gone.json()["error"]["code"] == "key_expired"


@contextlib.asynccontextmanager
async def short_memory_sandbox() -> AsyncIterator[str]:
    """A sandbox that keeps keys for half a second."""
    async with own_sandbox(key_retention=timedelta(seconds=0.5)) as url:
        yield url


@contextlib.asynccontextmanager
async def own_sandbox(**options: Any) -> AsyncIterator[str]:
    """A sandbox of this test's own (`data_dir=`: durable there; cancelled at the end: a stopped provider)."""
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(port=0, ready=ready.set_result, **options))
    await asyncio.wait([server, ready], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    try:
        yield f"http://127.0.0.1:{ready.result()}"
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


async def test_http_an_email_goes_where_the_request_says_or_to_the_address_of_record(
    http: httpx.AsyncClient,
) -> None:
    guest = unique("guest")
    booking = await book(http, guest)
    body = {"guest_id": guest, "template": "booking_confirmation", "booking_id": booking["booking_id"]}
    verified = await http.post(
        "/emails", json={**body, "to": "ana@example.com"}, headers={"Idempotency-Key": unique("e")}
    )
    of_record = await http.post("/emails", json=body, headers={"Idempotency-Key": unique("e")})
    assert (verified.status_code, verified.json()["to"]) == (201, "ana@example.com")
    assert (of_record.status_code, of_record.json()["to"]) == (201, None)


def audit_record(run_id: str, n: int, kind: str = "run.nudged", **fields: Any) -> dict[str, Any]:
    return {
        "event_id": f"{run_id}/{n}",
        "run_id": run_id,
        "tenant": "stayhub",
        "type": kind,
        "at": f"2026-01-01T00:00:{n:02d}.000Z",
        "event": {"type": kind, "run_id": run_id, **fields},
    }


def audit_batch(run_id: str, upto: int, guest: str) -> dict[str, Any]:
    first = audit_record(run_id, 1, "run.started", guest_id=guest)
    return {"records": [first, *(audit_record(run_id, n) for n in range(2, upto + 1))]}


async def crm_update(http: httpx.AsyncClient, guest: str, booking_id: str, key: str) -> httpx.Response:
    body = {"guest_id": guest, "booking_id": booking_id, "fields": {"stage": "paid"}}
    return await http.post("/crm/updates", json=body, headers={"Idempotency-Key": key})


async def test_http_each_receiver_given_the_same_delivery_twice_keeps_one_record(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    """Email by message key, CRM by (guest, booking) even under another key, audit by event id."""
    guest, run_id = unique("guest"), unique("run")
    booking = await book(http, guest)
    email = {"guest_id": guest, "template": "booking_confirmation", "booking_id": booking["booking_id"]}
    email_key = unique("email")
    sent = [await http.post("/emails", json=email, headers={"Idempotency-Key": email_key}) for _ in (1, 2)]
    assert [r.status_code for r in sent] == [201, 200] and sent[1].headers["Idempotent-Replayed"] == "true"
    crm = [await crm_update(http, guest, booking["booking_id"], key) for key in (unique("c"), unique("c"))]
    assert [r.status_code for r in crm] == [201, 200] and crm[1].json() == crm[0].json()
    audit = [await http.post("/audit/records", json=audit_batch(run_id, 3, guest)) for _ in (1, 2)]
    assert [(r.status_code, r.json()) for r in audit] == [
        (200, {"accepted": 3, "duplicates": 0}),
        (200, {"accepted": 0, "duplicates": 3}),
    ]

    ledger = await sandbox.ledger(guest)
    assert (ledger["counts"]["email"], ledger["counts"]["crm_update"], ledger["audit_records"]) == (1, 1, 3)
    held = await sandbox.audit_records(run_id)
    assert [r["event_id"] for r in held] == [f"{run_id}/{n}" for n in (1, 2, 3)]
    assert held[0]["event"] == {"type": "run.started", "run_id": run_id, "guest_id": guest}


async def test_http_the_audit_trail_refuses_an_event_id_with_another_body_and_stores_nothing_of_it(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest, run_id = unique("guest"), unique("run")
    assert (await http.post("/audit/records", json=audit_batch(run_id, 2, guest))).status_code == 200
    forged = audit_record(run_id, 2, "run.completed")
    clash = await http.post("/audit/records", json={"records": [audit_record(run_id, 3), forged]})
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "event_id_conflict"
    assert clash.json()["error"]["event_id"] == f"{run_id}/2"
    assert [r["event_id"] for r in await sandbox.audit_records(run_id)] == [f"{run_id}/1", f"{run_id}/2"]
    # Not the audit trail's shape, or an event id naming no position of its run: refused, nothing stored.
    for body in ({"records": [{"event_id": "x"}]}, {"records": [audit_record(run_id, 0)]}, [1, 2]):
        refused = await http.post("/audit/records", json=body)
        assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_request")
    assert (await http.get("/audit/records")).status_code == 422  # which run's records: say so
    assert await sandbox.audit_records(unique("run")) == []


async def test_http_audit_faults_refuse_before_storing_and_drops_store_once(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    guest, run_id = unique("guest"), unique("run")
    await sandbox.arm("audit", fail_5xx=1, throttle=1, retry_after_s=3)
    assert (await http.post("/audit/records", json=audit_batch(run_id, 2, guest))).status_code == 503
    throttled = await http.post("/audit/records", json=audit_batch(run_id, 2, guest))
    assert (throttled.status_code, throttled.headers["Retry-After"]) == (429, "3")
    assert await sandbox.audit_records(run_id) == []
    await sandbox.arm("audit", drop_after_commit=1)
    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/audit/records", json=audit_batch(run_id, 2, guest))
    again = await http.post("/audit/records", json=audit_batch(run_id, 2, guest))
    assert again.json() == {"accepted": 0, "duplicates": 2}  # the dropped answer's records were kept once


async def test_http_a_restarted_sandbox_still_deduplicates_email_crm_and_audit(tmp_path: Path) -> None:
    guest, run_id = unique("guest"), unique("run")
    email_key = unique("email")
    async with own_sandbox(data_dir=tmp_path) as url, httpx.AsyncClient(base_url=url, timeout=5) as http:
        booking = await book(http, guest)
        email = {"guest_id": guest, "template": "booking_confirmation", "booking_id": booking["booking_id"]}
        first_email = await http.post("/emails", json=email, headers={"Idempotency-Key": email_key})
        first_crm = await crm_update(http, guest, booking["booking_id"], unique("c"))
        assert (await http.post("/audit/records", json=audit_batch(run_id, 2, guest))).status_code == 200
    async with own_sandbox(data_dir=tmp_path) as url, httpx.AsyncClient(base_url=url, timeout=5) as http:
        reborn = Sandbox(http, url)
        email_again = await http.post("/emails", json=email, headers={"Idempotency-Key": email_key})
        assert (email_again.status_code, email_again.json()) == (200, first_email.json())
        crm_again = await crm_update(http, guest, booking["booking_id"], unique("c"))
        assert (crm_again.status_code, crm_again.json()) == (200, first_crm.json())
        audit_again = await http.post("/audit/records", json=audit_batch(run_id, 4, guest))
        assert audit_again.json() == {"accepted": 2, "duplicates": 2}
        forged = {"records": [audit_record(run_id, 1, "run.completed")]}
        assert (await http.post("/audit/records", json=forged)).status_code == 409
        ledger = await reborn.ledger(guest)
        assert (ledger["counts"]["email"], ledger["counts"]["crm_update"], ledger["audit_records"]) == (
            1,
            1,
            4,
        )


async def test_http_concurrent_deliveries_of_one_projection_keep_one_record(
    http: httpx.AsyncClient, sandbox: Sandbox
) -> None:
    """Two projector replicas (or a redelivery racing the first attempt): overlapping audit batches and CRM
    updates under two keys, all at once, still leave each event id once and one CRM record."""
    guest, run_id = unique("guest"), unique("run")
    booking = await book(http, guest)
    batches = [audit_batch(run_id, upto, guest) for upto in (3, 5, 4, 5)]
    answers = await asyncio.gather(*(http.post("/audit/records", json=b) for b in batches))
    assert all(a.status_code == 200 for a in answers)
    assert sum(a.json()["accepted"] for a in answers) == 5
    assert [r["event_id"] for r in await sandbox.audit_records(run_id)] == [
        f"{run_id}/{n}" for n in range(1, 6)
    ]
    updates = await asyncio.gather(
        *(crm_update(http, guest, booking["booking_id"], unique("c")) for _ in range(4))
    )
    assert sorted(u.status_code for u in updates) == [200, 200, 200, 201]
    assert len({u.json()["crm_update_id"] for u in updates}) == 1
    assert (await sandbox.counts(guest))["crm_update"] == 1


async def test_http_a_key_is_looked_up_in_its_own_account_only(sandbox_url: str) -> None:
    """A real provider's idempotency keys live in an account: a lookup by key in another account (or in the
    default one) finds nothing of it. The executor's, the provider view's and the audit's lookups of a tenant's
    key therefore act in the request's account (`Provider-Account` from its arguments), as its write did:
    asked in the default account, a tenant's charge would read as never made (issue 17, guarantee 8)."""
    from crashsafe.contracts.tool_messages import Answer
    from crashsafe.services.agents import stayhub
    from crashsafe.services.providers.provider_calls import Providers

    key = unique("bk")
    body = {"hotel_id": "lis-1", "guest_id": "alice", "check_in": "2031-12-01", "check_out": "2031-12-03"}
    async with httpx.AsyncClient(base_url=sandbox_url, timeout=5) as http:
        made = await http.post(
            "/bookings", json=body, headers={"Idempotency-Key": key, "Provider-Account": "demo"}
        )
        assert made.status_code == 201, made.text
        path = f"/bookings/by-key/{key}"
        assert (await http.get(path, headers={"Provider-Account": "demo"})).status_code == 200
        assert (await http.get(path, headers={"Provider-Account": "evil"})).status_code == 404
        assert (await http.get(path)).status_code == 404
    tool = stayhub().tools["create_booking"]
    async with Providers.connect(sandbox_url) as providers:
        ours = await providers.lookup(tool, key, 5.0, {"account": "demo", "guest_id": "alice"})
        theirs = await providers.lookup(tool, key, 5.0, {"account": "evil", "guest_id": "alice"})
    assert ours.kind == Answer.FOUND and ours.body.get("booking_id") == made.json()["booking_id"]
    assert theirs.kind == Answer.ABSENT


async def test_http_a_tenants_calls_never_see_or_touch_the_default_accounts_record_of_the_same_guest(
    http: httpx.AsyncClient, sandbox_url: str
) -> None:
    """A guest paid in the providers' default account (no `Provider-Account`: a run from before tenants, the
    hotel's own site). A tenant's run of the same guest id, through the executor's own calls and lookups (its
    arguments name its account), lists none of it, cannot refund it, and reads its key as never written there."""
    from datetime import UTC, datetime

    from crashsafe.contracts.tool_messages import ActionRequest, Answer
    from crashsafe.services.agents import stayhub
    from crashsafe.services.providers.provider_calls import Providers

    guest = unique("guest")
    booking = await book(http, guest)
    charge_key = unique("pay")
    paid = await http.post(
        "/payments",
        json={"booking_id": booking["booking_id"], "guest_id": guest, "amount_cents": booking["total_cents"]},
        headers={"Idempotency-Key": charge_key},
    )
    assert paid.status_code == 201 and "account" not in paid.json(), paid.text
    payment_id = paid.json()["payment_id"]
    tools = stayhub().tools

    def asked(tool: str, step: int, **args: Any) -> ActionRequest:
        now = datetime.now(UTC)
        return ActionRequest(
            run_id="run_demo",
            step_no=step,
            tool=tool,
            family=tools[tool].contract.family,
            args={**args, "account": "demo"},
            key=f"run_demo:{step}:{unique('k')}",
            input_hash="h",
            timeout_s=5.0,
            deadline_at=now + timedelta(seconds=30),
            requested_at=now,
        )

    async with Providers.connect(sandbox_url) as providers:
        found = await providers.call(tools["find_payments"], asked("find_payments", 1, guest_id=guest), 5.0)
        refund = asked("refund_payment", 2, payment_id=payment_id, amount_cents=100, guest_id=guest)
        refunded = await providers.call(tools["refund_payment"], refund, 5.0)
        charge = await providers.lookup(tools["create_payment"], charge_key, 5.0, {"account": "demo"})
        own = await providers.lookup(tools["create_payment"], charge_key, 5.0, {})
    assert (found.kind, found.body) == (Answer.OK, {"payments": []})
    assert refunded.kind == Answer.REJECTED and refunded.body["code"] == "payment_not_found"
    assert charge.kind == Answer.ABSENT
    assert own.kind == Answer.FOUND and own.body["payment_id"] == payment_id, (
        "the default account still has it"
    )
    listed = (await http.get("/payments", params={"guest_id": guest})).json()["payments"]
    assert [(p["payment_id"], p["refunded_cents"]) for p in listed] == [(payment_id, 0)]
