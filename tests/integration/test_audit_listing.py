"""`crashsafe audit` against providers that are not the sandbox: no ledger to list, so effects are checked by key
alone, said once; never a decoding crash (an adopter's providers answered `/_ledger` with their own format)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from crashsafe.natsd import free_port
from crashsafe.sandbox.listing import SandboxListing


@pytest.fixture
async def providers() -> AsyncIterator[str]:
    """An adopter's provider: `/_ledger` is theirs (another format), `/missing` is nothing."""

    async def ledger(request: web.Request) -> web.Response:
        return web.json_response({"items": [{"id": "desk-1"}]})

    app = web.Application()
    app.router.add_get("/_ledger", ledger)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_provider_whose_ledger_is_another_format_or_absent_lists_nothing(providers: str) -> None:
    async with httpx.AsyncClient(base_url=providers) as http:
        assert await SandboxListing(http).listed() is None, "their own /_ledger format"
    async with httpx.AsyncClient(base_url=f"{providers}/missing") as http:
        assert await SandboxListing(http).listed() is None, "a 404"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}") as http:
        assert await SandboxListing(http).listed() is None, "nobody listening"
