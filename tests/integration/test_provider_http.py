"""A provider call over real HTTP on loopback (services/platform/provider_http.py): the request goes out with its
key, account, credential and body; whatever goes wrong once it may have been sent is unknown, never a refusal; a
redirect is read, never followed; closing the providers closes their connections."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest

from crashsafe.contracts.provider_settings import DEFAULT_PROVIDER, ProviderSettings
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.services.agents.booking.booking_tools import CREATE_PAYMENT
from crashsafe.services.providers.provider_calls import Providers

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHARGE = {"payment_id": "pay_1", "status": "captured"}


def payment(**args: object) -> ActionRequest:
    now = datetime.now(UTC)
    return ActionRequest(
        run_id="run_1",
        step_no=2,
        tool=CREATE_PAYMENT.contract.name,
        family=CREATE_PAYMENT.contract.family,
        args={"booking_id": "bk_1", "amount_cents": 24000, **args},
        key="run_1:2",
        input_hash="h",
        timeout_s=1.0,
        deadline_at=now + timedelta(seconds=30),
        requested_at=now,
    )


def http_answer(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *headers))
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode() + body


@asynccontextmanager
async def provider(
    handler: Handler, credential: str | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[Providers]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    url = f"http://{host}:{server.sockets[0].getsockname()[1]}"
    try:
        async with Providers(
            {DEFAULT_PROVIDER: ProviderSettings(DEFAULT_PROVIDER, url, credential)}
        ) as opened:
            yield opened
    finally:
        server.close()


def request_headers(head: bytes) -> dict[str, str]:
    lines = head.decode().split("\r\n")[1:]
    return {k.lower(): v for k, _, v in (line.partition(": ") for line in lines if line)}


async def test_a_call_goes_out_with_its_key_account_credential_and_json_body() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.readexactly(int(request_headers(head)["content-length"]))
        seen.append((head, body))
        writer.write(http_answer("201 Created", json.dumps(CHARGE).encode(), "Idempotent-Replayed: true"))
        await writer.drain()

    async with provider(handler, credential="sk_test_1") as providers:
        answer = await providers.call(CREATE_PAYMENT, payment(account="acct_9"), 1.0)
    assert (answer.kind, answer.body, answer.ref, answer.replayed) == (Answer.OK, CHARGE, "pay_1", True)
    head, body = seen[0]
    headers = request_headers(head)
    assert head.startswith(b"POST /payments HTTP/1.1\r\n")
    assert headers["idempotency-key"] == "run_1:2"
    assert headers["authorization"] == "Bearer sk_test_1"
    assert headers["provider-account"] == "acct_9"
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"booking_id": "bk_1", "amount_cents": 24000, "account": "acct_9"}


async def _not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    await writer.drain()


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


async def _short_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}")
    await writer.drain()
    writer.close()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(5)


@pytest.mark.parametrize(
    ("handler", "said"),
    [
        (_not_http, "ClientResponseError"),
        (_hang_up, "ServerDisconnectedError"),
        (_short_body, "ClientPayloadError"),
        (_silent, "Timeout"),
    ],
)
async def test_whatever_goes_wrong_once_the_write_may_be_out_is_unknown(handler: Handler, said: str) -> None:
    async with provider(handler) as providers:
        called = await providers.call(CREATE_PAYMENT, payment(), 0.3)
        asked = await providers.lookup(CREATE_PAYMENT, "run_1:2", 0.3, {})
    assert called.kind == Answer.UNKNOWN and said in called.detail, called
    assert asked.kind == Answer.UNKNOWN and said in asked.detail, asked


async def test_a_redirect_is_read_as_an_answer_and_never_followed() -> None:
    paths: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            paths.append(head.split(b" ")[1])
            writer.write(http_answer("307 Temporary Redirect", b"{}", "Location: /elsewhere"))
            await writer.drain()

    async with provider(handler) as providers:
        answer = await providers.lookup(CREATE_PAYMENT, "run_1:2", 1.0, {})
    assert answer.kind == Answer.UNKNOWN and "307" in answer.detail
    assert paths == [b"/payments/by-key/run_1:2"]


async def test_closing_the_providers_closes_their_connections() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(http_answer("200 OK", json.dumps(CHARGE).encode()))
        await writer.drain()
        await reader.read()  # until the client closes its kept-alive connection
        closed.set()

    async with provider(handler) as providers:
        assert (await providers.lookup(CREATE_PAYMENT, "run_1:2", 1.0, {})).kind == Answer.FOUND
        assert not closed.is_set(), "kept alive for the next call"
    await asyncio.wait_for(closed.wait(), 2.0)


async def test_a_cookie_a_provider_sets_is_never_sent_back_with_another_call() -> None:
    """Calls for every tenant share a provider's connections: a cookie one tenant's answer set would otherwise ride
    on the next tenant's call (its session, its account). No call carries one."""
    cookies: list[str | None] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            cookies.append(request_headers(head).get("cookie"))
            body = json.dumps(CHARGE).encode()
            writer.write(http_answer("200 OK", body, "Set-Cookie: session=tenant-a; Path=/"))
            await writer.drain()

    # By name: aiohttp's default jar keeps no cookie of a bare IP address, and a provider is named.
    async with provider(handler, host="localhost") as providers:
        for account in ("tenant-a", "tenant-b"):
            assert (
                await providers.lookup(CREATE_PAYMENT, "run_1:2", 1.0, {"account": account})
            ).kind == Answer.FOUND
    assert cookies == [None, None]


async def test_a_providers_answer_echoing_its_credential_is_masked_before_anyone_reads_it() -> None:
    """An HTTP provider's refusal body is the receipt's result, its record the effect and its ref the receipt's
    `provider_ref`, all journaled; a provider that echoes the request's credential (as text, base64 in a Basic
    header, percent-encoded) must leave none of it there (issue 31, item 8)."""
    secret = "sk_test_51Hq+Lyj/x y&=Z"
    basic = base64.b64encode(b"acct_1:" + secret.encode()).decode()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            headers = request_headers(head)
            await reader.readexactly(int(headers.get("content-length", 0)))
            if head.startswith(b"POST"):
                echoed = {"authorization": headers["authorization"], "basic": f"Basic {basic}"}
                error = {"code": "invalid_key", "message": f"Invalid API key: {secret}", "request": echoed}
                writer.write(http_answer("401 Unauthorized", json.dumps({"error": error}).encode()))
            else:
                record = {
                    "payment_id": f"pay_{quote(secret, safe='')}",
                    "status": "captured",
                    "seen": [[basic]],
                }
                writer.write(http_answer("200 OK", json.dumps(record).encode()))
            await writer.drain()

    async with provider(handler, credential=secret) as providers:
        refused = await providers.call(CREATE_PAYMENT, payment(), 1.0)
        found = await providers.lookup(CREATE_PAYMENT, "run_1:2", 1.0, {})
    assert refused.kind == Answer.REJECTED and refused.body == {
        "code": "invalid_key",
        "message": "Invalid API key: [credential]",
        "request": {"authorization": "Bearer [credential]", "basic": "Basic YWNjdF8xO[credential]"},
    }
    assert found.kind == Answer.FOUND and found.ref == "pay_[credential]"
    assert found.body == {
        "payment_id": "pay_[credential]",
        "status": "captured",
        "seen": [["YWNjdF8xO[credential]"]],
    }
