"""The reconciler shell: follows every run journal, asks executors to resolve overdue keys, wakes stalled runs."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from nats.aio.msg import Msg

from contracts.run_events import decode_event
from contracts.streams import approvals_spec
from contracts.subjects import StreamKind
from contracts.tool_messages import Answer
from contracts.audit import Finding, Intent, ProviderEffect
from services.registry import ProviderAnswer
from services.platform.asks import wake_run
from services.platform.crashpoints import crash_point
from services.platform.jetstream import Broker
from services.platform.provisioning import all_streams, require
from services.platform.journal import RunJournal
from services.platform.logs import log
from services.platform.settings import Settings
from services.registry import Registry, Tool
from services.reconciler.audit import audit, audited, intents
from services.platform.approvals import ApprovalRecords
from services.reconciler.core import (
    OpenWork,
    approval_wake_due,
    awaiting_runs,
    due_tickets,
    observe,
    overdue_actions,
    stalled_runs,
    unsettled_unknowns,
)
from services.platform.tickets import publish_ticket


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
        self.worker = f"reconciler:{settings.worker_id}"
        # How often waiting runs' approval records are read (one direct get per waiting run).
        self.approval_check_s = 5.0
        self._approvals_checked = datetime.min.replace(tzinfo=UTC)

    async def start(self) -> None:
        await require(self.broker, [*all_streams(self.ns), approvals_spec(self.ns).stream])
        since = datetime.now(UTC) - timedelta(seconds=self.lookback_s)
        await self.broker.follow(
            self.ns.stream(StreamKind.RUNS), self.ns.run_events_all, self._on_event, since
        )
        log(self.logger, logging.INFO, "reconciler ready")

    async def _on_event(self, msg: Msg) -> None:
        # Tolerant: an event type a newer writer added is an UnknownEvent, never a dead end for the projection.
        observe(self.work, decode_event(msg.data))

    async def run(self, stop: asyncio.Event, tick_s: float) -> None:
        """Tick every `tick_s` until `stop` is set."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=tick_s)
            except TimeoutError:
                await self.tick()

    async def tick(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        overdue = overdue_actions(self.work, now, self.grace_s, self.reask_s)
        asked: dict[str, list[str]] = {}
        for request in overdue + unsettled_unknowns(self.work, now, self.reask_s):
            self.work.asked[request.key] = now
            self.work.times_asked[request.key] = self.work.times_asked.get(request.key, 0) + 1
            asked.setdefault(request.run_id, []).append(request.key)
        overdue_runs = {r.run_id for r in overdue}
        for run_id in sorted(asked):
            crash_point("reconciler.mid_resolution")
            # Only the runtime publishes action requests: the wake names the keys, the runtime re-sends them.
            keys = asked[run_id]
            reason = (
                f"{len(keys)} action(s) past their timeout with no outcome"
                if run_id in overdue_runs
                else f"{len(keys)} unknown outcome(s) to resolve by key"
            )
            await wake_run(self.broker, self.settings, run_id, reason, self.worker, keys)
            self.resolutions += len(keys)
        for run_id in stalled_runs(self.work, now, self.quiet_s):
            self.work.woken[run_id] = now
            await wake_run(
                self.broker,
                self.settings,
                run_id,
                f"journal quiet for {self.quiet_s:.0f}s with nothing in flight",
                self.worker,
            )
            self.wakes += 1
        for ticket in due_tickets(self.work, now, self.grace_s):
            # Idempotent: a ticket already standing refuses the second copy; one not taken is tried next tick.
            if await publish_ticket(self.broker, self.ns, ticket, self.logger):
                self.work.tickets.pop(ticket.run_id, None)
        await self._approval_backstop(now)

    async def _approval_backstop(self, now: datetime) -> None:
        """Runs waiting for an approval: woken if their record is decided but the journal does not say so yet,
        or if it is pending past its expiry (the timer's backstop). The run then asks the record itself."""
        if now - self._approvals_checked < timedelta(seconds=self.approval_check_s):
            return
        self._approvals_checked = now
        records = ApprovalRecords(self.broker, self.ns)
        for waiting in awaiting_runs(self.work):
            stored = await records.get(waiting.approval_id)
            status = stored.record.status if stored is not None else "pending"
            if approval_wake_due(self.work, waiting, status, waiting.expires_at, now, self.quiet_s):
                self.work.woken[waiting.run_id] = now
                await wake_run(
                    self.broker,
                    self.settings,
                    waiting.run_id,
                    f"approval {waiting.approval_id} is {status}"
                    + (" past its expiry" if status == "pending" else ""),
                    self.worker,
                )
                self.wakes += 1


class ProviderFacts(Protocol):
    """What the audit asks a provider: what happened to key K. Every real provider with idempotency keys can answer."""

    async def lookup(self, tool: Tool, key: str, timeout: float) -> ProviderAnswer: ...


class ProviderListing(Protocol):
    """Every effect a provider holds, where it offers a listing (the sandbox's ledger; a payment provider's list API)."""

    async def effects(self) -> list[ProviderEffect]: ...


@dataclass(frozen=True, slots=True)
class AuditStats:
    runs: int
    keyed_intents: int
    looked_up: int
    listed_effects: int | None


async def audit_all(
    broker: Broker,
    settings: Settings,
    registry: Registry,
    facts: ProviderFacts,
    listing: ProviderListing | None = None,
) -> tuple[list[Finding], AuditStats]:
    """Every run's journal against the providers' by-key answers and, where they offer one, their listing."""
    journals = await RunJournal(broker, settings.namespace).read_all()
    effects = await listing.effects() if listing is not None else None
    keyed = [i for i in intents(journals).values() if audited(i, registry.tools)]
    slots = asyncio.Semaphore(32)
    found: dict[str, bool] = {}

    async def look(intent: Intent) -> None:
        async with slots:
            answer = await facts.lookup(registry.tools[intent.request.tool], intent.request.key, 5.0)
        if answer.kind in (Answer.FOUND, Answer.ABSENT):
            found[intent.request.key] = answer.kind == Answer.FOUND

    await asyncio.gather(*(look(i) for i in keyed))
    findings = audit(journals, effects, found, registry.tools, registry.audit_rules)
    stats = AuditStats(
        runs=len(journals),
        keyed_intents=len(keyed),
        looked_up=len(found),
        listed_effects=len(effects) if effects is not None else None,
    )
    return findings, stats
