"""`crashsafe projections list|retry`: an operator reads the projection receipts, and sends a dead projection
again once its receiver is fixed (services/operations/projection_receipts.py does both; this prints them)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

from crashsafe.contracts.projections import ProjectionStatus
from crashsafe.deployment import settings_for
from crashsafe.domain import registry as registries
from crashsafe.services.operations.connection import operator_broker
from crashsafe.services.operations.projection_receipts import (
    NoLongerCalledFor,
    NoProjection,
    NotDead,
    Retried,
    all_receipts,
    retry_projection,
)


def _when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}" if at is not None else "-"


async def projections_list(state_dir: Path, status: str | None, run_id: str | None) -> int:
    """Every receipt (tool, key, run, status, attempts, next attempt, detail), oldest change first."""
    if status is not None and status not in set(ProjectionStatus):
        print(
            f"crashsafe: --status {status}: one of {', '.join(ProjectionStatus)}",
            file=sys.stderr,
        )
        return 2
    settings = settings_for(state_dir)
    async with operator_broker(settings, "crashsafe-projections") as broker:
        receipts = await all_receipts(broker, settings.namespace)
    shown = [
        r
        for r in receipts.records
        if (status is None or r.status == status) and (run_id is None or r.run_id == run_id)
    ]
    for r in shown:
        detail = f"  {r.detail}" if r.detail else ""
        print(
            f"{r.tool}  {r.key}  run {r.run_id}  {r.status}  attempts {r.attempts}  "
            f"next {_when(r.next_attempt_at)}  updated {_when(r.updated_at)}{detail}"
        )
    if not shown:
        print("no projections" + (" with that status" if status else "") + (" of that run" if run_id else ""))
    if receipts.unreadable:
        print(f"NOTE {receipts.unreadable} receipt(s) this version cannot read (a newer writer's): left out")
    return 0


async def projections_retry(state_dir: Path, key: str) -> int:
    """A dead projection sent again (a pending one being tried, or a delivered one, is refused: see
    `retry_projection`)."""
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    ns = settings.namespace
    async with operator_broker(settings, "crashsafe-projections") as broker:
        retry = await retry_projection(
            broker, ns, registry, key, datetime.now(UTC), settings.projection_time_scale
        )
    match retry:
        case NoProjection():
            print(f"crashsafe: no projection {key} in namespace {ns.name}", file=sys.stderr)
            return 1
        case NotDead(record=record):
            what = (
                "the projector is trying it" if record.status == ProjectionStatus.PENDING else "nothing to do"
            )
            print(f"crashsafe: projection {key} is {record.status}, not dead: {what}", file=sys.stderr)
            return 1
        case NoLongerCalledFor(record=record):
            print(
                f"crashsafe: run {record.run_id}'s journal no longer calls for {key} (released or refunded?):"
                " nothing sent",
                file=sys.stderr,
            )
            return 1
        case Retried(record=record, task=task):
            print(f"projection {key} of run {record.run_id}: pending again, sent to the {task.tool} worker")
            return 0
