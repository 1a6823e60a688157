"""An answer given before the request's body was read (a 413, a 401) stays open for the rest of that body, bounded,
so a client that sends its whole body before it reads (urllib) reads the typed error instead of a reset."""

from __future__ import annotations

import asyncio
import contextlib

from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

# How much of an unread body is taken in and thrown away before the connection is closed anyway. Closing a socket
# with unread bytes sends a reset, and a client still writing its body (urllib writes all of it first, and asks
# `Connection: close`) then sees `Connection reset by peer`, never the answer. Nothing drained is kept: the bound
# is on time and bandwidth, not memory.
LINGER_BYTES = 8 * 1024 * 1024
LINGER_S = 5.0


def linger_on_unread_bodies(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: a response completed while its request's body is still arriving is sent whole at once
    (a client reading early, like curl, has it at once), then the rest of the body is drained, up to
    `LINGER_BYTES` or `LINGER_S`, before the response is marked complete and the server may close."""

    async def lingering(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await app(scope, receive, send)
            return
        body_read = False

        async def receiving() -> ReceiveMessage:
            nonlocal body_read
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read = True
            return message

        async def sending(message: Message) -> None:
            if message["type"] != "http.response.body" or message.get("more_body", False) or body_read:
                await send(message)
                return
            await send({**message, "more_body": True})  # type: ignore[typeddict-item]
            await _drain(receiving)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        await app(scope, receiving, sending)

    return lingering


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of the body, until it ends, the client leaves, or a bound is reached."""
    drained = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while drained <= LINGER_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
