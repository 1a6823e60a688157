"""What the runtime asks a tool executor to do, and what the executor answers."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypeAlias

import msgspec

from crashsafe.contracts.capabilities import Capability
from crashsafe.contracts.errors import ErrorInfo


class OutcomeStatus(StrEnum):
    """What became of an action. Closed on the wire: a status decides the fold, so a new one is a new tag."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the provider said no; definitive
    CONFLICT = "conflict"  # the key was reused with a different input; nothing reached the provider
    UNKNOWN = "unknown"  # we could not tell; never reported as failure, never retried blind


class Via(StrEnum):
    """How a receipt came to be (`ActionOutcome.via`, `ActionCompleted.via`; `str` on the wire: open)."""

    CALL = "call"  # the provider answered a call
    REPLAY = "replay"  # the stored receipt, sent again; the provider was not called
    PROVIDER_LOOKUP = "provider_lookup"  # recovered by asking the provider by key
    CONFLICT = "conflict"  # the key was used with other input; the provider was never reached
    REFUSED = "refused"  # the executor would not attempt it (unusable arguments); no effect exists
    UNRESOLVED = "unresolved"  # neither call nor lookup could tell; the outcome is unknown


class Asked(StrEnum):
    """Which question was put while settling a key (`Evidence.asked`; `str` on the wire: open)."""

    PROVIDER_CALL = "provider.call"
    PROVIDER_LOOKUP = "provider.lookup"
    STORE_RECEIPT = "store.receipt"
    STORE_CONFLICT = "store.conflict"


class Answer(StrEnum):
    """The answer to one question (`Evidence.answer`; `str` on the wire: open), and a provider answer's kind."""

    OK = "ok"  # call: the provider did it
    REJECTED = (
        "rejected"  # call: the provider said no; lookup: it holds the key's record as refused (declined)
    )
    # call or lookup: no answer we can trust (timeout, dropped connection, 5xx, 408, 429, key in use, a body that
    # is not the provider's, a record still pending, a key past the provider's retention)
    UNKNOWN = "unknown"
    FOUND = "found"  # lookup: the provider holds an effect for the key
    ABSENT = "absent"  # lookup: the provider never saw the key
    REPLAYED = "replayed"  # store: the stored receipt was sent again
    CONFLICT = "conflict"  # store: the key is bound to other input
    REPUBLISHED = "republished"  # store: a recent receipt sent again at start-up


# What a provider call and a provider lookup can answer.
CallAnswer: TypeAlias = Literal[Answer.OK, Answer.REJECTED, Answer.UNKNOWN]
LookupAnswer: TypeAlias = Literal[Answer.FOUND, Answer.ABSENT, Answer.UNKNOWN, Answer.REJECTED]


class RecordStatus(StrEnum):
    """A key's row in an executor's action store (durable in its SQLite file): changing a value is a migration."""

    STARTED = "started"  # the intent is committed; no receipt yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # neither call nor lookup could tell; resolved by key later

    @classmethod
    def of(cls, status: str) -> RecordStatus:
        """The row status for a receipt: succeeded and failed are settled, anything else stays open."""
        if status == OutcomeStatus.SUCCEEDED:
            return cls.SUCCEEDED
        if status == OutcomeStatus.FAILED:
            return cls.FAILED
        return cls.UNKNOWN

    @property
    def settled(self) -> bool:
        return self in (RecordStatus.SUCCEEDED, RecordStatus.FAILED)


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """One question asked while settling a key, and the answer: the trail an operator reads after an incident."""

    asked: str  # an Asked
    key: str
    answer: str  # an Answer
    detail: str = ""
    at: datetime


# The evidence line of a receipt the executor's store answers (`executor.core.first_asked_by`): who made it.
FIRST_MADE_FOR = "first made for "
# Who made it when all that is known is that it was not this request: a provider replayed its answer to the
# first call this key ever had from us (`executor.core.replayed_by_provider`).
ANOTHER_REQUEST = "another-request"


def first_made_detail(run_id: str, step_no: int) -> str:
    """What a receipt answered from the store says about the request that made its effect."""
    return f"{FIRST_MADE_FOR}{run_id} step {step_no}"


def first_made_by(evidence: list[Evidence]) -> str | None:
    """The run whose request made the effect of a receipt answered from the store (a business key asked again
    by another step or run), or None for a receipt of the asker's own call."""
    for line in reversed(evidence):
        # A provider call's line too: the provider replayed an earlier request's answer to our first call.
        asked_whom = line.asked in (Asked.STORE_RECEIPT, Asked.PROVIDER_CALL)
        if asked_whom and line.detail.startswith(FIRST_MADE_FOR):
            return line.detail.removeprefix(FIRST_MADE_FOR).split(" ", 1)[0]
    return None


class ExistingEffect(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a key already did, told with its `idempotency_conflict`: the effect its first asker's settled success
    made (a hold, a charge), so the run can say "you already hold this" instead of "that did not go through". Sent
    only to a request naming the same account and guest as the first asker's (`domain/conflict_answer.py`)."""

    result: dict[str, Any] = {}
    provider_ref: str | None = None


class ToolMessage(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of the tool message family; every member carries an explicit, stable tag."""


class ActionRequest(ToolMessage, frozen=True, kw_only=True, tag="action.request"):
    """Do this action once. `key` is the idempotency key; `input_hash` binds the key to these exact args."""

    run_id: str
    step_no: int
    tool: str
    family: str
    args: dict[str, Any]
    key: str
    input_hash: str
    timeout_s: float
    deadline_at: datetime
    requested_at: datetime
    # The runtime's signed permission for exactly this request (contracts/capabilities.py). An executor refuses
    # a request without one; the default only keeps requests journaled or stored before it existed decodable.
    capability: Capability | None = None


class ActionOutcome(ToolMessage, frozen=True, kw_only=True, tag="action.outcome"):
    """The executor's durable receipt for a key, sent back to the run that asked."""

    run_id: str
    step_no: int
    tool: str
    key: str
    status: OutcomeStatus
    result: dict[str, Any] = {}
    error: ErrorInfo | None = None
    provider_ref: str | None = None
    via: str = Via.CALL.value  # a Via

    attempts: int = 1
    deliveries: int = 1
    evidence: list[Evidence] = []
    # A conflict's key already made an effect for the same account and guest: what it is (None: not told).
    existing: ExistingEffect | None = None


class RunWake(ToolMessage, frozen=True, kw_only=True, tag="run.wake"):
    """Ask the runtime to re-fold a run and continue it (the reconciler, an operator, the runtime's own deadline
    timer). `keys`: journaled actions to resolve; the runtime re-sends their requests with a fresh capability."""

    run_id: str
    reason: str
    at: datetime
    by: str = "reconciler"
    keys: list[str] = []


RuntimeMessage = ActionOutcome | RunWake

tool_encoder = msgspec.json.Encoder()
action_request_decoder = msgspec.json.Decoder(ActionRequest)
runtime_message_decoder = msgspec.json.Decoder(RuntimeMessage)
