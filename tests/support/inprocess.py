"""The ONE place tests build services inside their own process: Settings, Executor, the sandbox server, the
audit, and the few service internals a test needs to reach.

Every in-process test goes through these helpers, so when a service's constructor or shell changes, this file is
the only one to fix. Each helper owns what it opens (its broker connection, its HTTP client) and closes it.
Services built here talk to the session's real nats-server; nothing here fakes the broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import httpx

from contracts.subjects import Namespace
from sandbox.app import serve
from services.executor.service import Executor
from services.platform.jetstream import Broker
from services.platform.settings import Settings
from services.reconciler.audit import Finding
from services.reconciler.service import audit_all

NO_SANDBOX = "http://127.0.0.1:9"  # a port nothing listens on: a service that must not call out fails loudly
_REPOSITORY_DATA = Path(".crashsafe/data")  # Settings' default; never written by a test


def settings_for(
    nats_url: str,
    ns: Namespace,
    *,
    sandbox_url: str = NO_SANDBOX,
    data_dir: Path | None = None,
    worker_id: str = "tests",
) -> Settings:
    """A service's configuration, as `Settings.from_env()` would read it for a stack (the scripted model is the
    sandbox's, as with no OPENAI_API_KEY)."""
    return Settings(
        nats_url=nats_url,
        namespace=ns,
        data_dir=data_dir if data_dir is not None else _REPOSITORY_DATA,
        sandbox_url=sandbox_url,
        openai_base_url=f"{sandbox_url}/v1",
        openai_api_key="sandbox",
        worker_id=worker_id,
    )


# The outside world --------------------------------------------------------------------------------------------


@asynccontextmanager
async def sandbox_server() -> AsyncIterator[str]:
    """The sandbox providers (and scripted model) in this process, on a free port; yields its URL."""
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(port=0, ready=ready.set_result))
    await asyncio.wait([server, ready], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if server.done():
        server.result()  # a start-up failure surfaces here instead of as a hang
    assert ready.done(), "the sandbox did not start listening within 10 s"
    try:
        yield f"http://127.0.0.1:{ready.result()}"
    finally:
        server.cancel()
        with suppress(asyncio.CancelledError):
            await server


# Executors ----------------------------------------------------------------------------------------------------


@asynccontextmanager
async def executor(settings: Settings, family: str, *, start: bool = True) -> AsyncIterator[Executor]:
    """A tool executor owning every partition of `family`, with its own broker connection and HTTP client."""
    assert settings.data_dir != _REPOSITORY_DATA, "give the executor a data_dir under the test's tmp_path"
    broker = await Broker.connect(settings.nats_url, f"tests-executor-{family}")
    http = httpx.AsyncClient(base_url=settings.sandbox_url)
    worker = Executor(
        broker,
        settings,
        family,
        list(range(settings.partitions)),
        http,
        logging.getLogger(f"tests.executor.{family}"),
    )
    try:
        if start:
            await worker.start()
        yield worker
    finally:
        await worker.close()
        await http.aclose()
        await broker.close()


# The audit ---------------------------------------------------------------------------------------------------


async def audit(broker: Broker, settings: Settings) -> tuple[list[Finding], dict[str, int]]:
    """`crashsafe audit`'s cross-check of every journal in the namespace against the providers."""
    async with httpx.AsyncClient(base_url=settings.sandbox_url, timeout=10) as http:
        return await audit_all(broker, settings, http)
