"""The ONE place tests build services inside their own process: Settings, Runtime, Executor, Reconciler, the
sandbox server, the model adapter, and the few service internals a test needs to reach.

Every in-process test goes through these helpers, so when a service's constructor or shell changes, this file is
the only one to fix. Each helper owns what it opens (its broker connection, its HTTP client) and closes it.
Services built here talk to the session's real nats-server; nothing here fakes the broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.workloads import registry as bench_registry
from crashsafe.contracts.audit import Finding
from crashsafe.contracts.errors import RunVersionConflict
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import ActionRequested, RunCompleted, RunEvent, RunHandedOff, ToolRejected
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import ActionRequest, RunWake
from crashsafe.domain.agent import Agent
from crashsafe.domain.model_calls import ModelReply
from crashsafe.domain.registry import Registry
from crashsafe.domain.run_state import RunState
from crashsafe.sandbox.app import serve
from crashsafe.sandbox.listing import SandboxListing
from crashsafe.services.executor import service as executor_service
from crashsafe.services.executor.service import Executor
from crashsafe.services.knowledge.library import Library
from crashsafe.services.operations.provider_audit import AuditStats, audit_all
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.provisioning import provision
from crashsafe.services.platform.run_archive import open_archive
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from
from crashsafe.services.projector.service import Projector
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.reconciler.service import Reconciler
from crashsafe.services.records.guest_profiles import GuestProfiles
from crashsafe.services.records.run_catalog import RunCatalog
from crashsafe.services.runtime.held_actions import ApprovalDesk
from crashsafe.services.runtime.lanes import SessionLanes
from crashsafe.services.runtime.model import ModelGateway
from crashsafe.services.runtime.service import Runtime
from tests.support import capabilities
from tests.support.nats_users import access

# The agents in-process services run: the product's booking agent and the benchmark's plan agents (steps5).
REGISTRY = bench_registry()
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


_PROVISIONED: set[tuple[str, str]] = set()


async def provisioned(settings: Settings) -> None:
    """The namespace's streams and buckets, made as the operator before a service starts: services only check
    that they exist (their NATS users may not create them), as `crashsafe up` provisions before starting them."""
    if (settings.nats_url, settings.namespace.name) in _PROVISIONED:
        return
    broker = await Broker.connect(
        settings.nats_url, "tests-operator", access=access(settings.nats_url, Role.OPERATOR)
    )
    try:
        await provision(broker, settings.namespace, settings.stream_replicas)
    finally:
        await broker.close()
    _PROVISIONED.add((settings.nats_url, settings.namespace.name))


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


class NoModel:
    """A model port for runs that must never ask the model (seeded, ended, or plan-driven runs)."""

    async def answer(
        self, agent: Agent, items: tuple[dict[str, Any], ...], config: Any = None, deadline_at: Any = None
    ) -> ModelReply:
        raise AssertionError("this run asked the model")


@asynccontextmanager
async def scripted_model(settings: Settings) -> AsyncIterator[ModelGateway]:
    """The runtime's real model gateway (the `openai` client), talking to the sandbox's scripted model unless the
    run's pinned configuration routes it elsewhere."""
    model = ModelGateway(settings.openai_base_url, settings.openai_api_key, settings.model)
    try:
        yield model
    finally:
        await model.close()


# Executors ----------------------------------------------------------------------------------------------------


@asynccontextmanager
async def executor(
    settings: Settings,
    family: str,
    *,
    max_deliver: int | None = None,
    start: bool = True,
    registry: Registry = REGISTRY,
) -> AsyncIterator[Executor]:
    """A tool executor owning every partition of `family`, with its own broker connection and providers client.

    `max_deliver` lowers how many deliveries the executor (and its durable consumers) spend on a key whose
    outcome stays unknown, so "the last delivery" comes in a second instead of ~40 s.
    """
    assert settings.data_dir != _REPOSITORY_DATA, "give the executor a data_dir under the test's tmp_path"
    await provisioned(settings)
    broker = await Broker.connect(
        settings.nats_url, f"tests-executor-{family}", access=access(settings.nats_url, Role.EXECUTOR, family)
    )
    providers = Providers.open(settings, registry.tools_of(family).values())
    worker = Executor(
        broker,
        settings,
        registry,
        family,
        providers,
        logging.getLogger(f"tests.executor.{family}"),
        capabilities.verifier(registry),
        max_deliver=max_deliver or executor_service.MAX_DELIVER,
    )
    try:
        if start:
            await worker.start()
        yield worker
    finally:
        await worker.close()
        await providers.close()
        await broker.close()


