"""What the runtime asks a tool executor to do, and what the executor answers."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec

from contracts.errors import ErrorInfo


class OutcomeStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the provider said no; definitive
    CONFLICT = "conflict"  # the key was reused with a different input; nothing reached the provider
    UNKNOWN = "unknown"  # we could not tell; never reported as failure, never retried blind


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """One question asked while settling a key, and the answer: the trail an operator reads after an incident."""

    asked: str  # provider.call | provider.lookup | store.receipt | store.conflict
    key: str
    answer: str  # ok | rejected | unknown | found | absent | replayed | conflict
    detail: str = ""
    at: datetime


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
    # How this receipt came to be: "call", "replay" (stored receipt returned), "provider_lookup" (recovered by key).
    via: str = "call"
    attempts: int = 1
    deliveries: int = 1
    evidence: list[Evidence] = []


class RunWake(ToolMessage, frozen=True, kw_only=True, tag="run.wake"):
    """Ask the runtime to re-fold a run and continue it (sent by the reconciler for runs that stopped moving)."""

    run_id: str
    reason: str
    at: datetime
    by: str = "reconciler"
    keys: list[str] = []


RuntimeMessage = ActionOutcome | RunWake

tool_encoder = msgspec.json.Encoder()
action_request_decoder = msgspec.json.Decoder(ActionRequest)
runtime_message_decoder = msgspec.json.Decoder(RuntimeMessage)
