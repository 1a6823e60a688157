"""The audit an operator runs (`crashsafe audit`, the console's audit page): every run's journal against the
providers' by-key answers and, where they offer one, their listing of every effect they hold."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from crashsafe.contracts.audit import Finding, Intent, ProviderEffect
from crashsafe.contracts.client_answers import ClientAnswer
from crashsafe.contracts.provider_view import ProviderViewReply
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, JournalEvent, RunStarted
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain import missing_projections as projections
from crashsafe.domain.effect_audit import audit, audited, intents, unknown_events
from crashsafe.domain.registry import ProviderAnswer, Registry, Tool
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from crashsafe.services.providers import provider_views
from crashsafe.services.records.run_journal import RunJournal


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
    # The stream's runs and the archived ones: a provider still lists the effects of runs archived long ago.
    journal = RunJournal(broker, settings.namespace)
    journals = {**await journal.read_all_archived(), **await journal.read_all()}
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


class ProviderViews:
    """The audit's by-key questions asked of the executors over NATS, for a process that holds no provider
    credential (the gateway's, where the console runs): each executor answers for its own provider."""

    def __init__(self, broker: Broker, ns: Namespace) -> None:
        self.broker = broker
        self.ns = ns

    async def lookup(
        self, tool: Tool, key: str, timeout: float, args: dict[str, Any] | None = None
    ) -> ProviderAnswer:
        reply = await provider_views.ask(self.broker, self.ns, tool, key, args or {}, timeout_s=timeout + 1)
        # Only the five a provider answers: anything else an executor of another release says is unknown.
        kind = Answer(reply.answer) if reply.answer in {a.value for a in ClientAnswer} else Answer.UNKNOWN
        return ProviderAnswer(kind, reply.effect, ref=reply.ref, detail=reply.detail)  # type: ignore[arg-type]


async def unreadable_runs(broker: Broker, ns: Namespace) -> dict[str, list[str]]:
    """Runs a newer writer journaled events for that this version cannot read, with those events' types: named
    beside an audit, never fatal to it."""
    return unknown_events(await RunJournal(broker, ns).read_all())


@dataclass(frozen=True, slots=True)
class ViewRow:
    """One action of a run: its request, our receipt (the last one: a late resolution replaces an unknown), and
    what its provider answers when asked by the action's key."""

    request: ActionRequested
    receipt: ActionCompleted | None
    provider: ProviderViewReply


async def provider_view(
    broker: Broker, ns: Namespace, registry: Registry, events: list[JournalEvent]
) -> list[ViewRow]:
    """For each action of a run's journal: what its provider answers by the action's key, beside our receipt."""
    receipts: dict[int, ActionCompleted] = {}
    requested: list[ActionRequested] = []
    for event in events:
        if isinstance(event, ActionRequested):
            requested.append(event)
        elif isinstance(event, ActionCompleted):
            receipts[event.step_no] = event  # the last one: a late resolution replaces an unknown

    async def view(req: ActionRequested) -> ProviderViewReply:
        tool = registry.tools.get(req.tool)
        if tool is None:
            return ProviderViewReply(answer="unknown", detail=f"{req.tool} is not a tool of this deployment")
        return await provider_views.ask(broker, ns, tool, req.key, req.args)

    answers = await asyncio.gather(*(view(r) for r in requested))
    return [ViewRow(r, receipts.get(r.step_no), a) for r, a in zip(requested, answers, strict=True)]
