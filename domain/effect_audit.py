"""`audit`: cross-checks run journals against what providers hold, and names every disagreement. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from crashsafe.contracts.audit import Finding, FindingKind, Intent, ProviderEffect
from crashsafe.contracts.keys import ACCOUNT_ARG, provider_account, undone_by
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    RunCompleted,
    RunHandedOff,
    RunStarted,
    UnknownEvent,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import Effect
from crashsafe.domain.registry import AuditRule, Tool


def intents(journals: Mapping[str, Sequence[JournalEvent]]) -> dict[str, Intent]:
    """Every keyed action any run journaled, by idempotency key, with its receipt if one was journaled.

    A business key is asked by many steps and runs (a replay, an `action_undone` answer, a hold asked again by
    the session's next run): the key is judged by the asker that journaled it succeeded, else by one still in
    flight (it may yet journal it), else by the last to end. Never by whichever journal happened to come last."""
    askers: dict[str, list[Intent]] = {}
    for run_id, events in journals.items():
        terminal = any(isinstance(e, RunCompleted | RunHandedOff) for e in events)
        tenant = next((e.tenant for e in events if isinstance(e, RunStarted)), "")
        requested = {e.step_no: e for e in events if isinstance(e, ActionRequested)}
        completed = {e.step_no: e for e in events if isinstance(e, ActionCompleted)}
        for step, request in requested.items():
            intent = Intent(run_id, request, completed.get(step), terminal, tenant)
            askers.setdefault(request.key, []).append(intent)
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
    findings.extend(other_tenants_guests(journals, tools))
    for rule in rules:
        findings.extend(rule(known))
    return findings


def other_tenants_guests(
    journals: Mapping[str, Sequence[JournalEvent]], tools: Mapping[str, Tool]
) -> list[Finding]:
    """Every action of one tenant's run that names, or was answered with, a provider record (a reservation, a
    payment) that a write of another tenant's run made, or that acts in another tenant's provider account.

    A guest id alone cannot tell (two tenants may each have an `alice`), so records are traced to the run whose
    write the provider answered with them. Every journaled step is judged, reads too: a listing of another
    tenant's guest's payments is already a leak."""
    steps: list[tuple[str, str, ActionRequested, ActionCompleted | None]] = []
    accounts: dict[str, str] = {}  # run -> the provider account it acts in
    for run_id, events in journals.items():
        started = next((e for e in events if isinstance(e, RunStarted)), None)
        tenant = started.tenant if started is not None else ""
        accounts[run_id] = provider_account(tenant, started.guest_scope) if started is not None else ""
        completed = {e.step_no: e for e in events if isinstance(e, ActionCompleted)}
        for e in events:
            if isinstance(e, ActionRequested):
                steps.append((run_id, tenant, e, completed.get(e.step_no)))
    # Record id -> (tenant, run) whose write the provider answered with it.
    made: dict[str, tuple[str, str]] = {}
    for run_id, tenant, request, done in steps:
        tool = tools.get(request.tool)
        if done is None or done.status != OutcomeStatus.SUCCEEDED or tool is None:
            continue
        if tool.contract.effect is not Effect.READ:
            for record in _made(request, done):
                made.setdefault(record, (tenant, run_id))
    findings: list[Finding] = []
    for run_id, tenant, request, done in steps:
        account = request.args.get(ACCOUNT_ARG)
        if account and account != tenant:
            findings.append(
                Finding(
                    FindingKind.OTHER_TENANTS_GUEST,
                    request.key,
                    run_id,
                    f"{request.tool} of tenant {tenant!r} acted in provider account {account!r}",
                )
            )
            continue
        # The provider names each record's account: one not the run's is a leak, whoever made it (a run whose
        # journal is gone, one from before tenants, a write outside crashsafe).
        foreign = _foreign(done.result, accounts[run_id]) if done is not None else []
        if foreign:
            record, owner = foreign[0]
            findings.append(
                Finding(
                    FindingKind.OTHER_TENANTS_GUEST,
                    request.key,
                    run_id,
                    f"{request.tool} of tenant {tenant!r} was answered with {record} of provider account {owner!r}",
                )
            )
            continue
        seen = _ids(request.args) | (_ids(done.result) if done is not None else set())
        # A journal from before tenants (tenant "") is nobody's to compare with.
        others = sorted((r, made[r]) for r in seen if r in made and tenant and made[r][0] not in ("", tenant))
        if others:
            record, (owner, maker) = others[0]
            findings.append(
                Finding(
                    FindingKind.OTHER_TENANTS_GUEST,
                    request.key,
                    run_id,
                    f"{request.tool} of tenant {tenant!r} touched {record}, made for tenant {owner!r} by {maker}",
                )
            )
    return findings


def _made(request: ActionRequested, done: ActionCompleted) -> set[str]:
    """The records a write made: the one its provider names as the effect (its ref), else every id of its answer
    that its request did not name. Not every id of the answer: a reservation names the desk it is for, and another
    tenant's reservation of that desk (another day, or after a release) touches no record of this run's."""
    if done.provider_ref:
        return {done.provider_ref}
    return _ids(done.result) - _ids(request.args)


def _ids(value: object) -> set[str]:
    """The provider record ids in a value: every string under a key ending in `_id` (but the guest's and the
    run's own), at any depth (a listing's payments)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for name, item in value.items():
            if isinstance(item, str) and name.endswith("_id") and name not in _NOT_RECORDS and item:
                found.add(item)
            elif isinstance(item, dict | list):
                found |= _ids(item)
    elif isinstance(value, list):
        for item in value:
            found |= _ids(item)
    return found


def _foreign(value: object, account: str) -> list[tuple[str, str]]:
    """(record id, account) of every record in a value, at any depth, that its provider says is another account's
    than `account`: a dict naming an `account` and a record id of its own."""
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        owner = value.get(ACCOUNT_ARG)
        own_ids = sorted(
            item
            for name, item in value.items()
            if isinstance(item, str) and name.endswith("_id") and name not in _NOT_RECORDS and item
        )
        if isinstance(owner, str) and owner != account and own_ids:
            found.append((own_ids[0], owner))
        for item in value.values():
            if isinstance(item, dict | list):
                found += _foreign(item, account)
    elif isinstance(value, list):
        for item in value:
            found += _foreign(item, account)
    return found


# Ids that name no provider record: a guest id is per tenant, and the rest are ours.
_NOT_RECORDS = frozenset({"guest_id", "run_id", "session_id", "event_id", "hotel_id", "call_id"})


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
