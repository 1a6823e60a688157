"""The reconciler's composition root: follows accepted runs and milestones, ticks once a second until stopped."""

from __future__ import annotations

import asyncio
import contextlib

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
from crashsafe.services.reconciler.service import Reconciler
from crashsafe.services.reconciler.synthetic_cadence import SyntheticCadence

TICK_S = 1.0


async def run(settings: Settings, registry: Registry, stop: asyncio.Event) -> None:
    crashpoints.arm(settings.crash_at)
    logger = configure("reconciler", settings.log_level)
    telemetry = configure_telemetry("reconciler", settings.otel)
    ops = await OpsServer(settings.ops_host, settings.ops_port, stall_s=settings.loop_stall_s).start()
    broker = await Broker.connect(
        settings.nats_url,
        f"reconciler-{settings.worker_id}",
        access=settings.nats_access,
        stop=stop,
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    beats = VersionBeats(broker, settings.namespace, Role.RECONCILER, settings.worker_id, logger)
    beats.start()
    try:
        reconciler = Reconciler(broker, settings, logger, registry=registry)
        # An agent's `projections` hook that blocks is this run's failed plan, never a reconciler (and its
        # archiver) stalled for every tenant, again after each restart (services/platform/hook_limit.py).
        limit = HookLimit(settings.hook_limit_s)
        if limit.install():
            reconciler.projection_checks.hook_limit = reconciler.archiver.hook_limit = limit
        # Not ready, and following nothing, until its wakes, tickets and tasks land where it expects (seam_checks).
        if not await seam_checks.start_when_able(
            ops, "reconciler", reconciler.start, reconciler.ops_checks, stop, logger
        ):
            return
        ops.serve(reconciler.ops_checks)
        print("ready: reconciler", flush=True)
        synthetic = SyntheticCadence.configured(broker, settings, logger, agents=registry.agents)
        probe = asyncio.create_task(synthetic.run(stop)) if synthetic is not None else None
        await reconciler.run(stop, TICK_S)
        if probe is not None:
            probe.cancel()  # a turn under way is only a probe: stopping never waits out its budget
            with contextlib.suppress(asyncio.CancelledError):
                await probe
    finally:
        await beats.stop()
        await ops.stop()
        await broker.close()
        telemetry.close()
