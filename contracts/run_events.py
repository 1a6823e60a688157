"""The run journal: every event a run's state is folded from. Public: analytics teams consume these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeAlias, get_args

import msgspec

from crashsafe.contracts.capabilities import Capability
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.memory import GuestProfile, SessionTurn
from crashsafe.contracts.subjects import EventClass
from crashsafe.contracts.tool_messages import Evidence, ExistingEffect, OutcomeStatus, Via


class Origin(StrEnum):
    """Who asked for an action (`ActionRequested.origin`, `ToolRejected.origin`; `str` on the wire: open)."""

    MODEL = "model"  # a tool call in the model's answer
    PLAN = "plan"  # an agent's code (a scripted step)
    COMPENSATION = "compensation"  # the runtime undoing an effect


class RunStatus(StrEnum):
    """Where a run is: derived by the fold (`RunState.status`), answered by `GET /v1/runs/{id}`."""

    RUNNING = "running"
    COMPLETED = "completed"
    HANDED_OFF = "handed_off"


class HandOffReason(StrEnum):
    """Why a run was handed to a person (`RunHandedOff.reason`; `str` on the wire: open)."""

    BUDGET_STEPS = "budget_steps"
    BUDGET_TOKENS = "budget_tokens"
    DEADLINE = "deadline"
    OUTCOME_UNKNOWN = "outcome_unknown"  # reconcile by key before anything else
    COMPENSATION_FAILED = "compensation_failed"  # a person must undo the effect
    LOOP = "loop"  # the model asked for the same call again and again
    # The catalog revision the run is pinned to left the bucket's history: it cannot go on under its own rules.
    CATALOG_REVISION_GONE = "catalog_revision_gone"
    # Every model route failed this many calls in a row (MAX_FAILED_ASKS): no model to answer, a person does.
    MODEL_UNAVAILABLE = "model_unavailable"
    # A policy question while the policy documents are missing: never an invented policy, a person answers.
    POLICY_UNAVAILABLE = "policy_unavailable"
    # The agent's code raised, answered the wrong type, or asked for a move that makes no progress (`AgentFault`).
    AGENT_FAULT = "agent_fault"


# What one tool call's arguments may be before the runtime even decodes them. A default here, in the contract,
# because `Budget` is pinned by the `run.started` golden; an agent may declare its own `argument_limits`.
MAX_TOOL_ARGUMENT_BYTES = 16 * 1024
MAX_TOOL_ARGUMENT_DEPTH = 32
# The largest event the runtime journals: the broker's default max payload (1 MB) less room for headers.
MAX_EVENT_BYTES = 1024 * 1024 - 16 * 1024


class ArgumentLimits(msgspec.Struct, frozen=True, kw_only=True):
    """How large (UTF-8 bytes) and how deeply nested one tool call's arguments may be; past either: rejected."""

    max_bytes: int = MAX_TOOL_ARGUMENT_BYTES
    max_depth: int = MAX_TOOL_ARGUMENT_DEPTH


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Per-run limits; past any of them the run is handed to support with its journal."""

    max_steps: int = 20
    max_tokens: int = 60_000
    deadline_s: float = 90.0


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call as the model (or a plan) asked for it, before the runtime checked it."""

    call_id: str
    name: str
    arguments: str


class RunEventBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of the run event family (the union of its members is `RunEvent`). Every event names its run and
    when the runtime decided it."""

    run_id: str
    at: datetime


class RunStarted(RunEventBase, frozen=True, kw_only=True, tag="run.started"):
    agent: str
    session_id: str
    guest_id: str
    event_id: str
    idempotency_key: str
    input_hash: str
    text: str
    budget: Budget = Budget()
    deadline_at: datetime
    # The tenant whose client started the run (from the inbound event): who may read it.
    tenant: str = ""
    # The catalog revision the run keeps to its end (0: the deployment's built-in catalog).
    catalog_revision: int = 0
    # What the run knew of its guest and session when it started (read once, so replay never reads again).
    profile: GuestProfile | None = None
    history: list[SessionTurn] = []
    # How this run keys its actions (a keys.KeyScheme): "" for journals from before business keys.
    key_scheme: str = ""
    # Who the guest is at the providers (a keys.GuestScope): "" for journals from before tenant accounts, where
    # a guest was its id alone; "tenant": (tenant, guest), every call in the tenant's own provider account.
    guest_scope: str = ""
    # The id of the client key whose message started the run (`InboundEvent.sent_by`): that key never decides this
    # run's approvals, an admin key included. "": not known (a run journaled before, or sent by a gateway that did
    # not say); then the key's scopes alone decide (`access.may_approve`).
    started_by: str = ""


class Passage(msgspec.Struct, frozen=True, kw_only=True):
    """A piece of the agent's documents retrieved for a model call, journaled with the step it fed."""

    doc: str
    section: str
    text: str
    score: float


