"""The scripted model on HTTP: `python -m crashsafe.testing MODULE:FUNCTION --port 0` answers `POST …/responses`
with the script's answers (`scripted.respond`), for `crashsafe up --model-url`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import socket
from collections.abc import Callable

from aiohttp import web

from crashsafe.testing.scripted import Script, respond


def load(spec: str) -> Script:
    """`package.module:function` -> the script it names."""
    module_name, _, attribute = spec.partition(":")
    script = getattr(importlib.import_module(module_name), attribute, None) if attribute else None
    if not callable(script):
        raise ValueError(f"{spec!r} names no script: write it module:function")
    return script  # type: ignore[no-any-return]


async def serve(
    script: Script, host: str = "127.0.0.1", port: int = 0, ready: Callable[[str], None] | None = None
) -> None:
    """Answer `POST …/responses` with the script until cancelled; `port=0` picks a free port. `ready` gets the
    base URL to give the runtime (`crashsafe up --model-url`), `/v1` included."""

    async def responses(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(
                {"error": {"code": "invalid_json", "message": "send a JSON body"}}, status=400
            )
        if not isinstance(body, dict) or body.get("stream"):
            error = {"code": "invalid_request", "message": "a JSON object, not streamed"}
            return web.json_response({"error": error}, status=400)
        return web.json_response(respond(script, body))

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/responses", responses)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server((host, port))  # bound here, so the port is known before anyone asks
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    try:
        await web.SockSite(runner, sock).start()
        print(f"model listening on {url}", flush=True)
        if ready is not None:
            ready(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m crashsafe.testing", description=__doc__)
    parser.add_argument("script", help="the script, as module:function")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port, printed on start")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(load(args.script), args.host, args.port))
