"""`crashsafe reconcile` and `crashsafe audit`: open actions asked about by key, and every journal cross-checked
against the providers, as an operator reads them."""

from __future__ import annotations

from pathlib import Path

from crashsafe.contracts.audit import ProviderEffect
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.domain.registry import HttpOperation, PythonOperation, Registry
from crashsafe.sandbox.listing import ListedEffects, SandboxListing
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.provider_audit import audit_all, unreadable_runs
from crashsafe.services.operations.run_journals import reconcile_run, runs_to_reconcile
from crashsafe.services.providers.provider_calls import Providers


async def reconcile(state_dir: Path, run_id: str | None) -> int:
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-reconcile") as broker:
        run_ids = [run_id] if run_id else await runs_to_reconcile(broker, settings.namespace)
        for rid in run_ids:
            done = await reconcile_run(broker, settings, rid, by="operator:cli")
            asked = ", ".join(done.asked) or "nothing open"
            print(f"{rid}: {done.status}; asked to resolve: {asked}")
        if not run_ids:
            print("no open runs")
    return 0


async def listings(providers: Providers, registry: Registry) -> tuple[ListedEffects | None, list[str]]:
    """The listing of every effect, from each provider an audited HTTP operation names that offers one (the
    sandbox's ledger), each base URL read once, and from each Python operation that lists (`lists=True`), each
    provider's effects counted once; and a note for each provider or Python operation that offers none, whose
    effects are then checked by key alone (effects no run journaled cannot be found there)."""
    audited = [t for t in registry.tools.values() if t.audited]
    names = sorted({t.operation.provider for t in audited if isinstance(t.operation, HttpOperation)})
    clients = providers.http_providers()
    effects: list[ProviderEffect] | None = None
    notes: list[str] = []
    read: set[str] = set()
    for name in names:
        url = providers.endpoints[name].base_url
        if url in read:
            continue
        read.add(url)
        listed = await SandboxListing(clients[name]).listed()
        if listed is None:
            notes.append(
                f"NOTE provider {name} at {url} lists no effects (no sandbox ledger at GET /_ledger): each "
                "journaled effect is asked about by its key, and effects no run journaled cannot be found"
            )
            continue
        effects = [*(effects or []), *await listed.effects()]
    python = sorted(
        ((t, t.operation) for t in audited if isinstance(t.operation, PythonOperation)),
        key=lambda p: p[0].name,
    )
    unlisted = [tool.name for tool, operation in python if not operation.lists]
    # Two tools of one provider may each list it: an effect both name is one effect, not a duplicate.
    by_provider: dict[str, dict[ProviderEffect, None]] = {}
    for tool, operation in python:
        if not operation.lists:
            continue
        answered = await providers.listing(tool)
        if isinstance(answered, str):
            unlisted.append(tool.name)
            notes.append(f"NOTE {tool.name}: no listing ({answered})")
            continue
        by_provider.setdefault(operation.provider, {}).update(dict.fromkeys(answered))
    for listed_effects in by_provider.values():
        effects = [*(effects or []), *listed_effects]
    if unlisted:
        notes.append(
            f"NOTE {', '.join(sorted(unlisted))}: Python operations that list no effects; each journaled effect is"
            " asked about by its key through the operation's own lookup"
        )
    return (ListedEffects(effects) if effects is not None else None), notes


async def audit(state_dir: Path) -> int:
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    async with operator_broker(settings, "crashsafe-audit") as broker:
        # Each tool asked through its own operation's lookup, at its own provider with its own credential.
        async with Providers.open(settings, registry.tools.values()) as providers:
            listing, notes = await listings(providers, registry)
            for note in notes:
                print(note)
            findings, stats = await audit_all(broker, settings, registry, providers, listing)
        unreadable = await unreadable_runs(broker, settings.namespace)
    listed = f", {stats.listed_effects} provider effects listed" if stats.listed_effects is not None else ""
    print(
        f"audited {stats.runs} runs, {stats.keyed_intents} keyed intents ({stats.looked_up} looked up){listed}"
    )
    for finding in findings:
        print(f"WRONG {finding.kind}: run {finding.run_id or '(none)'} key {finding.key}: {finding.detail}")
    for run_id, tags in sorted(unreadable.items()):
        print(
            f"NOTE run {run_id}: {len(tags)} event(s) of a type this version does not know "
            f"({', '.join(sorted(set(tags)))}): kept and skipped; audit them with a newer crashsafe"
        )
    if not findings:
        print(
            "nothing wrong: every effect has one journaled intent and every journaled success has its effect"
        )
    return 1 if findings else 0
