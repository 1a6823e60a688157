"""Which ended runs' projections never arrived, and which to publish again. Pure: the reconciler's shell reads the
journals and the projection receipts, and publishes what this decides.

Seed 002: the run's events are the outbox, so a projection can only be lost between the outbox and the receiver
(a task purged, a planner that died between its publishes, a worker whose claim vanished). A task is published
again when its key has no receipt at all, or a pending receipt whose next attempt is long past (nobody is
trying it); delivered and dead receipts are left alone (a dead one is an operator's call:
`crashsafe projections retry KEY`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

import msgspec

from crashsafe.contracts.projections import (
    AUDIT_TRAIL_TOOL,
    ProjectionPlan,
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
)
from crashsafe.contracts.run_events import JournalEvent
from crashsafe.domain.agent import Agent
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import RETIRED, plan
from crashsafe.domain.registry import Registry, Tool

# A pending receipt whose next attempt is this long past (times the projection clock's scale) has nobody trying
# it: the projector's ack wait is 30 s and its longest pause 5 minutes.
STALE_S = 600.0


class Verdict(StrEnum):
    """What one planned task's receipt says (a closed vocabulary: the reconciler's log counts these)."""

    MISSING = "missing"  # no receipt: the task never reached a worker, or was lost before its first attempt
    STALE = "stale"  # pending, its next attempt long past: nobody holds the task any more
    PENDING = "pending"  # pending and being tried: the projector's retry policy owns it
    SETTLED = "settled"  # delivered, or dead (an operator's call)


@dataclass
class EndedRun:
    """An ended run to check: when its journal last moved, when to check it next, how often it was republished."""

    last_at: datetime
    due_at: datetime
    checks: int = 0
    # The latest stream sequence of its journal this reconciler saw (a milestone's): a plan from before it is old.
    seen_seq: int = 0
    # Its plan on record did not settle it (none, older than its journal, or a task to put back): the next check
    # reads the journal, and no plan is read again until the journal moves or is read.
    needs_read: bool = False
    republished: int = 0
    # When this reconciler last published each key again: a task it put back is waited for like a pending one.
    sent: dict[str, datetime] = field(default_factory=dict)


# Ended runs tracked at once: past it the longest-tracked is let go (counted), so a benchmark's burst of runs
# costs the reconciler bounded memory; the projector's own retries still cover those runs.
MAX_TRACKED = 100_000


@dataclass
class EndedRuns:
    """Ended runs (completed or handed off) whose projections the reconciler has not yet seen settled."""

    runs: dict[str, EndedRun] = field(default_factory=dict)
    let_go: int = 0  # runs dropped unchecked at the MAX_TRACKED bound


def ended(
    work: EndedRuns,
    run_id: str,
    at: datetime,
    grace_s: float,
    max_tracked: int = MAX_TRACKED,
    oldest: datetime | None = None,
    seq: int = 0,
) -> None:
    """A run ended at `at` (or an ended run's journal moved again: the projector plans again, so the grace
    restarts). Checked once `grace_s` have passed since its last event. A run that ended before `oldest` is not
    taken on: what it projected, a step may have sent before the projector existed, under a key its receiver
    may have forgotten by the time this publishes it again."""
    due = at + timedelta(seconds=grace_s)
    known = work.runs.get(run_id)
    if known is None and oldest is not None and at < oldest:
        return
    if known is None:
        while len(work.runs) >= max_tracked:
            del work.runs[next(iter(work.runs))]  # the longest tracked (dicts keep insertion order)
            work.let_go += 1
        work.runs[run_id] = EndedRun(last_at=at, due_at=due, seen_seq=seq)
        return
    known.seen_seq = max(known.seen_seq, seq)
    known.needs_read = False
    if at > known.last_at:
        known.last_at = at
        known.due_at = max(known.due_at, due)


def moved(work: EndedRuns, run_id: str, at: datetime, grace_s: float, seq: int = 0) -> None:
    """An event of a run: only an ended run's is tracked here."""
    if run_id in work.runs:
        ended(work, run_id, at, grace_s, seq=seq)


