"""Which ended runs' journals may leave the stream for the archive, pure: a run is archived only when no message can
still come for it (issue 31, months of runs). The archiver's shell reads the journal and the projection receipts,
and archives and purges what this allows.

A run is kept while it runs, while an action it asked for has no outcome (a late receipt may land: a hand-off at
a deadline leaves them), while an outcome is unknown (the reconciler asks by key until it settles), while an
approval it asked for is undecided and not a hot window past its expiry (its timer, or a manager, may still wake
it), while a projection the journal calls for has no settled receipt, and for a hot window after its journal last
moved (the reconciler re-reads 24 h of milestones on start, the planner 6 h; an operator reads recent runs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from crashsafe.contracts.archive import ARCHIVE_SINCE
from crashsafe.contracts.heartbeats import VersionBeat
from crashsafe.contracts.projections import ProjectionRecord, ProjectionTask
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.missing_projections import Verdict, verdict
from crashsafe.domain.release_window import past_the_rollout
from crashsafe.domain.run_state import RunState


class Kept(StrEnum):
    """Why a run's journal stays in the stream (a closed vocabulary: the archiver's metric counts these)."""

    RUNNING = "running"
    ACTION_PENDING = "action_pending"
    OUTCOME_UNKNOWN = "outcome_unknown"
    APPROVAL_OPEN = "approval_open"
    HOT = "hot"  # ended, settled, but its journal moved less than a hot window ago
    PROJECTIONS_OPEN = "projections_open"
    # A journal no fold reads (a hostile or newer writer's), or whose agent's `projections` hook raises on it:
    # never archived blind.
    UNREADABLE = "unreadable"


@dataclass(frozen=True, slots=True)
class Keep:
    reason: Kept
    # The earliest this verdict can change by time alone (None: only when the journal or a receipt moves).
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Due:
    """Ended and settled, past its hot window: archive it, once its projections are settled (`unsettled`)."""


def archive_verdict(state: RunState | None, last_at: datetime, now: datetime, window_s: float) -> Keep | Due:
    """The verdict on a run whose journal was last written at `last_at` (the stream's clock), a hot window of
    `window_s`. `state`: its journal folded (None: nothing a fold reads)."""
    if state is None:
        return Keep(Kept.UNREADABLE)
    if not state.terminal:
        return Keep(Kept.RUNNING)
    if state.pending:
        return Keep(Kept.ACTION_PENDING)
    if any(done.status == OutcomeStatus.UNKNOWN for _, done in state.completed):
        return Keep(Kept.OUTCOME_UNKNOWN)
    window = timedelta(seconds=window_s)
    decided = {d.approval_id for d in state.approvals}
    open_until = [r.expires_at + window for r in state.approval_requests if r.approval_id not in decided]
    if open_until and max(open_until) > now:
        return Keep(Kept.APPROVAL_OPEN, max(open_until))
    if last_at + window > now:
        return Keep(Kept.HOT, last_at + window)
    return Due()


def unsettled(
    tasks: Iterable[ProjectionTask],
    records: Mapping[tuple[str, str], ProjectionRecord | None],
    now: datetime,
    stale_s: float,
) -> list[str]:
    """The keys of the projections the journal calls for whose receipt is not settled (delivered, or dead: an
    operator's `projections retry` plans again from the archive): missing, pending or stale."""
    return [
        t.key for t in tasks if verdict(records.get((t.tool, t.key)), now, stale_s) is not Verdict.SETTLED
    ]


def archiving_blocked(
    contracted: str | None, beats: Iterable[VersionBeat], since: str = ARCHIVE_SINCE
) -> str | None:
    """Why no journal may be purged now (None: it may). A release before `since` reads only the stream: its
    gateway would take a purged run's event for a new run, its API answer 404. So, until `crashsafe infra contract`
    has recorded `since` or later (`contracted`: past it nobody rolls back to an older release), and while any
    live process (`beats`) runs an older release (or one that cannot be read), nothing is purged."""
    return past_the_rollout(
        since, contracted, beats, "once the rollout is over (until then a rollback must find every journal)"
    )