class ModelAnswered(RunEventBase, frozen=True, kw_only=True, tag="run.model_answered"):
    """The model's answer for a step, journaled so a resumed run never asks the model for it again."""

    step_no: int
    model: str
    response_id: str
    tool_calls: list[ToolCall] = []
    reply: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    # Which configured route answered, and the ones that failed before it ("route: why").
    provider: str = ""
    failovers: list[str] = []
    # What retrieval gave the model for this step (placed before the answer in the model's view).
    passages: list[Passage] = []


class ActionRequested(RunEventBase, frozen=True, kw_only=True, tag="run.action_requested"):
    """The durable intent to act: journaled before the request is published to the executor."""

    step_no: int
    call_id: str
    tool: str
    family: str
    args: dict[str, Any]
    key: str
    input_hash: str
    timeout_s: float
    deadline_at: datetime
    origin: str = Origin.MODEL.value  # an Origin
    # The journal as the bus (issue 33): an intent journaled on its executor's subject (`run_intent`) carries
    # the runtime's signed permission for exactly this request, as `ActionRequest.capability` does; the executor
    # pulls it straight from the journal. None: journaled as a step and sent on ACTIONS (0.2, or before the bus).
    capability: Capability | None = None


class ToolRejected(RunEventBase, frozen=True, kw_only=True, tag="run.tool_rejected"):
    """The runtime refused a tool call before any effect (unknown tool, bad arguments, a record the run never made)."""

    step_no: int
    call_id: str
    tool: str
    error: ErrorInfo
    origin: str = Origin.MODEL.value  # an Origin


class ActionCompleted(RunEventBase, frozen=True, kw_only=True, tag="run.action_completed"):
    """The executor's receipt for a step, journaled before the outcome message is acknowledged."""

    step_no: int
    key: str
    status: OutcomeStatus
    result: dict[str, Any] = {}
    error: ErrorInfo | None = None
    provider_ref: str | None = None
    via: str = Via.CALL.value  # a Via
    attempts: int = 1
    deliveries: int = 1
    evidence: list[Evidence] = []
    # An `idempotency_conflict` whose key already made an effect for this run's account and guest: that effect,
    # shown to the model with the conflict (`ActionOutcome.existing`).
    existing: ExistingEffect | None = None
    # The tool of the request this receipt completes, as the runtime journaled it (issue 32): a reader matches
    # receipts to tools without joining by key. "": journaled by 0.2, which did not say (its request names it).
    tool: str = ""
    # The executor family that appended this receipt itself, on its own subject (`run_receipt`, the journal as
    # the bus): the fold takes it only for a request of that family, key, tool and step the run journaled, and a
    # reader takes it only where the subject names that family. "": journaled by the runtime, which checked it.
    family: str = ""


class RunNudged(RunEventBase, frozen=True, kw_only=True, tag="run.nudged"):
    """Someone (the reconciler, an operator) asked the run to re-check its open actions: evidence of the ask."""

    by: str
    reason: str
    keys: list[str] = []


class RunResumed(RunEventBase, frozen=True, kw_only=True, tag="run.resumed"):
    """A worker picked up a run it did not have in memory: evidence of where a restart resumed."""

    worker: str
    next_step: int
    reason: str


class RunCompleted(RunEventBase, frozen=True, kw_only=True, tag="run.completed"):
    reply: str


class ModelAsked(RunEventBase, frozen=True, kw_only=True, tag="run.model_asked"):
    """A model call whose answer may never reach the journal, so that it still counts against the step and token
    budgets: journaled before the call when the run is at risk (it was resumed, or lost an ask before), and after
    a call that failed (`failed` says how). `input_bytes` is what the call sent. Does not take a step number."""

    step_no: int
    model: str = ""
    input_bytes: int = 0
    failed: str = ""  # empty: asked, answer to follow; else the call failed and its answer is lost


class ModelRejected(RunEventBase, frozen=True, kw_only=True, tag="run.model_rejected"):
    """The model answered, but the runtime refused to journal the answer (too large for the journal): a step."""

    step_no: int
    model: str
    response_id: str
    error: ErrorInfo
    answer_bytes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class RunHandedOff(RunEventBase, frozen=True, kw_only=True, tag="run.handed_off"):
    """The run stopped short of completion and is handed to a person, with the reason."""

    reason: str  # a HandOffReason
    detail: str = ""
    reply: str = ""  # what the guest is told


