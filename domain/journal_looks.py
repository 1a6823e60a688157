"""When the reconciler reads a run's journal: only once the run could be late, so a run that ends in time costs
it one message (its end), not every event it journals.

The reconciler follows each accepted run's inbound message and every journal milestone (ends, waits, late
receipts). A run it has accepted is read (from where it last read) when something may be due: its first look a
little after it was accepted, then when an action's deadline passes, when its journal would count as quiet, or
when a key is to be asked about again. The detectors (`open_work`) then judge only runs read up to now."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime, timedelta

from crashsafe.contracts.run_events import JournalEvent, TurnReceived
from crashsafe.domain.open_work import Look, OpenRun, OpenWork, ask_pause_s


@dataclass(frozen=True, slots=True)
class Cadence:
    """How the looks are spaced (seconds): the detectors' own thresholds, and how long a run may take to start."""

    grace_s: float  # an action is overdue this long past its deadline
    reask_s: float  # the first pause before a key is asked about again
    quiet_s: float  # a journal this quiet, with nothing in flight, is stalled
    # The first look, after acceptance: most runs have ended by then. Later, a pending action is found overdue up to
    # this late (deadline plus grace, at the earliest), a cost paid for reading nothing of a run that ends in time:
    # at 3 s, 2,000 runs in flight (a queue of 11 s) were each read once while running (+1.5 ms of nats-server a run).
    first_s: float = 15.0
    least_s: float = 1.0  # two looks at one run are at least this far apart
    # A run that has not started this long after acceptance is let go (its message was refused, or it was a turn
    # of another run). A turn's own id is let go once its session's run journaled it as a turn, however late:
    # the runtime may take it long after (a backlog), and then start it as its own run if the lane moved.
    forget_unstarted_s: float = 86_400.0


def accepted(
    work: OpenWork, run_id: str, at: datetime, cadence: Cadence, turn_of: str = "", event_id: str = ""
) -> None:
    """A run accepted at `at` (its inbound message): first read `cadence.first_s` later, unless it ends before.
    `turn_of`: the message was sent as a turn of that run, `event_id` its guest event id (as the turn is journaled)."""
    if run_id in work.looks or run_id in work.runs or work.ended_first.pop(run_id, None) is not None:
        return
    first = at + timedelta(seconds=cadence.first_s)
    work.looks[run_id] = Look(
        at, first, forget_s=cadence.forget_unstarted_s, turn_of=turn_of, event_id=event_id
    )


def due_looks(work: OpenWork, now: datetime, limit: int) -> list[str]:
    """The runs to read now, the longest overdue first, at most `limit` (the rest wait for the next tick)."""
    # The `limit` smallest, not the whole list sorted (a backlog of accepted runs is every run in flight).
    due = heapq.nsmallest(
        limit, ((look.next_at, run_id) for run_id, look in work.looks.items() if look.next_at <= now)
    )
    return [run_id for _, run_id in due]


def looked(
    work: OpenWork, run_id: str, last_seq: int, now: datetime, cadence: Cadence, taken: bool = False
) -> None:
    """The run's journal was read up to `last_seq` (its events observed): when to read it next, or never again
    (it ended: what it journals after its end is a milestone, followed live; it never started in time; or,
    `taken`, it is a turn its session's run journaled as one)."""
    look = work.looks.get(run_id)
    if look is None:
        return
    look.seen_seq = max(look.seen_seq, last_seq)
    run = work.runs.get(run_id)
    if run is None:
        if look.seen_seq or taken or now - look.accepted_at >= timedelta(seconds=look.forget_s):
            del work.looks[run_id]
            return
        look.empty += 1
        pause = min(cadence.first_s * 2**look.empty, 8 * cadence.quiet_s)
        look.next_at = now + timedelta(seconds=pause)
        return
    ceiling = now + timedelta(seconds=cadence.quiet_s)
    nearest = _next_due(work, run_id, run, cadence) or ceiling
    look.next_at = min(max(nearest, now + timedelta(seconds=cadence.least_s)), ceiling)


def turn_taken(look: Look, owner: list[tuple[int, JournalEvent]]) -> bool:
    """Whether the run a message was sent as a turn of journaled it as its turn, in `owner` (that run's journal
    past `look.owner_seq`, which moves on to where it was read)."""
    for seq, event in owner:
        look.owner_seq = max(look.owner_seq, seq)
        if isinstance(event, TurnReceived) and event.event_id == look.event_id:
            return True
    return False


def ended(work: OpenWork, run_id: str, now: datetime) -> None:
    """The run's end was followed: it is read no more, nor for its inbound message if that is followed after its
    end (a restart replays both: else every run ended in the look-back window would be read once, oldest first)."""
    if work.looks.pop(run_id, None) is None:
        work.ended_first[run_id] = now


def forget_ended(work: OpenWork, now: datetime, keep_s: float = 3600.0) -> None:
    """Ends followed over `keep_s` ago whose inbound message never came (a run read to its end first, or started
    before the look-back window) are forgotten; they are kept in the order they were followed."""
    oldest = now - timedelta(seconds=keep_s)
    while work.ended_first and next(iter(work.ended_first.values())) < oldest:
        del work.ended_first[next(iter(work.ended_first))]


def moved(work: OpenWork, run_id: str, now: datetime) -> None:
    """The run's journal moved past the last read and could not be read to it: read it at the next tick, and
    judge it only then."""
    look = work.looks.get(run_id)
    if look is not None:
        look.next_at = min(look.next_at, now)


def unreadable(work: OpenWork, run_id: str) -> None:
    """The run's journal does not decode: it is neither read nor judged any more (an operator's call)."""
    work.looks.pop(run_id, None)
    work.runs.pop(run_id, None)
    work.woken.pop(run_id, None)


def read_up_to_now(work: OpenWork, run_id: str, now: datetime) -> bool:
    """Whether what the reconciler knows of the run is as of now: no look of it is due and waiting for a read."""
    look = work.looks.get(run_id)
    return look is None or look.next_at > now


def _next_due(work: OpenWork, run_id: str, run: OpenRun, cadence: Cadence) -> datetime | None:
    """The earliest moment a detector could act on this run, as far as its journal has been read: an action's
    deadline (or its next ask), else, with nothing in flight and no approval awaited, its journal turning quiet.
    None: nothing is due (it is still read once every quiet period)."""
    times: list[datetime] = []
    if run.pending:
        for request in run.pending.values():
            due = request.deadline_at + timedelta(seconds=cadence.grace_s)
            asked = work.asked.get(request.key)
            if asked is not None:  # asked about already: again after the pause `overdue_actions` keeps
                gap = ask_pause_s(work, request.key, cadence.reask_s)
                due = max(due, asked + timedelta(seconds=gap))
            times.append(due)
    elif run.awaiting is None:
        woken = work.woken.get(run_id)
        quiet_from = max(run.last_at, woken) if woken is not None else run.last_at
        times.append(quiet_from + timedelta(seconds=cadence.quiet_s))
    return min(times) if times else None
