"""The projector's composition root: the planner and one worker per projection tool, until stopped."""

from __future__ import annotations

import asyncio

from crashsafe.contracts.nats_permissions import Role
from crashsafe.domain.registry import Registry
from crashsafe.services.platform import crashpoints, seam_checks
from crashsafe.services.platform.hook_limit import HookLimit
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import configure
from crashsafe.services.platform.probes import OpsServer
from crashsafe.services.platform.run_archive import open_archive
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.telemetry import configure_telemetry
from crashsafe.services.platform.version_beats import VersionBeats
from crashsafe.services.projector.service import Projector
from crashsafe.services.providers.provider_calls import Providers


async def run(settings: Settings, registry: Registry, stop: asyncio.Event) -> None:
    crashpoints.arm(settings.crash_at)
    logger = configure("projector", settings.log_level)
    telemetry = configure_telemetry("projector", settings.otel)
    ops = await OpsServer(settings.ops_host, settings.ops_port, stall_s=settings.loop_stall_s).start()
    broker = await Broker.connect(
        settings.nats_url,
        f"projector-{settings.worker_id}",
        access=settings.nats_access,
        stop=stop,
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    beats = VersionBeats(broker, settings.namespace, Role.PROJECTOR, settings.worker_id, logger)
    beats.start()
    try:
        # The receivers (email, CRM, audit log) are asked as the executors ask the providers: same adapter, same
        # Idempotency-Key header, same reading of their answers.
        async with Providers.open(settings, registry.projections.values()) as providers:
            # A receiver's Python client that holds the loop is stopped, as in the executors (hook_limit.py).
            limit = HookLimit(settings.hook_limit_s)
            if limit.install():
                providers.code_limit = limit
            projector = Projector(broker, settings, registry, providers, logger)
            # Not ready, and planning nothing, until its tasks land and its durables are in shape (seam_checks).
            if await seam_checks.start_when_able(
                ops, "projector", projector.start, projector.ops_checks, stop, logger
            ):
                ops.serve(projector.ops_checks, projector.ops_samplers())
                print("ready: projector", flush=True)
                await stop.wait()
            await projector.close()
            limit.uninstall()
    finally:
        await beats.stop()
        await ops.stop()
        await broker.close()
        telemetry.close()
