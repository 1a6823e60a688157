"""The coworking example's provider speaks the conventions the executor reads: each of its answers, read by the
executor's own readers with the tool's own operation, means what the provider meant (docs/failure-modes.md)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from crashsafe.contracts.tool_messages import Answer
from crashsafe.examples.cowork.desk_provider import DECLINED_CARD, app
from crashsafe.examples.cowork.desk_tools import BUY_DAY_PASS, RESERVE_DESK
from crashsafe.sdk import HttpOperation
from crashsafe.services.platform.provider_http import ProviderHttp, ProviderResponse
from crashsafe.services.providers.provider_calls import read_answer, read_lookup

RESERVE = RESERVE_DESK.operation
PAY = BUY_DAY_PASS.operation
assert isinstance(RESERVE, HttpOperation) and isinstance(PAY, HttpOperation)
DESK = {"member_id": "ana", "zone": "quiet", "day": "2031-05-01"}


@pytest.fixture
async def provider() -> AsyncIterator[ProviderHttp]:
    """The provider, asked through the executor's own HTTP client."""
    runner = web.AppRunner(app())
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    client = ProviderHttp(f"http://127.0.0.1:{sock.getsockname()[1]}")
    try:
        yield client
    finally:
        await client.close()
        await runner.cleanup()


async def _reserve(provider: ProviderHttp, key: str, body: dict[str, str] = DESK) -> ProviderResponse:
    return await provider.request("POST", "/reservations", json_body=body, headers={"Idempotency-Key": key})


async def test_a_key_again_is_the_same_reservation_and_another_body_a_refusal(
    provider: ProviderHttp,
) -> None:
    first = read_answer(await _reserve(provider, "k1"), RESERVE)
    assert first.kind == Answer.OK and first.ref and not first.replayed
    again = read_answer(await _reserve(provider, "k1"), RESERVE)
    assert (again.kind, again.ref, again.replayed) == (Answer.OK, first.ref, True)
    changed = read_answer(await _reserve(provider, "k1", {**DESK, "zone": "open"}), RESERVE)
    assert changed.kind == Answer.REJECTED and changed.body["code"] == "idempotency_conflict"
    assert read_lookup(await provider.get("/reservations/by-key/k1"), RESERVE).ref == first.ref
    absent = read_lookup(await provider.get("/reservations/by-key/never"), RESERVE)
    assert absent.kind == Answer.ABSENT


async def test_while_a_late_answer_is_in_flight_the_key_is_in_use_and_its_lookup_finds_it(
    provider: ProviderHttp,
) -> None:
    await provider.request("PUT", "/_faults", json_body={"late_ms": 1500})
    late = asyncio.create_task(_reserve(provider, "k2"))

    async def committed() -> bool:
        ledger = await provider.get("/_ledger", params={"member_id": "ana"})
        return bool(json.loads(ledger.content)["reservations"])

    while not await committed():
        await asyncio.sleep(0.01)
    in_use = read_answer(await _reserve(provider, "k2"), RESERVE)
    assert in_use.kind == Answer.UNKNOWN and "idempotency_key_in_use" in in_use.detail
    found = read_lookup(await provider.get("/reservations/by-key/k2"), RESERVE)
    assert found.kind == Answer.FOUND and found.ref
    assert read_answer(await late, RESERVE).ref == found.ref


async def test_a_declined_card_is_a_refusal_and_its_record_says_so(provider: ProviderHttp) -> None:
    await provider.request("PUT", "/members/ana/card", json_body={"card": DECLINED_CARD})
    reserved = json.loads((await _reserve(provider, "k3")).content)
    body = {"reservation_id": reserved["reservation_id"], "member_id": "ana"}
    body |= {"amount_cents": reserved["price_cents"], "currency": reserved["currency"]}
    declined = read_answer(await _pay(provider, body, "p3"), PAY)
    assert declined.kind == Answer.REJECTED and declined.body["code"] == "card_declined"
    looked_up = read_lookup(await provider.get("/passes/by-key/p3"), PAY)
    assert looked_up.kind == Answer.REJECTED and looked_up.body["code"] == "declined"
    cheaper = {**body, "amount_cents": 100}
    refused = read_answer(await _pay(provider, cheaper, "p4"), PAY)
    assert refused.kind == Answer.REJECTED and refused.body["code"] == "amount_mismatch"


async def _pay(provider: ProviderHttp, body: dict[str, object], key: str) -> ProviderResponse:
    return await provider.request("POST", "/passes", json_body=body, headers={"Idempotency-Key": key})
