"""`crashsafe projections list|retry`: an operator reads the projection receipts, and sends a dead projection
again once its receiver is fixed (re-planned from the run's journal, so it carries what the run decided)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from crashsafe.contracts.projections import (
    ProjectionRecord,
    ProjectionStatus,
    record_decoder,
    task_encoder,
)
from crashsafe.contracts.streams import projections_spec
from crashsafe.domain import registry as registries
from crashsafe.domain.missing_projections import STALE_S, Verdict, retried_record, verdict
from crashsafe.operations import settings_for
from crashsafe.services.operations.replan import replan_projection
from crashsafe.services.platform.jetstream import Broker, KvEntry

record_encoder = msgspec.json.Encoder()


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
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-projections", fail_fast=True, access=settings.nats_access
    )
    try:
        entries = await broker.kv_scan(projections_spec(settings.namespace), "projection.>")
    finally:
        await broker.close()
    records: list[ProjectionRecord] = []
    unreadable = 0
    for entry in entries:
        try:
            records.append(record_decoder.decode(entry.value))
        except msgspec.DecodeError:
            unreadable += 1
    shown = [
        r
        for r in sorted(records, key=lambda r: r.updated_at)
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
    if unreadable:
        print(f"NOTE {unreadable} receipt(s) this version cannot read (a newer writer's): left out")
    return 0


async def projections_retry(state_dir: Path, key: str) -> int:
    """A dead projection sent again: its receipt back to pending, its task re-planned and published. A pending
    one is the projector's (it is being tried) unless its next attempt is long past, a delivered one is done:
    both are refused."""
    settings = settings_for(state_dir)
    registry = registries.load(settings.registry)
    ns = settings.namespace
    spec = projections_spec(ns)
    broker = await Broker.connect(
        settings.nats_url, "crashsafe-projections", fail_fast=True, access=settings.nats_access
    )
    try:
        found: tuple[KvEntry, ProjectionRecord] | None = None
        for tool in registry.projections:
            entry = await broker.kv_get(spec, ns.projection_record_key(tool, key))
            if entry is not None:
                found = (entry, record_decoder.decode(entry.value))
                break
        if found is None:
            print(f"crashsafe: no projection {key} in namespace {ns.name}", file=sys.stderr)
            return 1
        entry, record = found
        now = datetime.now(UTC)
        # A pending receipt whose next attempt is long past has nobody trying it (a retry that died before its
        # publish; a run the reconciler no longer tracks): the operator's retry is its way back.
        orphaned = (
            record.status == ProjectionStatus.PENDING
            and verdict(record, now, STALE_S * settings.projection_time_scale) is Verdict.STALE
        )
        if record.status != ProjectionStatus.DEAD and not orphaned:
            what = (
                "the projector is trying it" if record.status == ProjectionStatus.PENDING else "nothing to do"
            )
            print(f"crashsafe: projection {key} is {record.status}, not dead: {what}", file=sys.stderr)
            return 1
        task = await replan_projection(broker, ns, registry, record.run_id, key, now)
        if task is None:
            print(
                f"crashsafe: run {record.run_id}'s journal no longer calls for {key} (released or refunded?):"
                " nothing sent",
                file=sys.stderr,
            )
            return 1
        # Pending first (compare-and-set on the dead receipt: a second operator's retry loses here), then the
        # task: a projector that finds the receipt dead would not try it.
        await broker.kv_write(
            spec,
            ns.projection_record_key(record.tool, key),
            record_encoder.encode(retried_record(record, now)),
            revision=entry.revision,
        )
        await broker.publish(
            ns.projection(task.tool, task.run_id),
            task_encoder.encode(task),
            msg_id=f"{key}:retry:{now.timestamp():.6f}",
        )
    finally:
        await broker.close()
    print(f"projection {key} of run {record.run_id}: pending again, sent to the {task.tool} worker")
    return 0