def last_delivery(worker: Executor) -> int:
    """The delivery at which an executor stops asking about an unknown outcome and reports it as unknown: one
    before the consumer's last, so that message is acknowledged rather than dead-lettered."""
    return worker.max_deliver - 1


async def deliver(worker: Executor, request: ActionRequest, deliveries: int, stream_seq: int = 1) -> None:
    """Hand the executor one delivery of `request`, as its consumer does (with the broker's delivery count),
    signed as the runtime would unless it carries a capability already. Returns when the delivery would be
    acknowledged; raises what would make it come back (nak) or dead-letter."""
    if request.capability is None:
        request = capabilities.signed(request)
    await worker.handle(request, context_from(None), stream_seq, deliveries)


# Runtimes -----------------------------------------------------------------------------------------------------


@asynccontextmanager
async def runtime(
    settings: Settings,
    model: Any | None = None,
    registry: Registry = REGISTRY,
    *,
    catalog: bool = False,
    library: Library | None = None,
) -> AsyncIterator[Runtime]:
    """A runtime worker named `settings.worker_id`, not yet consuming (call `start()` to take work from the
    streams, or call its use cases directly). `catalog`: read the namespace's catalog bucket (started, watching)
    as a deployed runtime does; otherwise only the built-in catalog (revision 0). Guest profiles are the
    namespace's real bucket; `library`: the documents its runs search (none unless given)."""
    await provisioned(settings)
    broker = await Broker.connect(
        settings.nats_url,
        f"tests-runtime-{settings.worker_id}",
        access=access(settings.nats_url, Role.RUNTIME),
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    logger = logging.getLogger(f"tests.runtime.{settings.worker_id}")
    run_catalog = RunCatalog(registry, broker, settings.namespace, logger) if catalog else None
    worker = Runtime(
        broker,
        settings,
        registry,
        model or NoModel(),
        logger,
        capabilities.ISSUER,
        catalog=run_catalog,
        profiles=GuestProfiles(broker, settings.namespace),
        library=library,
        approvals=ApprovalDesk(broker, settings.namespace),
        lanes=SessionLanes(broker, settings.namespace),
    )
    try:
        if run_catalog is not None:
            await run_catalog.start()
        yield worker
    finally:
        await worker.deliveries.drain()
        await broker.close()


def held_state(worker: Runtime, run_id: str) -> RunState | None:
    """The state a runtime worker holds in memory for a run right now (None: it does not hold the run)."""
    run = worker.runs.get(run_id)
    return run.state if run is not None else None


async def wake(worker: Runtime, run_id: str, reason: str, by: str = "test") -> None:
    """Hand the worker a `run.wake` for the run, as its outcomes consumer would (a reconciler's or operator's)."""
    message = RunWake(run_id=run_id, reason=reason, at=datetime.now(UTC), by=by)
    await worker.wake(message, context_from(None))


PLANNED = (ActionRequested, ToolRejected, RunCompleted, RunHandedOff)  # what a decision (`Append`) journals


@dataclass
class Contention:
    """What happened when several workers decided the same run at once."""

    parties: int
    arrived: list[int] = field(default_factory=list)  # the expected subject sequence each append carried
    won: list[RunEvent] = field(default_factory=list)
    conflicts: int = 0
    _all_here: asyncio.Event = field(default_factory=asyncio.Event)


class _GatedJournal:
    """A worker's run journal whose first planned append waits until every party has reached one."""

    def __init__(self, journal: Any, contention: Contention, timeout_s: float) -> None:
        self._journal = journal
        self._contention = contention
        self._timeout_s = timeout_s
        self._gated = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)

    async def append(
        self,
        event: RunEvent,
        expected_seq: int,
        headers: dict[str, str] | None = None,
        *,
        after_end: bool = False,
        subject: str | None = None,
    ) -> int:
        c = self._contention
        if isinstance(event, PLANNED) and not self._gated:
            self._gated = True
            c.arrived.append(expected_seq)
            if len(c.arrived) == c.parties:
                c._all_here.set()
            with suppress(TimeoutError):  # a party that never decides must not hang the test; it fails it
                await asyncio.wait_for(c._all_here.wait(), self._timeout_s)
            try:
                seq = await self._journal.append(
                    event, expected_seq, headers, after_end=after_end, subject=subject
                )
            except RunVersionConflict:
                c.conflicts += 1
                raise
            c.won.append(event)
            return int(seq)
        return int(
            await self._journal.append(event, expected_seq, headers, after_end=after_end, subject=subject)
        )


