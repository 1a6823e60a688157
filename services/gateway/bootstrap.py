"""The gateway's composition root: the HTTP app on uvicorn, admitting only the agents this deployment registered,
with the routers the process mounts beside the API (`crashsafe serve gateway` mounts the console)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import uvicorn
from litestar import Router

from crashsafe.domain.registry import Registry
from crashsafe.services.gateway.app import build_app
from crashsafe.services.platform import crashpoints
from crashsafe.services.platform.logs import configure
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.telemetry import configure_telemetry

# How long an idle client connection is kept open: longer than clients and load balancers keep theirs (httpx 5 s,
# AWS's ALB 60 s), so the client always closes first. At uvicorn's 5 s, equal to httpx's, a client sending on a
# connection the gateway was closing met a reset: 2-3 POSTs of 500 in a bench run failed with ReadError.
KEEP_ALIVE_S = 75


async def run(
    settings: Settings, registry: Registry, stop: asyncio.Event, mounted: Sequence[Router] = ()
) -> None:
    crashpoints.arm(settings.crash_at)
    configure("gateway", settings.log_level)
    telemetry = configure_telemetry("gateway", settings.otel)
    config = uvicorn.Config(
        build_app(settings, registry, mounted),
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level="warning",
        log_config=None,  # uvicorn's own handlers print plain text; ours (the root's) print JSON
        access_log=False,
        lifespan="on",
        # h11, never httptools even where it is installed: uvicorn's httptools protocol bounds neither the request
        # line nor the headers, so one client could fill the gateway's memory; h11 refuses a head past 16 KiB.
        http="h11",
        timeout_keep_alive=KEEP_ALIVE_S,
        # HTTPS when both files are configured (Settings refuses one without the other); plaintext otherwise.
        ssl_certfile=str(settings.tls_cert_file) if settings.tls_cert_file else None,
        ssl_keyfile=str(settings.tls_key_file) if settings.tls_key_file else None,
    )
    server = uvicorn.Server(config)
    scheme = "https" if settings.tls_cert_file else "http"
    print(f"gateway listening on {scheme}://{settings.gateway_host}:{settings.gateway_port}", flush=True)
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    starting = asyncio.create_task(_stop_if_asked_while_starting(server, serving))
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    stopping.cancel()
    starting.cancel()
    telemetry.close()


async def _stop_if_asked_while_starting(server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
    """uvicorn takes SIGTERM for itself while it serves, but reads it only once started: a gateway still waiting
    for NATS in its lifespan would sit out Kubernetes' whole grace period. Nothing is served yet, so nothing to
    drain: the start is given up."""
    while not server.started:
        if server.should_exit:
            serving.cancel()
            return
        await asyncio.sleep(0.1)
