"""Projections: effects derived from a run's durable events, delivered off its critical path. Public contract.

A confirmation email, a CRM record and the audit trail are not steps of the run: the run's event stream is the
outbox. The projector plans each projection from a run's journal (`ProjectionTask` on
`<ns>.projection.<tool>.<run_id>`), delivers it with the receiver's dedup key and its own `RetryPolicy`, and keeps
a `ProjectionRecord` per key (`<ns>_projections` bucket). After the last attempt the task is dead: a dead letter
on `<ns>.dead.projector` and a `ProjectionFailed` for operators on `<ns>.ops.projection_failed.<tool>`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec

# The platform's own projection: every run's events, delivered to the audit log (deduplicated by event id).
AUDIT_TRAIL_TOOL = "record_audit"


class ProjectionStatus(StrEnum):
    PENDING = "pending"  # planned or between attempts
    DELIVERED = "delivered"  # the receiver acknowledged it (its receipt is this record)
    DEAD = "dead"  # every attempt failed, or the receiver refused it: an operator acts


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How one projection is retried. `attempts` quick tries with the growing pauses of `backoff_s`, then one try
    every `long_every_s` (an outage measured in tens of minutes) until `give_up_after_s` have passed since it was
    planned; then it is dead. A receiver's typed refusal (4xx) is dead at once: trying again cannot change it."""

    attempts: int = 5
    backoff_s: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0)
    long_every_s: float = 300.0
    give_up_after_s: float = 7200.0


class ProjectionTask(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="projection.task"):
    """One delivery to make, planned from a run's journal, on `<ns>.projection.<tool>.<run_id>`.

    `key` is what the receiver deduplicates by (an email's message key, `crm:<guest, reservation>`, the audit trail's
    `audit:<run_id>:<upto>` whose records are deduplicated by event id); planning it twice plans the same key."""

    tool: str  # the registry tool whose operation delivers it
    key: str
    run_id: str
    tenant: str
    agent: str
    args: dict[str, Any] = {}
    planned_at: datetime
    # The audit trail: events 1..upto of the run's journal (their event ids `<run_id>/<n>`).
    upto: int = 0


class ProjectionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The projector's receipt of one projection key, `projection.<tool>.<digest(key)>` in `<ns>_projections`:
    written durable before the task is acknowledged, read by the reconciler to find missing projections."""

    tool: str
    key: str
    run_id: str
    status: ProjectionStatus
    attempts: int = 0
    planned_at: datetime
    updated_at: datetime
    next_attempt_at: datetime | None = None
    provider_ref: str | None = None
    detail: str = ""  # the last failure, for a person


class PlannedProjection(msgspec.Struct, frozen=True, kw_only=True):
    """One task of a plan: the tool that delivers it and its key (together they name its receipt)."""

    tool: str
    key: str


class ProjectionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What the projector planned for an ended run, `plan.<digest(run_id)>` in `<ns>_projections`, written once
    the plan's tasks are published (kept as long as the planner plans a run again). The reconciler tells a run
    whose every projection has settled from this and the receipts alone, without reading its journal, if no
    milestone of the run it saw is later than `last_seq`; otherwise it reads the journal."""

    run_id: str
    events: int  # the journal's length it was planned from
    last_seq: int  # the stream sequence of that journal's last event
    planned_at: datetime
    tasks: tuple[PlannedProjection, ...] = ()


class ProjectionFailed(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="ops.projection_failed"
):
    """For operators: a projection gave up (its dead letter holds the task). Retry with `crashsafe projections
    retry KEY` once the receiver is fixed."""

    tool: str
    key: str
    run_id: str
    tenant: str
    attempts: int
    code: str
    reason: str
    planned_at: datetime
    at: datetime


task_encoder = msgspec.json.Encoder()
task_decoder = msgspec.json.Decoder(ProjectionTask)
record_decoder = msgspec.json.Decoder(ProjectionRecord)
plan_decoder = msgspec.json.Decoder(ProjectionPlan)
failed_decoder = msgspec.json.Decoder(ProjectionFailed)
