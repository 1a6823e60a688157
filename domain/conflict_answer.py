"""A conflict that says what its key already did, told only to the effect's owner. Pure.

A business key names an intent (`keys.business_key`: what, for which tenant, on which identity fields). Asked
again with an argument outside the identity (another slot for the same pet, vet and day), it is answered
`idempotency_conflict` and the provider is never reached: never two holds. What the guest needs to hear then is
what the key already holds, so the conflict carries the first asker's settled success (`ExistingEffect`), when
the effect still exists and the request names the same provider account and guest as the first asker's. The
tenant is bound by the key's digest; this is the second fence, over what the arguments name."""

from __future__ import annotations

import msgspec

from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    ExistingEffect,
    OutcomeStatus,
    RecordStatus,
)
from crashsafe.domain.execution import Record
from crashsafe.domain.key_facts import KeyOwner, owner_of, shared


def existing_of(record: Record, undone: Record | None) -> ExistingEffect | None:
    """The effect the key holds now: its settled success, unless a compensation of it succeeded or is still
    under way (the effect may be gone already). A failed receipt made nothing: there is nothing to show."""
    stored = record.outcome
    if stored is None or not record.status.settled or stored.status != OutcomeStatus.SUCCEEDED:
        return None
    if undone is not None and undone.status != RecordStatus.FAILED:
        return None
    return ExistingEffect(result=stored.result, provider_ref=stored.provider_ref)


def owned_by_asker(request: ActionRequest, record: Record, first_owner: KeyOwner | None) -> bool:
    """Whether the request may see the key's effect. A step key (`run_…:n`) is only ever its own run's; a shared
    key's first asker named an account and a guest (`KeyFacts.owner`), and the request must name the same two.
    An owner not known (facts written by 0.2.0) shows nothing, nor one whose arguments named no guest: two guests
    of one tenant would then name the same nobody, and one would be shown the other's effect."""
    if not shared(request.key):
        return bool(record.run_id) and record.run_id == request.run_id
    return first_owner is not None and bool(first_owner.guest) and first_owner == owner_of(request.args)


def told(
    conflict: ActionOutcome,
    request: ActionRequest,
    record: Record,
    undone: Record | None,
    first_owner: KeyOwner | None,
) -> ActionOutcome:
    """The conflict as the asker hears it: with the existing effect if there is one and it is the asker's."""
    existing = existing_of(record, undone)
    if existing is None or not owned_by_asker(request, record, first_owner):
        return conflict
    error = conflict.error
    if error is not None:
        error = msgspec.structs.replace(
            error,
            message=(
                f"{request.tool} for key {request.key} already took effect with other arguments; nothing new was"
                " sent to the provider. What it holds is `existing`: tell the guest, or undo it before asking anew."
            ),
        )
    return msgspec.structs.replace(conflict, error=error, existing=existing)
