"""The run's actions checked from both ends: each intent against the capability the runtime signed for it, and
what the providers hold against the intents and receipts the journal says led to it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from crashsafe.contracts.capabilities import CapabilityOrigin, signed_bytes
from crashsafe.contracts.evidence import ProviderAnswer
from crashsafe.contracts.keys import tool_input_hash
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, Origin, RunStarted
from crashsafe.contracts.tool_messages import Answer, OutcomeStatus
from crashsafe.evidence_findings import Check, Finding, Place, Status
from crashsafe.evidence_keys import SigningKeys, signature_holds

# A lookup that says nothing either way (`contracts.provider_view`; no_answer is the gateway's own).
SILENT = frozenset({Answer.UNKNOWN.value, "no_lookup", "no_answer"})
# Fields an effect and an intent's arguments may both state: where both do, they must agree.
AMOUNT_FIELDS = ("amount_cents", "amount", "currency")


def read_capabilities(places: Sequence[Place], keys: SigningKeys) -> list[Finding]:
    """Every journaled intent that carries a capability: signed by a key we accept, over exactly this intent."""
    first = places[0].event if places else None
    agent = first.agent if isinstance(first, RunStarted) else None
    findings: list[Finding] = []
    for place in places:
        intent = place.event
        if not isinstance(intent, ActionRequested):
            continue
        if intent.capability is None:
            findings.append(
                place.finding(
                    Check.CAPABILITY,
                    Status.UNCHECKED,
                    f"{place.named()} carries no capability (journaled before 0.4.0 carried them, or sent on "
                    "ACTIONS): nothing shows the runtime signed it",
                )
            )
            continue
        problem = _capability_problem(intent, agent, keys)
        status = Status.FAIL if problem else Status.PASS
        findings.append(place.finding(Check.CAPABILITY, status, problem or "its capability holds"))
    return findings


def _capability_problem(intent: ActionRequested, agent: str | None, keys: SigningKeys) -> str:
    cap = intent.capability
    assert cap is not None
    raw, why = keys.key(cap.kid)
    if raw is None:
        return f"its capability is {why}"
    try:
        message = signed_bytes(cap)
    except (TypeError, ValueError, OverflowError):
        return "its capability's signed fields cannot be read (an expiry without a time zone?)"
    if not signature_holds(raw, message, cap.sig):
        return f"its capability's signature does not hold under key {cap.kid!r}: it was forged or altered"
    signed = {"run_id": cap.run_id, "key": cap.key, "tool": cap.tool, "family": cap.family}
    journaled = {"run_id": intent.run_id, "key": intent.key, "tool": intent.tool, "family": intent.family}
    signed["input_hash"], journaled["input_hash"] = cap.input_hash, intent.input_hash
    differing = [f"{k} {journaled[k]!r} (signed: {signed[k]!r})" for k in signed if signed[k] != journaled[k]]
    if differing:
        return f"the intent differs from what the runtime signed for it: {', '.join(differing)}"
    # Recomputed, never trusted: the journaled hash is part of what a forger would edit along with the args.
    if tool_input_hash(intent.tool, intent.args) != cap.input_hash:
        return (
            f"its args do not hash to the input the runtime signed: the args of {intent.tool} were altered "
            "after it was signed"
        )
    expected = (
        CapabilityOrigin.COMPENSATION if intent.origin == Origin.COMPENSATION else CapabilityOrigin.PLAN
    )
    if cap.origin != expected:
        return (
            f"it was signed as a {cap.origin!r} action, but the intent says its origin is {intent.origin!r}"
        )
    if cap.agent and agent is not None and cap.agent != agent:
        return f"its capability was signed for agent {cap.agent!r}, but the run is agent {agent!r}'s"
    return ""


def read_effects(places: Sequence[Place], answers: Sequence[ProviderAnswer], asked: bool) -> list[Finding]:
    """What each provider holds for each of the run's keys against the journal: an effect found must have been
    asked for (tool and amounts as journaled) and reported done; a key the journal reports done must not be one
    the provider never saw."""
    if not asked:
        return [
            Finding(
                check=Check.EFFECT,
                status=Status.UNCHECKED,
                message="the bundle was made without asking the providers (--no-providers): no effect is checked",
            )
        ]
    intents: dict[str, list[tuple[Place, ActionRequested]]] = defaultdict(list)
    receipts: dict[str, list[tuple[Place, ActionCompleted]]] = defaultdict(list)
    for place in places:
        if isinstance(place.event, ActionRequested):
            intents[place.event.key].append((place, place.event))
        elif isinstance(place.event, ActionCompleted):
            receipts[place.event.key].append((place, place.event))
    findings = [_effect(a, intents.get(a.key, []), receipts.get(a.key, [])) for a in answers]
    answered = {a.key for a in answers}
    for key, asked_for in intents.items():
        if key not in answered:
            place, intent = asked_for[0]
            findings.append(
                place.finding(
                    Check.EFFECT,
                    Status.UNCHECKED,
                    f"the bundle holds no provider answer about key {key!r} ({intent.tool}): its effect is not "
                    "checked",
                )
            )
    return findings


def _finding(status: Status, message: str, place: Place | None) -> Finding:
    if place is None:
        return Finding(check=Check.EFFECT, status=status, message=message)
    return place.finding(Check.EFFECT, status, message)


def _effect(
    answer: ProviderAnswer,
    intents: list[tuple[Place, ActionRequested]],
    receipts: list[tuple[Place, ActionCompleted]],
) -> Finding:
    about = f"key {answer.key!r} ({answer.tool})"
    intent_at = intents[0][0] if intents else None
    if answer.answer in SILENT:
        message = f"the provider's answer about {about} is {answer.answer}: its effect is not checked"
        return _finding(Status.UNCHECKED, message, intent_at)
    found = answer.answer == Answer.FOUND
    if not intents:
        if found:
            message = f"the provider holds an effect for {about} that no intent here asked for"
            return _finding(Status.FAIL, message, None)
        return _finding(
            Status.UNCHECKED, f"the bundle asks the provider about {about}, which no intent names", None
        )
    for place, intent in intents:
        if intent.tool != answer.tool:
            message = (
                f"the provider's answer about key {answer.key!r} is for {answer.tool}, but the intent with that "
                f"key asked for {intent.tool}"
            )
            return _finding(Status.FAIL, message, place)
    done = [(p, r) for p, r in receipts if r.status == OutcomeStatus.SUCCEEDED]
    if found:
        return _found(answer, intents, receipts, done)
    if answer.answer not in (Answer.ABSENT, Answer.REJECTED):
        return _finding(Status.UNCHECKED, f"the provider answered {answer.answer!r} about {about}", intent_at)
    if done:
        never = "never saw the key" if answer.answer == Answer.ABSENT else "holds it as refused"
        message = f"the journal reports {about} succeeded, but the provider {never}"
        return _finding(Status.FAIL, message, done[0][0])
    return _finding(
        Status.PASS, f"the provider's {answer.answer} answer about {about} matches the journal", intent_at
    )


def _found(
    answer: ProviderAnswer,
    intents: list[tuple[Place, ActionRequested]],
    receipts: list[tuple[Place, ActionCompleted]],
    done: list[tuple[Place, ActionCompleted]],
) -> Finding:
    """An effect the provider holds: asked for, with the amounts asked, and reported done, once."""
    about = f"key {answer.key!r} ({answer.tool})"
    intent_at = intents[0][0]
    if not done:
        refused = [p for p, r in receipts if r.status == OutcomeStatus.FAILED]
        if refused:
            message = (
                f"the journal says the provider refused {about}, but the provider holds an effect for it"
            )
            return _finding(Status.FAIL, message, refused[0])
        if any(r.status == OutcomeStatus.CONFLICT for _, r in receipts):
            message = (
                f"the journal reports {about} as a conflict: the effect the provider holds was made by the "
                "key's first use, not by this intent"
            )
            return _finding(Status.UNCHECKED, message, intent_at)
        message = (
            f"the provider holds an effect for {about}, but no receipt in the journal reports it done: its "
            "outcome was never journaled as known (reconcile the key)"
        )
        return _finding(Status.UNCOVERED, message, intent_at)
    refs = sorted({r.provider_ref for _, r in done if r.provider_ref})
    if len(refs) > 1:
        return _finding(
            Status.FAIL, f"two receipts report different effects for {about}: {refs}", done[-1][0]
        )
    if answer.ref and refs and answer.ref not in refs:
        message = f"the provider's effect for {about} is {answer.ref!r}, but the journal's receipt names {refs[0]!r}"
        return _finding(Status.FAIL, message, done[0][0])
    for place, intent in intents:
        for name in AMOUNT_FIELDS:
            held, asked = answer.effect.get(name), intent.args.get(name)
            if held is not None and asked is not None and held != asked:
                message = (
                    f"the provider holds {name} {held!r} for {about}, but the intent asked for {asked!r}"
                )
                return _finding(Status.FAIL, message, place)
    return _finding(
        Status.PASS, f"the provider's effect for {about} matches its intent and receipt", intent_at
    )