def due_runs(work: EndedRuns, now: datetime, limit: int) -> list[str]:
    """At most `limit` ended runs due for a check, the longest-waiting first (bounded work per tick)."""
    # The `limit` smallest, not the whole list sorted: with runs tracked to the bound (100,000) a sort took 56 ms a
    # tick, this 7.
    due = heapq.nsmallest(limit, ((r.due_at, run_id) for run_id, r in work.runs.items() if r.due_at <= now))
    return [run_id for _, run_id in due]


def verdict(record: ProjectionRecord | None, now: datetime, stale_s: float) -> Verdict:
    if record is None:
        return Verdict.MISSING
    if record.status in (ProjectionStatus.DELIVERED, ProjectionStatus.DEAD):
        return Verdict.SETTLED
    # A pending receipt names its next attempt; without one, its last write is the worker's last sign of life.
    last_sign = record.next_attempt_at or record.updated_at
    if now - last_sign > timedelta(seconds=stale_s):
        return Verdict.STALE
    return Verdict.PENDING


def judged(
    record: ProjectionRecord | None, now: datetime, stale_s: float, last_sent: datetime | None = None
) -> Verdict:
    """One task's verdict. A task this reconciler published again less than `stale_s` ago (`last_sent`) and still
    without a receipt is waited for like a pending one, not sent again: a projector down for an hour does not
    find an hour of copies queued for it."""
    found = verdict(record, now, stale_s)
    if found is Verdict.MISSING and last_sent is not None and now - last_sent <= timedelta(seconds=stale_s):
        return Verdict.PENDING
    return found


def to_republish(
    tasks: Iterable[ProjectionTask],
    records: Mapping[tuple[str, str], ProjectionRecord | None],
    now: datetime,
    stale_s: float,
    sent: Mapping[str, datetime] | None = None,
) -> tuple[list[ProjectionTask], dict[Verdict, int]]:
    """The tasks to publish again (`records` by tool and key) and how many tasks got each verdict (`judged`).

    A stale task keeps the `planned_at` its receipt holds: its give-up clock runs from the first planning, so
    the reconciler can put a lost task back but never keep a failing one alive past its policy."""
    again: list[ProjectionTask] = []
    counts = dict.fromkeys(Verdict, 0)
    sent = sent or {}
    for task in tasks:
        record = records.get((task.tool, task.key))
        found = judged(record, now, stale_s, sent.get(task.key))
        counts[found] += 1
        if found is Verdict.MISSING:
            again.append(task)
        elif found is Verdict.STALE and record is not None:
            again.append(replace_planned(task, record.planned_at))
    return again, counts


def plan_current(plan: ProjectionPlan, run_id: str, run: EndedRun) -> bool:
    """Whether a recorded plan was made from the run's journal as this reconciler saw it last: no older than any
    milestone of the run it saw. Every event after a run's end is a milestone, and the planner plans from a read
    that reaches the event that asked for it, so a plan this old has every event seen here; one appended since
    and not seen yet makes the run one to check again when it is (`ended`). Sequences, not times: events are
    stamped by whichever runtime replica appended them, and plans may be written out of order."""
    return plan.run_id == run_id and run.seen_seq > 0 and plan.last_seq >= run.seen_seq


def judged_plan(
    plan: ProjectionPlan,
    records: Mapping[tuple[str, str], ProjectionRecord | None],
    now: datetime,
    stale_s: float,
    sent: Mapping[str, datetime] | None = None,
) -> dict[Verdict, int] | None:
    """How many of a current plan's tasks got each verdict, from their receipts alone (`records` by tool and
    key); None if any must be published again (missing or stale): only the journal holds the task to publish."""
    counts = dict.fromkeys(Verdict, 0)
    sent = sent or {}
    for task in plan.tasks:
        found = judged(records.get((task.tool, task.key)), now, stale_s, sent.get(task.key))
        if found in (Verdict.MISSING, Verdict.STALE):
            return None
        counts[found] += 1
    return counts


def replace_planned(task: ProjectionTask, planned_at: datetime) -> ProjectionTask:
    return msgspec.structs.replace(task, planned_at=planned_at)


