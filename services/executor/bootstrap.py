"""An executor's composition root: one tool family, its owned partitions' stores, its providers, until stopped."""

from __future__ import annotations

import asyncio

from crashsafe.contracts.nats_permissions import Role
from crashsafe.domain.registry import Registry
from crashsafe.services.executor.service import Executor
from crashsafe.services.platform import crashpoints, seam_checks
from crashsafe.services.platform.hook_limit import HookLimit
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import configure
from crashsafe.services.platform.probes import OpsServer
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.telemetry import configure_telemetry
from crashsafe.services.platform.version_beats import VersionBeats
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.records.capability_keys import load_verifier


async def run(settings: Settings, registry: Registry, stop: asyncio.Event, family: str) -> None:
    crashpoints.arm(settings.crash_at)
    # Every provider this family's tools name, checked before anything else: a missing URL is one line at start,
    # not an unknown outcome at the first call.
    async with Providers.open(settings, registry.tools_of(family).values()) as providers:
        logger = configure(f"executor.{family}", settings.log_level)
        telemetry = configure_telemetry("executor", settings.otel, resource={"crashsafe.family": family})
        verifier = load_verifier(
            settings.capability_verify_keys, registry.compensation_only, registry.model_tools
        )
        # A Python operation's code between two awaits runs under the time limit: one that holds the loop (a
        # synchronous SDK call that hangs) is stopped, its answer unknown and asked about by key, and every other
        # partition of the family goes on (services/platform/hook_limit.py).
        limit = HookLimit(settings.hook_limit_s)
        if limit.install():
            providers.code_limit = limit
        ops = await OpsServer(settings.ops_host, settings.ops_port, stall_s=settings.loop_stall_s).start()
        broker = await Broker.connect(
            settings.nats_url,
            f"executor-{family}-{settings.worker_id}",
            access=settings.nats_access,
            stop=stop,
        )
        beats = VersionBeats(broker, settings.namespace, Role.EXECUTOR, settings.worker_id, logger, family)
        beats.start()
        try:
            executor = Executor(broker, settings, registry, family, providers, logger, verifier)
            # Not ready, and holding no partition, until its receipts and consumers work (seam_checks).
            if await seam_checks.start_when_able(
                ops, f"executor {family}", executor.start, executor.ops_checks, stop, logger
            ):
                ops.serve(executor.ops_checks, executor.ops_samplers())
                print(f"ready: executor {family}", flush=True)
                await stop.wait()
            await executor.close()
            limit.uninstall()
        finally:
            await beats.stop()
            await ops.stop()
            await broker.close()
            telemetry.close()
