"""`audit_all`: every run's journal against the providers' by-key answers and listings (the operator's and the console's audit)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from crashsafe.contracts.audit import Finding, Intent, ProviderEffect
from crashsafe.contracts.run_events import RunStarted
from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain import missing_projections as projections
from crashsafe.domain.effect_audit import audit, audited, intents
from crashsafe.domain.registry import ProviderAnswer, Registry, Tool
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.journal import RunJournal
from crashsafe.services.platform.settings import Settings


class ProviderFacts(Protocol):
    """What the audit asks a provider: what happened to key K. Every real provider with idempotency keys can answer.
    `args`: the journaled request's, which name the account the key was written in (asked in another: absent)."""

    async def lookup(
        self, tool: Tool, key: str, timeout: float, args: dict[str, Any] | None = None
    ) -> ProviderAnswer: ...


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
    sees: Callable[[str], bool] | None = None,
) -> tuple[list[Finding], AuditStats]:
    """Every run's journal against the providers' by-key answers and, where they offer one, their listing.
    `sees`: only the runs of the tenants it admits are audited (and their keys asked about), as the console
    audits for a tenant's key; None: every run, as the operator's `crashsafe audit`."""
    journals = await RunJournal(broker, settings.namespace).read_all()
    if sees is not None:
        journals = {
            run_id: events
            for run_id, events in journals.items()
            if events and isinstance(events[0], RunStarted) and sees(events[0].tenant)
        }
    effects = await listing.effects() if listing is not None else None
    keyed = [i for i in intents(journals).values() if audited(i, registry.tools)]
    slots = asyncio.Semaphore(32)
    found: dict[str, bool] = {}

    async def look(intent: Intent) -> None:
        async with slots:
            tool = registry.tools[intent.request.tool]
            answer = await facts.lookup(tool, intent.request.key, 5.0, intent.request.args)
        if answer.kind in (Answer.FOUND, Answer.ABSENT):
            found[intent.request.key] = answer.kind == Answer.FOUND

    await asyncio.gather(*(look(i) for i in keyed))
    projected = projections.projected_keys(journals, registry.agents, registry.tools, datetime.now(UTC))
    findings = audit(journals, effects, found, registry.tools, registry.audit_rules, projected)
    stats = AuditStats(
        runs=len(journals),
        keyed_intents=len(keyed),
        looked_up=len(found),
        listed_effects=len(effects) if effects is not None else None,
    )
    return findings, stats
