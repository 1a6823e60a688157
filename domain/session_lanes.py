"""The session-lane rule, pure: whether a guest's message starts a run, joins the session's running one, waits for
it, takes the session over, or is refused; and every change a lane record goes through.

Exactly one run owns a session at a time. The gateway asks the rule before its 202 (knowing the owner's guest,
not its state); the runtime asks it again when the message arrives (knowing the owner's folded journal). The
stores only compare-and-set the changes below (services/platform/sessions.py)."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from crashsafe.contracts.errors import SessionOfAnotherGuest
from crashsafe.contracts.memory import SessionLane, SessionTurn
from crashsafe.domain.run_state import RunState

HISTORY = 5  # finished runs a session remembers


@dataclass(frozen=True, slots=True)
class Owner:
    """What the deciding side knows of the run that owns the lane. The gateway reads only its guest (`guest_id`);
    the runtime reads its journal (`read`: `state` is the fold of it, None if it has not started)."""

    guest_id: str | None = None  # None: not known yet
    state: RunState | None = None
    read: bool = False
    sent: bool = False  # the owner's own message is on its way (its run starts when the runtime takes it)


@dataclass(frozen=True, slots=True)
class Start:
    """The message's own run owns the session (or the message has no session lane): it starts its run."""


@dataclass(frozen=True, slots=True)
class Join:
    """The session's run is active: the message is its next turn."""

    owner: str


@dataclass(frozen=True, slots=True)
class Wait:
    """The session's run has not started but its own message is on its way: that run starts first, then this
    message joins it (so the turns keep their order)."""

    owner: str


@dataclass(frozen=True, slots=True)
class TakeOver:
    """The session is free, or its run has ended (`ended`, added to the history) or never started: the message's
    run takes the session over (compare-and-set against `owner`)."""

    owner: str
    ended: RunState | None = None


@dataclass(frozen=True, slots=True)
class Refuse:
    """The message may not join the session's run: another guest's message could answer its approval."""

    error: SessionOfAnotherGuest


LaneMove = Start | Join | Wait | TakeOver | Refuse


def lane_move(
    lane: SessionLane,
    *,
    run_id: str,
    guest_id: str,
    session_id: str,
    owner: Owner,
    tenant: str = "-",
    started: bool = False,
) -> LaneMove:
    """What the message of `guest_id` (its run `run_id`) becomes in the session whose lane record is `lane`.
    `tenant` "": a message with no tenant has no lane; `started`: its own run has a journal already (a
    redelivery), so it is that run's, whatever the lane says now."""
    if not tenant or started or lane.run_id == run_id:
        return Start()
    if not lane.run_id:
        return TakeOver(owner="")
    if owner.read and (owner.state is None or owner.state.terminal):
        # Ended, or never started: its gateway died between claiming the session and publishing its message.
        return Wait(lane.run_id) if owner.state is None and owner.sent else TakeOver(lane.run_id, owner.state)
    whose = owner.state.guest_id if owner.state is not None else owner.guest_id
    if whose is not None and whose != guest_id:
        return Refuse(SessionOfAnotherGuest(session_id=session_id[:128], run_id=lane.run_id))
    return Join(lane.run_id)


# The lane record's changes: each returns the record to write, or None to leave it as it is. -------------------


def claimed(lane: SessionLane, run_id: str, guest_id: str) -> SessionLane | None:
    """A free session claimed for `run_id` (of `guest_id`); an owned one left alone."""
    if lane.run_id:
        return None
    return msgspec.structs.replace(lane, run_id=run_id, guest_id=guest_id, turns=0)


def taken_over(
    lane: SessionLane, run_id: str, owner: str, ended: RunState | None, guest_id: str
) -> SessionLane | None:
    """`run_id` (a message of `guest_id`) made the owner if the session is free or still owned by `owner` (a run
    that has ended, with its turn `ended` added to the history, or one that never started)."""
    if lane.run_id not in ("", owner, run_id):
        return None  # someone else won the session meanwhile
    lane = with_turn(lane, finished_turn(ended)) if ended is not None else lane
    return msgspec.structs.replace(lane, run_id=run_id, guest_id=guest_id, turns=0)


def handed_back(lane: SessionLane, state: RunState) -> SessionLane | None:
    """The ended run's turn added to its session's history, and the session freed if the run still owns it."""
    if lane.run_id != state.run_id and lane.guest_id != state.guest_id:
        return None  # a run outside the lane (another guest's turn made its own run): not its history
    lane = with_turn(lane, finished_turn(state))
    if lane.run_id != state.run_id:
        return lane
    return msgspec.structs.replace(lane, run_id="", guest_id="", turns=0)


def given_back(lane: SessionLane, run_id: str) -> SessionLane | None:
    """A session claimed for a run that was then refused (the caps) freed again, if it is still that run's."""
    if lane.run_id != run_id:
        return None
    return msgspec.structs.replace(lane, run_id="", guest_id="", turns=0)


def with_turn(lane: SessionLane, turn: SessionTurn) -> SessionLane:
    """`turn` appended to the lane's history (once per run; the last HISTORY kept)."""
    if any(t.run_id == turn.run_id for t in lane.history):
        return lane
    return msgspec.structs.replace(lane, history=[*lane.history, turn][-HISTORY:])


def finished_turn(state: RunState) -> SessionTurn:
    """An ended run as the next run of its guest in its session is told about it."""
    return SessionTurn(
        run_id=state.run_id,
        text=state.started.text[:1000],
        reply=(state.final_reply or "")[:1000],
        guest_id=state.guest_id,
    )
