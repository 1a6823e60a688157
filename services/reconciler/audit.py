"""`audit`: cross-checks run journals against what providers hold, and names every disagreement. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from contracts.audit import Finding, FindingKind, Intent, ProviderEffect
from contracts.keys import undone_by
from contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    RunCompleted,
    RunHandedOff,
    UnknownEvent,
)
from contracts.tool_messages import OutcomeStatus
from contracts.tools import Effect
from services.registry import AuditRule, Tool


def intents(journals: Mapping[str, Sequence[JournalEvent]]) -> dict[str, Intent]:
    """Every keyed action any run journaled, by idempotency key, with its receipt if one was journaled.

    A business key is asked by many steps and runs (a replay, an `action_undone` answer, a hold asked again by
    the session's next run): the key is judged by the asker that journaled it succeeded, else by one still in
    flight (it may yet journal it), else by the last to end. Never by whichever journal happened to come last."""
    askers: dict[str, list[Intent]] = {}
    for run_id, events in journals.items():
        terminal = any(isinstance(e, RunCompleted | RunHandedOff) for e in events)
        requested = {e.step_no: e for e in events if isinstance(e, ActionRequested)}
        completed = {e.step_no: e for e in events if isinstance(e, ActionCompleted)}
        for step, request in requested.items():
            askers.setdefault(request.key, []).append(Intent(run_id, request, completed.get(step), terminal))
    return {key: _judged_by(found) for key, found in askers.items()}


def _judged_by(askers: list[Intent]) -> Intent:
    succeeded = [i for i in askers if i.succeeded]
    live = [i for i in askers if not i.run_terminal]
    return (succeeded or live or [askers[-1]])[0]


def audited(intent: Intent, tools: Mapping[str, Tool]) -> bool:
    """Whether the providers can be asked about this intent: a write whose provider keeps a record by key."""
    tool = tools.get(intent.request.tool)
    return tool is not None and tool.audited and tool.contract.effect is not Effect.READ


def audit(
    journals: Mapping[str, Sequence[JournalEvent]],
    effects: Iterable[ProviderEffect] | None,
    found_by_key: Mapping[str, bool],
    tools: Mapping[str, Tool],
    rules: Iterable[AuditRule] = (),
    projected: Mapping[str, str] | None = None,
) -> list[Finding]:
    """`effects`: the providers' listing, if they offer one; `found_by_key`: their answers for journaled keys;
    `projected`: the projection keys the ended runs' journals call for (key -> run), whose effects (an email, a
    CRM record) have their intent in the journal itself, not in a step."""
    findings: list[Finding] = []
    known = intents(journals)
    projected = projected or {}
    listed = list(effects or ())
    for key, count in Counter(effect.key for effect in listed).items():
        if count > 1:
            findings.append(
                Finding(
                    FindingKind.DUPLICATE_EFFECT,
                    key,
                    _run_of(key, known) or projected.get(key, ""),
                    f"{count} effects hold key {key}",
                )
            )
    for effect in listed:
        if effect.key not in known and effect.key not in projected:
            findings.append(
                Finding(
                    FindingKind.EFFECT_WITHOUT_INTENT,
                    effect.key,
                    _run_of(effect.key, known),
                    f"{effect.kind} {effect.ref} has no journaled intent",
                )
            )
    for key, intent in known.items():
        if not audited(intent, tools) or key not in found_by_key:
            continue
        found = found_by_key[key]
        status = intent.completed.status if intent.completed else None
        if status == OutcomeStatus.SUCCEEDED and not found:
            findings.append(
                Finding(
                    FindingKind.SUCCESS_WITHOUT_EFFECT,
                    key,
                    intent.run_id,
                    f"journal says {intent.request.tool} succeeded; the provider has no effect for the key",
                )
            )
        if found and status != OutcomeStatus.SUCCEEDED and intent.run_terminal:
            findings.append(
                Finding(
                    FindingKind.EFFECT_NOT_JOURNALED,
                    key,
                    intent.run_id,
                    f"the provider holds {intent.request.tool} for the key; the ended run journaled {status or 'no receipt'}",
                )
            )
    for rule in rules:
        findings.extend(rule(known))
    return findings


def unknown_events(journals: Mapping[str, Sequence[JournalEvent]]) -> dict[str, list[str]]:
    """Runs whose journal holds event types this version does not know (a newer writer's): reported, not fatal."""
    out: dict[str, list[str]] = {}
    for run_id, events in journals.items():
        tags = [e.type for e in events if isinstance(e, UnknownEvent)]
        if tags:
            out[run_id] = tags
    return out


def _run_of(key: str, known: Mapping[str, Intent]) -> str:
    """The run an effect's key belongs to: the run that journaled it (a business key names no run), else the run
    a step key starts with, else none."""
    intent = known.get(key) or known.get(undone_by(key) or "")
    if intent is not None:
        return intent.run_id
    return key.split(":", 1)[0] if key.startswith("run_") else ""
