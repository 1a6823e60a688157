"""The reconciler's composition root: follows every journal and ticks once a second until stopped."""

from __future__ import annotations

import asyncio

from services.platform import crashpoints
from services.platform.jetstream import Broker
from services.platform.logs import configure
from services.platform.probes import OpsServer
from services.platform.settings import Settings
from services.platform.telemetry import configure_telemetry
from services.reconciler.service import Reconciler
from services.registry import Registry

TICK_S = 1.0


async def run(settings: Settings, registry: Registry, stop: asyncio.Event) -> None:
    crashpoints.arm(settings.crash_at)
    logger = configure("reconciler", settings.log_level)
    telemetry = configure_telemetry("reconciler", settings.otel)
    ops = await OpsServer(settings.ops_host, settings.ops_port).start()
    broker = await Broker.connect(
        settings.nats_url, f"reconciler-{settings.worker_id}", access=settings.nats_access
    )
    try:
        reconciler = Reconciler(broker, settings, logger, registry=registry)
        await reconciler.start()
        ops.serve(reconciler.ops_checks)
        print("ready: reconciler", flush=True)
        await reconciler.run(stop, TICK_S)
    finally:
        await ops.stop()
        await broker.close()
        telemetry.close()
