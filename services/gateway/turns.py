"""A run's caps at the door: how many guest messages one run may take as turns, and how many may wait unread.

A guest who keeps writing while their run waits (for a manager, for a payment) must not grow its journal without
bound, nor fill the runtime's hands with messages queued behind one session: past the caps a message is refused
with a typed error before anything is published, never answered 202 and then lost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from crashsafe.contracts.errors import RunInboxFull, TurnLimitReached
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain.fold import replay
from crashsafe.domain.run_state import RunState
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lane_records import SessionRecords

# What a refused message's Retry-After says: the run reads its inbox at its next step (an approval may take longer;
# the client is then refused again, cheaply).
INBOX_RETRY_AFTER_S = 5.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TurnCaps:
    """Per run: messages it may take as turns, and its messages accepted but not yet read; 0 for no cap."""

    per_run: int
    inbox: int


def unread(accepted: int, state: RunState | None) -> int:
    """Messages accepted as the run's turns that its model has not read: not journaled yet, or journaled and
    waiting in its inbox (a call is open, or an approval)."""
    if state is None:
        return accepted  # the run has not started yet: every turn accepted for it waits
    journaled = state.turns - 1
    return max(accepted - journaled, 0) + len(state.inbox)


def counted(
    lane: SessionLane, owner: str, caps: TurnCaps, state: RunState | None, session_id: str
) -> SessionLane | None:
    """The lane with one more turn of `owner`, or a typed refusal; None if `owner` no longer owns the session (the
    runtime decides the lane again when the message arrives)."""
    if lane.run_id != owner:
        return None
    if caps.per_run and lane.turns >= caps.per_run:
        raise TurnLimitReached(run_id=owner, session_id=session_id[:128], cap=caps.per_run)
    waiting = unread(lane.turns, state)
    if caps.inbox and waiting >= caps.inbox:
        raise RunInboxFull(
            run_id=owner,
            session_id=session_id[:128],
            waiting=waiting,
            cap=caps.inbox,
            retry_after_s=INBOX_RETRY_AFTER_S,
        )
    return msgspec.structs.replace(lane, turns=lane.turns + 1)


def given_back(lane: SessionLane, owner: str) -> SessionLane | None:
    """The lane with one turn of `owner` fewer (a message counted whose publish failed); None if `owner` no longer
    owns the session (its count went with it) or nothing is counted."""
    if lane.run_id != owner or lane.turns <= 0:
        return None
    return msgspec.structs.replace(lane, turns=lane.turns - 1)


async def take_turn(
    broker: Broker,
    ns: Namespace,
    sessions: SessionRecords,
    caps: TurnCaps,
    tenant: str,
    session_id: str,
    owner: str,
) -> bool:
    """Count a message as the next turn of the session's run `owner` (compare-and-set on the lane, so two gateway
    replicas never both take the last turn), or raise TurnLimitReached (409) / RunInboxFull (429). True if it was
    counted (no caps: nothing to count)."""
    if not caps.per_run and not caps.inbox:
        return False
    # The run's journal is bounded by the caps themselves; its fold is linear (core/chain.py).
    events, _ = await RunJournal(broker, ns).read(owner)
    state = replay(events)
    took = False

    def count(lane: SessionLane) -> SessionLane | None:
        nonlocal took  # the last round's answer is the one written (a compare-and-set may decide again)
        changed = counted(lane, owner, caps, state, session_id)
        took = changed is not None
        return changed

    await sessions.change(tenant, session_id, count)
    return took


async def published_turn(
    broker: Broker,
    ns: Namespace,
    sessions: SessionRecords,
    caps: TurnCaps,
    tenant: str,
    session_id: str,
    owner: str,
    publish: Callable[[], Awaitable[T]],
) -> T:
    """Count a message as a turn of `owner`, then publish it; a publish that raises gives its turn back, so a
    client retrying a message that never got through is counted once, not once per try (a retry of one that did
    get through finds it published and counts nothing). Counted first: a message past the caps is refused before
    anything is published."""
    took = await take_turn(broker, ns, sessions, caps, tenant, session_id, owner)
    try:
        return await publish()
    except Exception:
        if took:
            await sessions.change(tenant, session_id, lambda lane: given_back(lane, owner))
        raise
