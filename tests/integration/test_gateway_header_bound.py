"""The gateway bounds what a request's head may take: a client sending headers without end is answered 400 and
closed after some KiB (as h11's 16 KiB bound did), never buffered in the gateway's memory."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from crashsafe.contracts.subjects import Namespace
from crashsafe.natsd import free_port
from crashsafe.services.gateway import bootstrap
from tests.support import inprocess

HEAD_BOUND = 1024 * 1024  # generous: h11 refused at 16 KiB


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("one", [False, True], ids=["many-headers", "one-endless-header"])
async def test_endless_headers_are_refused_not_buffered(monkeypatch: pytest.MonkeyPatch, one: bool) -> None:
    monkeypatch.setattr(bootstrap, "build_app", lambda *a, **k: _ok)
    port = free_port()
    settings = dataclasses.replace(
        inprocess.settings_for("nats://127.0.0.1:1", Namespace("thdr")), gateway_port=port
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(bootstrap.run(settings, None, stop))  # type: ignore[arg-type]
    try:
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" + (b"X-One: " if one else b""))
        line = b"a" * 1000 if one else b"X-Pad: " + b"a" * 1000 + b"\r\n"
        sent, answer = 0, b""
        try:
            while sent < 4 * HEAD_BOUND and not answer:
                writer.write(line * 64)
                sent += len(line) * 64
                await writer.drain()
                try:
                    answer = await asyncio.wait_for(reader.read(64), 0.01)
                except TimeoutError:
                    pass
        except (ConnectionResetError, BrokenPipeError):
            answer = b"reset"
        writer.close()
        assert answer, f"{sent // 1024} KiB of headers taken in, never refused"
        assert sent <= HEAD_BOUND + len(line) * 64, f"refused only after {sent // 1024} KiB"
    finally:
        stop.set()
        await serving