@contextmanager
def decide_together(workers: list[Runtime], timeout_s: float = 10.0) -> Iterator[Contention]:
    """Make runtime workers take their next decision (the events of an `Append` move) at the same moment: each
    worker's first planned append is held until all of them have made theirs, then all go to the journal."""
    contention = Contention(parties=len(workers))
    originals = [w.journal for w in workers]
    for worker in workers:
        worker.journal = _GatedJournal(worker.journal, contention, timeout_s)  # type: ignore[assignment]
    try:
        yield contention
    finally:
        for worker, journal in zip(workers, originals, strict=True):
            worker.journal = journal


# The reconciler and the audit ---------------------------------------------------------------------------------


@asynccontextmanager
async def reconciler(
    settings: Settings,
    *,
    grace_s: float = 2.0,
    reask_s: float = 5.0,
    quiet_s: float = 30.0,
    registry: Registry | None = None,
) -> AsyncIterator[Reconciler]:
    """A reconciler following the namespace's accepted runs and milestones. It never ticks by itself: the test calls
    `tick(now)` with the time it wants, so "overdue" and "ask again later" happen when the test says (and its
    archiver's passes: `worker.archiver.run_pass(now)`). `registry`: the projections it checks (none by default)."""
    await provisioned(settings)
    broker = await Broker.connect(
        settings.nats_url,
        f"tests-reconciler-{settings.worker_id}",
        access=access(settings.nats_url, Role.RECONCILER),
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    worker = Reconciler(
        broker,
        settings,
        logging.getLogger("tests.reconciler"),
        grace_s=grace_s,
        reask_s=reask_s,
        quiet_s=quiet_s,
        registry=registry,
    )
    try:
        await worker.start()
        yield worker
    finally:
        await broker.close()


async def audit(broker: Broker, settings: Settings) -> tuple[list[Finding], AuditStats]:
    """`crashsafe audit`'s cross-check of every journal in the namespace against the providers: each journaled
    key asked by key, and the sandbox's ledger as the providers' listing."""
    async with Providers.connect(settings.sandbox_url) as providers:
        return await audit_all(broker, settings, REGISTRY, providers, SandboxListing(providers.http))


# The projector ------------------------------------------------------------------------------------------------


@asynccontextmanager
async def projector(
    settings: Settings, registry: Registry | None = None, *, name: str = "tests-projector"
) -> AsyncIterator[Projector]:
    """The projector (planner and a worker per projection tool) with its own NATS user and receivers' client.
    The default registry is the product's (`stayhub`: email, CRM and the audit trail)."""
    from crashsafe.services.agents import stayhub

    await provisioned(settings)
    broker = await Broker.connect(
        settings.nats_url,
        name,
        access=access(settings.nats_url, Role.PROJECTOR),
        retention=settings.retention,
        archive=open_archive(settings.archive_dir, settings.namespace.name),
    )
    registry = registry or stayhub()
    providers = Providers.open(settings, registry.projections.values())
    worker = Projector(broker, settings, registry, providers, logging.getLogger(f"tests.{name}"))
    try:
        await worker.start()
        yield worker
    finally:
        await worker.close()
        await providers.close()
        await broker.close()


@asynccontextmanager
async def serving(
    nats_url: str, ns: Namespace, data_dir: Path, families: tuple[str, ...] = ("booking", "payment", "notify")
) -> AsyncIterator[tuple[Runtime, str]]:
    """A started runtime on the scripted model with an executor per family, on a sandbox of its own: the run path
    of this release, end to end, in this process (the runtime, and the sandbox's URL)."""
    async with sandbox_server() as sandbox_url, AsyncExitStack() as running:
        settings = settings_for(nats_url, ns, sandbox_url=sandbox_url, data_dir=data_dir)
        for family in families:
            await running.enter_async_context(executor(settings, family))
        model = await running.enter_async_context(scripted_model(settings))
        worker = await running.enter_async_context(runtime(settings, model))
        await worker.start()
        try:
            yield worker, sandbox_url
        finally:
            worker.stop_timers()
