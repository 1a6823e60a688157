"""The runtime's composition root: builds its broker, model and journal, passes them in, serves until stopped."""

from __future__ import annotations

import asyncio
import logging

from crashsafe.contracts.nats_permissions import Role
from crashsafe.domain.registry import Registry
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform import crashpoints, seam_checks
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import configure, log
from crashsafe.services.platform.probes import OpsServer
from crashsafe.services.platform.run_archive import open_archive
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.telemetry import configure_telemetry
from crashsafe.services.platform.version_beats import VersionBeats
from crashsafe.services.records.capability_keys import load_issuer
from crashsafe.services.records.guest_profiles import GuestProfiles
from crashsafe.services.records.run_catalog import RunCatalog
from crashsafe.services.runtime.held_actions import ApprovalDesk
from crashsafe.services.runtime.lanes import SessionLanes
from crashsafe.services.runtime.model import ModelGateway
from crashsafe.services.runtime.service import Runtime


async def run(settings: Settings, registry: Registry, stop: asyncio.Event) -> None:
    crashpoints.arm(settings.crash_at)
    logger = configure("runtime", settings.log_level)
    telemetry = configure_telemetry("runtime", settings.otel)
    issuer = load_issuer(settings.capability_signing_key)  # no key, no runtime: it must sign every request
    model = ModelGateway(
        settings.openai_base_url,
        settings.openai_api_key,
        settings.model,
        organization=settings.openai_organization,
        project=settings.openai_project,
    )
    # Liveness answers from here on, readiness once subscribed (and about its real seams thereafter).
    ops = await OpsServer(settings.ops_host, settings.ops_port, stall_s=settings.loop_stall_s).start()
    broker = await Broker.connect(
        settings.nats_url,
        f"runtime-{settings.worker_id}",
        access=settings.nats_access,
        stop=stop,
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    beats = VersionBeats(broker, settings.namespace, Role.RUNTIME, settings.worker_id, logger)
    beats.start()
    try:
        # The documents are indexed once, before the first run can search them.
        library = Library.stayhub(settings.knowledge_dir)
        if not library.available:
            log(
                logger,
                logging.WARNING,
                "policy documents unavailable; policy questions are handed off (policy_unavailable)",
                problem=library.problem,
            )
        profiles = GuestProfiles(broker, settings.namespace)
        await profiles.start()
        catalog = RunCatalog(registry, broker, settings.namespace, logger)
        await catalog.start()
        runtime = Runtime(
            broker,
            settings,
            registry,
            model,
            logger,
            issuer,
            catalog=catalog,
            approvals=ApprovalDesk(broker, settings.namespace),
            lanes=SessionLanes(broker, settings.namespace),
            profiles=profiles,
            library=library,
        )
        # An agent's code runs under a time limit (its run is handed off past it); code out of a signal's reach
        # holds the loop until the watchdog ends the process, which first marks the run it was deciding.
        if not runtime.loop.hook_limit.install():
            log(
                logger,
                logging.WARNING,
                "agent code runs without a time limit (SIGALRM is not this process's)",
            )
        if ops.watchdog is not None:
            ops.watchdog.on_stall = runtime.loop.on_stall
        # Not ready, and taking no work, until its appends and reads work against this broker (seam_checks).
        if await seam_checks.start_when_able(ops, "runtime", runtime.start, runtime.ops_checks, stop, logger):
            ops.serve(runtime.ops_checks, runtime.ops_samplers())
            print("ready: runtime", flush=True)
            await stop.wait()
        runtime.stop_timers()
        runtime.loop.hook_limit.uninstall()
        await catalog.stop()
        await runtime.deliveries.drain()
        await runtime.checkpoints.close()  # the heads of its last second signed, not left to the next append
    finally:
        await beats.stop()
        await ops.stop()
        await model.close()
        await broker.close()
        telemetry.close()
