"""An action key's facts that must outlive its partition's store: what they are, and pure decisions over them.

A business key is shared by every run of a tenant that asks for the same thing (`keys.business_key`), and a
partition moves between stores (a new volume after a takeover). The store is the fast path for the keys it
knows; for a key it does not know, these facts, kept in the key-facts bucket, say who asked first, with which
input, how many attempts were spent and when the last call was sent, the receipt, and whether a compensation
undid it (docs/decisions.md, "Key facts beside the store")."""

from __future__ import annotations

import msgspec

from crashsafe.contracts.keys import ACCOUNT_ARG, undone_by
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, RecordStatus
from crashsafe.domain.execution import Record
from crashsafe.domain.partition_ownership import Holding


class KeyOwner(msgspec.Struct, frozen=True, kw_only=True):
    """Whose effect a key's is: the provider account and the guest its first asker's arguments named. A conflict
    shows the existing effect only to a request naming the same two (the tenant is in the key's digest)."""

    account: str = ""
    guest: str = ""


def owner_of(args: dict[str, object]) -> KeyOwner:
    """The account and guest a request's arguments name ("" where they name none)."""
    return KeyOwner(account=str(args.get(ACCOUNT_ARG) or ""), guest=str(args.get("guest_id") or ""))


class KeyFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The value of `fact.<family>.<digest(key)>`; rewritten by compare-and-set on its KV revision."""

    key: str
    input_hash: str
    run_id: str  # the run and step whose request first asked for the key: the effect is theirs
    step_no: int
    tool: str
    status: str  # a RecordStatus
    attempts: int = 1
    # Wall clock (epoch seconds) when the latest call with the key was sent: until the tool's in-flight window
    # has passed, a lookup saying "absent" is no proof (that call may still commit).
    sent_at: float | None = None
    outcome: ActionOutcome | None = None  # the settled receipt, as the first asker's store committed it
    undone_by: str = ""  # the compensation key whose success undid the effect (`hold:<d>:release`)
    token: int = 0  # the lease token of the partition holder that wrote this value
    store: str = ""  # the id of the store that wrote it (for an operator reading an incident)
    # The writer's partition epoch: writers are ordered by (epoch, token), and a lower pair is stale. 0: written
    # by 0.2.0 or before epochs, below every epoch (its token may be of a leases bucket since made again).
    epoch: int = 0
    # The first asker's account and guest. None: written by 0.2.0, or rewritten by one (it drops the field): the
    # owner is not known, and a conflict then shows no existing effect.
    owner: KeyOwner | None = None


facts_encoder = msgspec.json.Encoder()
facts_decoder = msgspec.json.Decoder(KeyFacts)


def shared(key: str) -> bool:
    """Whether a key's facts are kept beside the store from its first ask: a business key (and its
    compensation) names an intent other runs may ask for; a step key (`run_…:n`) is only ever its own run's."""
    return not key.startswith("run_")


def first_asked(request: ActionRequest, sent_at: float, holding: Holding, store: str) -> KeyFacts:
    """The facts of a key asked for the first time anywhere: this request is its first asker."""
    return KeyFacts(
        key=request.key,
        input_hash=request.input_hash,
        run_id=request.run_id,
        step_no=request.step_no,
        tool=request.tool,
        status=RecordStatus.STARTED.value,
        attempts=1,
        sent_at=sent_at,
        token=holding.token,
        store=store,
        epoch=holding.epoch,
        owner=owner_of(request.args),
    )


def as_record(facts: KeyFacts) -> Record:
    """The facts as the store's record of the key, so the same `classify` decides for a known and a learnt key."""
    return Record(
        key=facts.key,
        input_hash=facts.input_hash,
        status=RecordStatus(facts.status),
        attempts=facts.attempts,
        outcome=facts.outcome,
        sent_at=facts.sent_at,
        run_id=facts.run_id,
        step_no=facts.step_no,
    )


def undone_record(facts: KeyFacts) -> Record | None:
    """The compensation that undid the key's effect, as `classify` takes it (settled success), if one did."""
    if not facts.undone_by:
        return None
    return Record(key=facts.undone_by, input_hash="", status=RecordStatus.SUCCEEDED, attempts=1, outcome=None)


def attempted(facts: KeyFacts, attempts: int, sent_at: float, holding: Holding, store: str) -> KeyFacts:
    """Another call is about to be sent with the key."""
    return msgspec.structs.replace(
        facts,
        attempts=max(facts.attempts, attempts),
        sent_at=sent_at,
        token=holding.token,
        store=store,
        epoch=holding.epoch,
    )


def settled(facts: KeyFacts, outcome: ActionOutcome, holding: Holding, store: str) -> KeyFacts:
    """The key's receipt committed. A receipt already there is kept: the first settled answer is the key's."""
    if facts.outcome is not None and RecordStatus(facts.status).settled:
        epoch, token = max(written_by(facts), holding)
        return msgspec.structs.replace(facts, token=token, epoch=epoch)
    return msgspec.structs.replace(
        facts,
        status=RecordStatus.of(outcome.status).value,
        outcome=outcome,
        attempts=max(facts.attempts, outcome.attempts),
        token=holding.token,
        store=store,
        epoch=holding.epoch,
    )


def undone(facts: KeyFacts, compensation_key: str, holding: Holding, store: str) -> KeyFacts:
    return msgspec.structs.replace(
        facts, undone_by=compensation_key, token=holding.token, store=store, epoch=holding.epoch
    )


def undoes(outcome: ActionOutcome) -> str | None:
    """The shared key a settled compensation undid (`hold:<d>` for `hold:<d>:release`), if this is one."""
    base = undone_by(outcome.key)
    if base is None or not shared(base) or outcome.status != "succeeded":
        return None
    return base


def written_by(facts: KeyFacts) -> Holding:
    """Where the facts' last writer stood in the partition's fencing order."""
    return Holding(facts.epoch, facts.token)


def stale(current: KeyFacts | None, holding: Holding) -> bool:
    """A writer standing below the one that last wrote the key lost the partition since: it must not write (the
    fence, carried into the bucket). Epochs first: a leases bucket made again restarts the tokens at 1, and a
    holder of the old bucket still alive then carries the higher token but the lower epoch."""
    return current is not None and written_by(current) > holding


def in_flight_left(window_s: float, sent_at: float | None, now: float, skew_s: float) -> float:
    """How long a call sent at wall-clock `sent_at` (maybe by another host) may still be in the provider's
    hands: the tool's in-flight window less the time since, allowing for the hosts' clock skew."""
    if sent_at is None:
        return 0.0
    return max(window_s + skew_s - (now - sent_at), 0.0)
