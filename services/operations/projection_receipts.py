"""Projection receipts as an operator reads them (`crashsafe projections list`, a run's page in the console), and
a dead projection sent again once its receiver is fixed (`crashsafe projections retry`): re-planned from the
run's journal (replan.py), so it carries what the run decided by now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import msgspec

from crashsafe.contracts.projections import (
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
    record_decoder,
    task_encoder,
)
from crashsafe.contracts.run_events import JournalEvent
from crashsafe.contracts.streams import projections_spec
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.fold import replay
from crashsafe.domain.missing_projections import STALE_S, Verdict, retried_record, verdict
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.record_ttls import kept_ttl
from crashsafe.domain.registry import Registry
from crashsafe.services.operations.replan import replan_projection
from crashsafe.services.platform.jetstream import Broker, KvEntry

record_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Receipts:
    """Every receipt this version can read, oldest change first, and how many it could not (a newer writer's)."""

    records: list[ProjectionRecord]
    unreadable: int


async def all_receipts(broker: Broker, ns: Namespace) -> Receipts:
    records: list[ProjectionRecord] = []
    unreadable = 0
    for entry in await broker.kv_scan(projections_spec(ns), "projection.>"):
        try:
            records.append(record_decoder.decode(entry.value))
        except msgspec.DecodeError:
            unreadable += 1
    return Receipts(sorted(records, key=lambda r: r.updated_at), unreadable)


@dataclass(frozen=True, slots=True)
class Projection:
    """One projection a run's journal calls for, and its receipt."""

    tool: str
    key: str
    record: ProjectionRecord | None  # None: planned, no receipt yet


async def projections_of_run(
    broker: Broker, ns: Namespace, registry: Registry, events: list[JournalEvent], now: datetime
) -> tuple[list[Projection], bool]:
    """The projections the run's journal calls for (planned as the projector plans them) and their receipts;
    and whether it is settled (ended, every receipt delivered or dead), so a page stops asking."""
    try:
        state = replay(events)
    except ValueError:
        return [], True
    agent = registry.agents.get(state.agent) if state is not None else None
    if state is None or agent is None or not state.terminal:
        return [], state is not None and agent is None
    spec = projections_spec(ns)
    out: list[Projection] = []
    for task in plan(state, state.events, agent, registry.tools, now):
        stored = await broker.kv_get(spec, ns.projection_record_key(task.tool, task.key))
        record = None
        if stored is not None:
            try:
                record = record_decoder.decode(stored.value)
            except msgspec.DecodeError:
                record = None
        out.append(Projection(tool=task.tool, key=task.key, record=record))
    settled = all(p.record is not None and p.record.status != ProjectionStatus.PENDING for p in out)
    return out, settled


# A retry's outcome: sent again, or why not (each says what the operator reads).


@dataclass(frozen=True, slots=True)
class Retried:
    record: ProjectionRecord
    task: ProjectionTask


@dataclass(frozen=True, slots=True)
class NoProjection:
    key: str


@dataclass(frozen=True, slots=True)
class NotDead:
    """Delivered (nothing to do), or pending and being tried by the projector."""

    record: ProjectionRecord


@dataclass(frozen=True, slots=True)
class NoLongerCalledFor:
    """The run's journal no longer plans it (released or refunded since): nothing sent."""

    record: ProjectionRecord


Retry = Retried | NoProjection | NotDead | NoLongerCalledFor


async def retry_projection(
    broker: Broker, ns: Namespace, registry: Registry, key: str, now: datetime, time_scale: float = 1.0
) -> Retry:
    """A dead projection sent again: its receipt back to pending, its task re-planned and published. A pending one
    is the projector's (it is being tried) unless its next attempt is long past, a delivered one is done: both
    are refused. `time_scale`: the deployment's projection_time_scale (how long "long past" is)."""
    spec = projections_spec(ns)
    found: tuple[KvEntry, ProjectionRecord] | None = None
    for tool in registry.projections:
        entry = await broker.kv_get(spec, ns.projection_record_key(tool, key))
        if entry is not None:
            found = (entry, record_decoder.decode(entry.value))
            break
    if found is None:
        return NoProjection(key)
    entry, record = found
    # A pending receipt whose next attempt is long past has nobody trying it (a retry that died before its
    # publish; a run the reconciler no longer tracks): the operator's retry is its way back.
    orphaned = (
        record.status == ProjectionStatus.PENDING
        and verdict(record, now, STALE_S * time_scale) is Verdict.STALE
    )
    if record.status != ProjectionStatus.DEAD and not orphaned:
        return NotDead(record)
    task = await replan_projection(broker, ns, registry, record.run_id, key, now)
    if task is None:
        return NoLongerCalledFor(record)
    # Pending first (compare-and-set on the dead receipt: a second operator's retry loses here), then the task:
    # a projector that finds the receipt dead would not try it.
    await broker.kv_write(
        spec,
        ns.projection_record_key(record.tool, key),
        record_encoder.encode(retried_record(record, now)),
        revision=entry.revision,
        ttl_s=kept_ttl(broker.retention.receipts_s),
    )
    await broker.publish(
        ns.projection(task.tool, task.run_id),
        task_encoder.encode(task),
        msg_id=f"{key}:retry:{now.timestamp():.6f}",
    )
    return Retried(record, task)
