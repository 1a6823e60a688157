"""The reconciler's pure core: a projection of open work over all runs' events, and what is overdue in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    JournalEvent,
    RunCompleted,
    RunHandedOff,
    RunStarted,
)
from crashsafe.contracts.support import SupportTicket, ticket_for
from crashsafe.contracts.tool_messages import OutcomeStatus


@dataclass
class OpenRun:
    last_at: datetime
    pending: dict[int, ActionRequested] = field(default_factory=dict)
    # The approval the run waits for: it is not stuck (it holds no worker on purpose), however quiet it is.
    awaiting: ApprovalRequested | None = None


@dataclass(slots=True)
class Look:
    """One accepted run's reading by the reconciler (`journal_looks`): how far its journal has been read, and when
    it is read next."""

    accepted_at: datetime
    next_at: datetime
    seen_seq: int = 0
    empty: int = 0  # looks that found nothing journaled yet
    forget_s: float = 0.0  # a run not started this long after acceptance is let go
    # A message sent as a turn of `turn_of`: its guest event id, and how far that run's journal was read for it.
    turn_of: str = ""
    event_id: str = ""
    owner_seq: int = 0


@dataclass
class OpenWork:
    """Non-terminal runs and their actions with no completion; folded from the RUNS stream."""

    runs: dict[str, OpenRun] = field(default_factory=dict)
    # Actions whose journaled outcome is unknown, in any run, ended or not, and actions still pending when their
    # run handed off (a deadline): asked about by key until they settle.
    # Both by (run, key): a business key is asked by many runs, and each run's unknown is that run's to settle.
    unknown: dict[tuple[str, str], ActionRequested] = field(default_factory=dict)
    requests: dict[tuple[str, str], ActionRequested] = field(default_factory=dict)
    times_asked: dict[str, int] = field(default_factory=dict)
    # When each key was last sent for resolution, so a slow provider is asked again only after a pause.
    asked: dict[str, datetime] = field(default_factory=dict)
    woken: dict[str, datetime] = field(default_factory=dict)
    # Handed-off runs whose support ticket the reconciler makes sure of (the runtime publishes it first; if that
    # failed, or the runtime died after the hand-off was journaled, this publishes it).
    tickets: dict[str, SupportTicket] = field(default_factory=dict)
    # Who each open run is for (tenant, agent, guest, session), as its ticket names them.
    parties: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)
    # The accepted runs whose journals are read when something may be due, rather than followed event by event.
    looks: dict[str, Look] = field(default_factory=dict)
    # Runs whose end was followed before their inbound message (a restarted reconciler replays both at once), by
    # when: that message is then not read for. Kept an hour at most (`journal_looks.forget_ended`).
    ended_first: dict[str, datetime] = field(default_factory=dict)


def observe(work: OpenWork, event: JournalEvent) -> None:
    """Fold one journal event into the projection (mutates: this is the reconciler's private read model).

    An event type this version does not know (`UnknownEvent`) only shows the run is alive."""
    match event:
        case RunStarted():
            work.runs[event.run_id] = OpenRun(last_at=event.at)
            work.parties[event.run_id] = (event.tenant, event.agent, event.guest_id, event.session_id)
        case RunHandedOff():
            run = work.runs.pop(event.run_id, None)
            parties = work.parties.pop(event.run_id, None)
            if parties is not None:
                tenant, agent, guest_id, session_id = parties
                work.tickets[event.run_id] = ticket_for(
                    event, tenant=tenant, agent=agent, guest_id=guest_id, session_id=session_id
                )
            if run is not None:
                # Handed off with actions in flight (past its deadline): nobody else will ask about them, so
                # they are watched like unknown outcomes until a receipt settles them.
                for request in run.pending.values():
                    work.unknown[(request.run_id, request.key)] = request
            work.woken.pop(event.run_id, None)
        case RunCompleted():
            run = work.runs.pop(event.run_id, None)
            work.parties.pop(event.run_id, None)
            if run is not None:
                for request in run.pending.values():
                    work.asked.pop(request.key, None)
                    work.requests.pop((request.run_id, request.key), None)
            work.woken.pop(event.run_id, None)
        case ActionCompleted() if (
            event.run_id,
            event.key,
        ) in work.unknown or event.status == OutcomeStatus.UNKNOWN:
            # Unknown outcomes outlive their run: a handed-off run still needs the truth, found by key.
            if event.status == OutcomeStatus.UNKNOWN:
                intent = work.requests.get((event.run_id, event.key))
                if intent is not None:
                    work.unknown[(event.run_id, event.key)] = intent
            else:
                work.unknown.pop((event.run_id, event.key), None)
                work.times_asked.pop(event.key, None)
                work.asked.pop(event.key, None)
                work.requests.pop((event.run_id, event.key), None)
            run = work.runs.get(event.run_id)
            if run is not None:
                run.last_at = max(run.last_at, event.at)
                run.pending.pop(event.step_no, None)
        case _:
            run = work.runs.get(event.run_id)
            if run is None:
                return  # started before our look-back window; nothing to watch
            run.last_at = max(run.last_at, event.at)
            if isinstance(event, ApprovalRequested):
                run.awaiting = event
            elif (
                isinstance(event, ApprovalDecided)
                and run.awaiting is not None
                and run.awaiting.approval_id == event.approval_id
            ):
                run.awaiting = None
            if isinstance(event, ActionRequested):
                run.pending[event.step_no] = event
                work.requests[(event.run_id, event.key)] = event
            elif isinstance(event, ActionCompleted):
                done = run.pending.pop(event.step_no, None)
                work.requests.pop((event.run_id, event.key), None)
                if done is not None:
                    work.asked.pop(done.key, None)
                    work.times_asked.pop(done.key, None)


def ask_pause_s(work: OpenWork, key: str, reask_s: float, max_gap_s: float = 300.0) -> float:
    """How long after its last ask a key is asked about again: reask, 2x, 4x … up to `max_gap_s` (5 minutes)."""
    return min(reask_s * 2.0 ** work.times_asked.get(key, 0), max_gap_s)


def overdue_actions(work: OpenWork, now: datetime, grace_s: float, reask_s: float) -> list[ActionRequested]:
    """Actions past their timeout (plus grace) with no completion, not asked about in the last `reask_s`."""
    due: list[ActionRequested] = []
    for run in work.runs.values():
        for request in run.pending.values():
            if now < request.deadline_at + timedelta(seconds=grace_s):
                continue
            asked = work.asked.get(request.key)
            # A slow provider is asked again with a growing pause, not every few seconds forever.
            gap = ask_pause_s(work, request.key, reask_s)
            if asked is not None and now - asked < timedelta(seconds=gap):
                continue
            due.append(request)
    return due


def unsettled_unknowns(
    work: OpenWork, now: datetime, reask_s: float, max_gap_s: float = 300.0
) -> list[ActionRequested]:
    """Unknown outcomes to ask about again, each with a growing pause (reask, 2x, 4x … up to 5 minutes)."""
    due: list[ActionRequested] = []
    for (_, key), request in work.unknown.items():
        asked = work.asked.get(key)
        gap = ask_pause_s(work, key, reask_s, max_gap_s)
        if asked is None or now - asked >= timedelta(seconds=gap):
            due.append(request)
    return due


def stalled_runs(work: OpenWork, now: datetime, quiet_s: float) -> list[str]:
    """Runs with nothing in flight whose journal has not moved for `quiet_s`: their worker likely died."""
    out: list[str] = []
    for run_id, run in work.runs.items():
        if run.pending or run.awaiting is not None or now - run.last_at < timedelta(seconds=quiet_s):
            continue
        woken = work.woken.get(run_id)
        if woken is not None and now - woken < timedelta(seconds=quiet_s):
            continue
        out.append(run_id)
    return out


def due_tickets(work: OpenWork, now: datetime, grace_s: float) -> list[SupportTicket]:
    """Tickets of runs handed off at least `grace_s` ago (the runtime's own publish comes first), to make sure of."""
    return [t for t in work.tickets.values() if now - t.at >= timedelta(seconds=grace_s)]


def awaiting_runs(work: OpenWork) -> list[ApprovalRequested]:
    """The approval each waiting run waits for (the backstop asks its record)."""
    return [run.awaiting for run in work.runs.values() if run.awaiting is not None]


def approval_wake_due(
    work: OpenWork,
    waiting: ApprovalRequested,
    record_status: str,
    expires_at: datetime,
    now: datetime,
    gap_s: float,
) -> bool:
    """Wake a waiting run whose record is decided (a gateway died between its compare-and-set and its wake) or
    pending past its expiry (the durable timer did not fire): not more often than every `gap_s`."""
    due = record_status != "pending" or now >= expires_at
    woken = work.woken.get(waiting.run_id)
    return due and (woken is None or now - woken >= timedelta(seconds=gap_s))
