"""The broker an operator task runs over: opened fail-fast for one command, closed however the task ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.run_archive import open_archive
from crashsafe.services.platform.settings import Settings


@asynccontextmanager
async def operator_broker(settings: Settings, name: str) -> AsyncIterator[Broker]:
    """`async with operator_broker(settings, "crashsafe-audit") as broker:` the deployment's NATS as the operator's
    credential names it. Fail-fast: a one-shot command with no reachable NATS says so at once (a service would
    wait for it); `name` is the connection's name in NATS' own monitoring."""
    broker = await Broker.connect(
        settings.nats_url,
        name,
        fail_fast=True,
        access=settings.nats_access,
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    try:
        yield broker
    finally:
        await broker.close()
