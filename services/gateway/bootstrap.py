"""The gateway's composition root: the HTTP app on uvicorn, admitting only the agents this deployment registered."""

from __future__ import annotations

import asyncio

import uvicorn

from services.gateway.app import build_app
from services.platform import crashpoints
from services.platform.logs import configure
from services.platform.settings import Settings
from services.registry import Registry


async def run(settings: Settings, registry: Registry, stop: asyncio.Event) -> None:
    crashpoints.arm(settings.crash_at)
    configure("gateway", settings.log_level)
    config = uvicorn.Config(
        build_app(settings, registry),
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    print(f"gateway listening on http://{settings.gateway_host}:{settings.gateway_port}", flush=True)
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
    stopping.cancel()
