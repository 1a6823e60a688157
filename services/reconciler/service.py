"""The reconciler shell: follows every run journal, asks executors to resolve overdue keys, wakes stalled runs."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from nats.aio.msg import Msg

from contracts.keys import partition_of
from contracts.run_events import ActionRequested, event_decoder
from contracts.streams import stream_specs
from contracts.subjects import StreamKind
from contracts.tool_messages import ActionRequest, RunWake, tool_encoder
from services.platform.crashpoints import crash_point
from services.platform.jetstream import Broker
from services.platform.logs import log
from services.platform.settings import Settings
from services.platform.tracing import context_from, headers_for
from services.reconciler.core import OpenWork, observe, overdue_actions, stalled_runs


class Reconciler:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        logger: logging.Logger,
        grace_s: float = 2.0,
        reask_s: float = 5.0,
        quiet_s: float = 30.0,
        lookback_s: float = 86_400.0,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.ns = settings.namespace
        self.logger = logger
        self.work = OpenWork()
        self.grace_s, self.reask_s, self.quiet_s, self.lookback_s = grace_s, reask_s, quiet_s, lookback_s
        self.resolutions = 0
        self.wakes = 0

    async def start(self) -> None:
        for spec in stream_specs(self.ns, self.settings.stream_replicas):
            await self.broker.ensure_stream(spec)
        since = datetime.now(UTC) - timedelta(seconds=self.lookback_s)
        await self.broker.follow(self.ns.stream(StreamKind.RUNS), self.ns.run_events_all, self._on_event, since)
        log(self.logger, logging.INFO, "reconciler ready")

    async def _on_event(self, msg: Msg) -> None:
        observe(self.work, event_decoder.decode(msg.data))

    async def tick(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        for request in overdue_actions(self.work, now, self.grace_s, self.reask_s):
            self.work.asked[request.key] = now
            await self.resolve(request)
        for run_id in stalled_runs(self.work, now, self.quiet_s):
            self.work.woken[run_id] = now
            wake = RunWake(run_id=run_id, reason=f"journal quiet for {self.quiet_s:.0f}s with nothing in flight", at=now)
            await self.broker.publish(self.ns.outcomes(run_id), tool_encoder.encode(wake))
            self.wakes += 1
            log(self.logger, logging.INFO, "woke stalled run", run_id=run_id)

    async def resolve(self, requested: ActionRequested) -> None:
        """Send the journaled request to the executor that owns its key: it answers from its receipt, or asks the provider by key."""
        request = ActionRequest(
            run_id=requested.run_id,
            step_no=requested.step_no,
            tool=requested.tool,
            family=requested.family,
            args=requested.args,
            key=requested.key,
            input_hash=requested.input_hash,
            timeout_s=requested.timeout_s,
            deadline_at=requested.deadline_at,
            requested_at=requested.at,
        )
        subject = self.ns.actions(request.family, partition_of(request.key, self.settings.partitions))
        crash_point("reconciler.mid_resolution")
        self.resolutions += 1
        await self.broker.publish(
            subject,
            tool_encoder.encode(request),
            msg_id=f"reconcile:{request.key}:{self.resolutions}",
            headers=headers_for(context_from(None)),
        )
        log(self.logger, logging.INFO, "asked executor to resolve", run_id=request.run_id, key=request.key, step_no=request.step_no)


async def serve_reconciler(settings: Settings, logger: logging.Logger, stop: asyncio.Event, interval_s: float = 1.0) -> None:
    broker = await Broker.connect(settings.nats_url, f"reconciler-{settings.worker_id}")
    reconciler = Reconciler(broker, settings, logger)
    await reconciler.start()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except asyncio.TimeoutError:
            await reconciler.tick()
    await broker.close()