class PolicyDenied(RunEventBase, frozen=True, kw_only=True, tag="run.policy_denied"):
    """A rule refused an action before it was journaled as requested: the model is told `not_allowed`. A step."""

    step_no: int
    call_id: str
    tool: str
    rule: str
    reason: str
    origin: str = Origin.MODEL.value


class ApprovalRequested(RunEventBase, frozen=True, kw_only=True, tag="run.approval_requested"):
    """A rule holds an action back until someone approves that exact action (its input hash and amount). A step.

    `call` is the tool call as asked: once approved, it is planned again, and the approval holds only if it
    prepares to the same input hash."""

    step_no: int
    approval_id: str
    call: ToolCall
    tool: str
    args: dict[str, Any]
    input_hash: str
    amount_cents: int | None = None
    currency: str = ""
    approver: str  # an Approver
    rule: str
    reason: str
    expires_at: datetime
    question: str = ""  # what the guest (or the manager) is asked


class ApprovalDecided(RunEventBase, frozen=True, kw_only=True, tag="run.approval_decided"):
    """How an approval ended, as its record says (the record is decided once, by compare-and-set)."""

    approval_id: str
    decision: str  # an ApprovalStatus other than pending
    decided_by: str
    reason: str = ""
    input_hash: str
    # The guest's message this decision answered (a "yes" in the session), taken out of the run's inbox.
    turn_event_id: str = ""


class TurnReceived(RunEventBase, frozen=True, kw_only=True, tag="run.turn_received"):
    """A further guest message of the run's session, handed to the run as its next turn (the session lane)."""

    event_id: str
    text: str


# The run event family: what the journal holds, what the fold folds, what analytics consumers decode.
RunEvent: TypeAlias = (
    RunStarted
    | ModelAnswered
    | ActionRequested
    | ToolRejected
    | ActionCompleted
    | ModelAsked
    | ModelRejected
    | RunNudged
    | RunResumed
    | RunCompleted
    | RunHandedOff
    | PolicyDenied
    | ApprovalRequested
    | ApprovalDecided
    | TurnReceived
)


def event_id(run_id: str, position: int) -> str:
    """An event's id: its run and its 1-based position in the run's journal (appends are fenced by the subject
    sequence, so a position names one event forever). What the audit trail and analytics deduplicate by."""
    if position < 1:
        raise ValueError("journal positions count from 1")
    return f"{run_id}/{position}"


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """A journal event whose tag this version does not know (a newer replica wrote it): kept, skipped by the fold.

    Never encoded by this version; `data` is the event as it was journaled. `step_no`, if the event carries one,
    keeps the fold from ever reusing that step number (and so its action key)."""

    type: str
    run_id: str
    at: datetime
    data: bytes
    step_no: int | None = None


# What a journal read gives: every event this version knows, and the ones it does not, in journal order.
JournalEvent: TypeAlias = RunEvent | UnknownEvent


class _Envelope(msgspec.Struct, kw_only=True):
    type: str
    run_id: str
    at: datetime
    step_no: int | None = None


event_encoder = msgspec.json.Encoder()
event_decoder = msgspec.json.Decoder(RunEvent)
_envelope_decoder = msgspec.json.Decoder(_Envelope)
_TAGS: dict[type, str] = {t: str(t.__struct_config__.tag) for t in get_args(RunEvent)}
KNOWN_TAGS = frozenset(_TAGS.values())


def event_type(event: RunEvent) -> str:
    """An event's `type` on the wire (`run.completed`)."""
    return _TAGS[type(event)]


def decode_event(data: bytes) -> JournalEvent:
    """Decode one journal event tolerantly: an unknown tag becomes an `UnknownEvent`; a known tag that does not
    decode, or bytes that are not an event at all, still raise `msgspec.DecodeError` (that is corruption)."""
    try:
        return event_decoder.decode(data)
    except msgspec.ValidationError:
        envelope = _envelope_decoder.decode(data)  # raises if this is not an event envelope
        if envelope.type in KNOWN_TAGS:
            raise
        return UnknownEvent(
            type=envelope.type, run_id=envelope.run_id, at=envelope.at, data=data, step_no=envelope.step_no
        )


# What the journal's event classes are made of (`contracts.subjects.EventClass`): a run's end, and its wait on a person.
RUN_ENDS = frozenset({_TAGS[RunCompleted], _TAGS[RunHandedOff]})
RUN_WAITS = frozenset({_TAGS[ApprovalRequested]})


def event_class(event_type: str, after_end: bool) -> EventClass:
    """The class an event is journaled under: a milestone if it ends its run, makes it wait on a person, or is
    appended after the run ended (a late receipt after a hand-off); a step otherwise."""
    if after_end or event_type in RUN_ENDS or event_type in RUN_WAITS:
        return EventClass.MILESTONE
    return EventClass.STEP