def checked(
    work: EndedRuns,
    run_id: str,
    counts: Mapping[Verdict, int],
    republished: int,
    now: datetime,
    recheck_s: float,
    max_gap_s: float,
) -> None:
    """After a check: a run whose every projection is settled is forgotten; any other is checked again after a
    growing pause (recheck, 2x, 4x … up to `max_gap_s`): a receiver down for an hour is not polled every tick."""
    run = work.runs.get(run_id)
    if run is None:
        return
    open_tasks = sum(n for v, n in counts.items() if v is not Verdict.SETTLED)
    if open_tasks == 0:
        del work.runs[run_id]
        return
    run.checks += 1
    run.republished += republished
    gap = min(recheck_s * 2 ** (run.checks - 1), max_gap_s)
    run.due_at = now + timedelta(seconds=gap)


def mark_sent(work: EndedRuns, run_id: str, keys: Iterable[str], now: datetime) -> None:
    run = work.runs.get(run_id)
    if run is not None:
        run.sent.update(dict.fromkeys(keys, now))


def forget(work: EndedRuns, run_id: str) -> None:
    work.runs.pop(run_id, None)


def republish_id(key: str, n: int, now: datetime) -> str:
    """A fresh message id for the `n`th republish of a task: the planner's own id (the key) may still be in the
    stream's duplicate window after the task was purged, and would be dropped as a duplicate. The time makes it
    fresh across a restarted reconciler (whose counts start again)."""
    return f"{key}:r{n}:{now.timestamp():.6f}"


def audit_upto(key: str, run_id: str) -> int | None:
    """The event count an audit-trail key names (`audit:<run_id>:<upto>`), or None if it is not one."""
    prefix = f"audit:{run_id}:"
    if not key.startswith(prefix):
        return None
    tail = key.removeprefix(prefix)
    return int(tail) if tail.isdigit() and int(tail) > 0 else None


def replanned(tasks: Iterable[ProjectionTask], key: str, run_id: str, now: datetime) -> ProjectionTask | None:
    """The task an operator retries, planned again from the run's journal: the planned task of that key, or,
    for an audit-trail key planned at an earlier length of the journal (an approval's flush), that flush again.
    Planned now: a retry restarts the give-up clock (the operator fixed the receiver)."""
    tasks = list(tasks)
    for task in tasks:
        if task.key == key:
            return replace_planned(task, now)
    upto = audit_upto(key, run_id)
    trail = next((t for t in tasks if t.tool == AUDIT_TRAIL_TOOL), None)
    if upto is None or trail is None or upto > trail.upto:
        return None
    return msgspec.structs.replace(trail, key=key, upto=upto, planned_at=now)


def retried_record(record: ProjectionRecord, now: datetime) -> ProjectionRecord:
    """An operator's retry of a dead projection: pending again, tried now, its attempts kept for the record."""
    return msgspec.structs.replace(
        record,
        status=ProjectionStatus.PENDING,
        planned_at=now,
        updated_at=now,
        next_attempt_at=now,
        detail=f"retried by an operator after: {record.detail}"
        if record.detail
        else "retried by an operator",
    )


def projected_keys(
    journals: Mapping[str, Sequence[JournalEvent]],
    agents: Mapping[str, Agent],
    tools: Mapping[str, Tool],
    now: datetime,
) -> dict[str, str]:
    """Every projection key the ended runs' journals call for, with its run: a provider's email or CRM record
    under one of these keys has its intent in the journal (the run's events are the outbox), not in a step.

    A journal the planner cannot plan from is skipped here (the reconciler's log names it)."""
    keys: dict[str, str] = {}
    for run_id, events in journals.items():
        try:
            state = replay(events)
            agent = agents.get(state.agent) if state is not None else None
            if state is None or agent is None or not state.terminal:
                continue
            tasks = plan(state, state.events, agent, tools, now)
        except Exception:  # noqa: BLE001 -- pure code over journals anybody may have written into
            continue
        for task in tasks:
            keys.setdefault(task.key, run_id)
    return keys


def planned(registry: Registry, events: list[JournalEvent], now: datetime) -> list[ProjectionTask] | None:
    """The projections a run's journal calls for, as the projector plans them; None for a run not ended (nothing
    to check)."""
    state = replay(events)
    if state is None or not state.terminal:
        return None
    agent = registry.agents.get(state.agent)
    if agent is None:
        # An agent this deployment no longer runs: its runs still have an audit trail (as the projector plans).
        return plan(state, state.events, RETIRED, registry.tools, now)
    return plan(state, state.events, agent, registry.tools, now)
