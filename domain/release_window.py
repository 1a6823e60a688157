"""Which releases are alive on a broker and what that allows: the verdicts of `crashsafe upgrade check|status` and
the guard of `crashsafe infra contract`, from the live processes' version heartbeats (the shells read them).

A process of a release before heartbeats (`FIRST_BEATING`) says nothing; the one trace it leaves is a pull request
waiting on a durable its service pulls (`Waiting`). Each process keeps at most one request waiting per durable
(services/platform/pull_feed.py), so requests beyond the heartbeats of that service are processes unheard of."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from crashsafe.contracts.heartbeats import BEAT_TTL_S, FIRST_BEATING, VersionBeat
from crashsafe.contracts.release import RUNS_BESIDE_SINCE, VERSION, version_key

# A heartbeat older than this is not counted, whatever the bucket still holds (the server removes it after
# `BEAT_TTL_S`; the margin is for the writer's clock against the reader's).
STALE_AFTER_S = 2 * BEAT_TTL_S


@dataclass(frozen=True, slots=True)
class Window:
    """A release and the oldest release it runs beside on one broker, forward and back."""

    current: str = VERSION
    since: str = RUNS_BESIDE_SINCE

    def __str__(self) -> str:
        return f"{self.since} … {self.current}"


@dataclass(frozen=True, slots=True)
class Waiting:
    """Pull requests waiting on a durable `service` pulls (`<stream>/<durable>`), as the server counted them."""

    service: str
    consumer: str
    requests: int


@dataclass(frozen=True, slots=True)
class Unheard:
    """Processes of `service` seen only by their pull requests (on `consumers`): a release before `FIRST_BEATING`."""

    service: str
    consumers: tuple[str, ...]
    count: int

    def __str__(self) -> str:
        many = f"{self.count} " if self.count > 1 else ""
        return (
            f"{many}{self.service} without a heartbeat (a release before {FIRST_BEATING}; seen pulling on"
            f" {', '.join(self.consumers)})"
        )


def parsed(version: str) -> tuple[int, ...] | None:
    """`version`'s order key, or None for a version that is not one (never taken as compatible)."""
    try:
        return version_key(version)
    except ValueError:
        return None


def live(beats: list[VersionBeat], now: datetime) -> list[VersionBeat]:
    """The beats renewed within `STALE_AFTER_S`, ordered by service and worker."""
    fresh = [b for b in beats if (now - b.beat_at).total_seconds() <= STALE_AFTER_S]
    return sorted(fresh, key=lambda b: (b.service, b.worker))


def described(beat: VersionBeat) -> str:
    return f"{beat.service} {beat.worker} {beat.version}"


def past_the_rollout(
    since: str, contracted: str | None, beats: Iterable[VersionBeat], until_then: str
) -> str | None:
    """Why a step that only a release from `since` on may take (a purge, an expiry) must wait (None: it may):
    until `crashsafe infra contract` has recorded `since` or later (`contracted`: past it nobody rolls back to an
    older release), and while any live process (`beats`) runs an older release, or one that cannot be read.
    `until_then` says what the wait protects, in the operator's words."""
    floor = parsed(since)
    if floor is None:
        return f"{since!r} is not a release"
    older = [described(b) for b in beats if (v := parsed(b.version)) is None or v < floor]
    if older:
        return f"processes of a release before {since} are alive: {', '.join(older)}"
    done = parsed(contracted) if contracted else None
    if done is None or done < floor:
        return (
            f"the namespace is contracted to {contracted or 'no release'}, not {since} or later: run `crashsafe"
            f" infra contract` {until_then}"
        )
    return None


def unheard(waiting: list[Waiting], beats: list[VersionBeat]) -> list[Unheard]:
    """Per service, the processes its pull requests show beyond its live heartbeats: a process keeps at most one
    request on each durable, so there are at least as many as the most requests on any one of them."""
    heard: dict[str, int] = defaultdict(int)
    for beat in beats:
        heard[beat.service] += 1
    seen: dict[str, list[Waiting]] = defaultdict(list)
    for w in waiting:
        seen[w.service].append(w)
    found = []
    for service, on in seen.items():
        extra = max(w.requests for w in on) - heard[service]
        if extra > 0:
            found.append(Unheard(service, tuple(w.consumer for w in on if w.requests), extra))
    return found


def runs_beside(beat: VersionBeat, window: Window) -> bool:
    """Whether `window.current` may run beside the process: its release is within the window, or newer and its
    own window reaches back to `window.current`."""
    if _within(beat.version, window):
        return True
    version, current, theirs = parsed(beat.version), parsed(window.current), parsed(beat.runs_beside_since)
    if version is None or current is None or theirs is None:
        return False
    return version > current and theirs <= current


@dataclass(frozen=True, slots=True)
class Check:
    """`upgrade check`: whether this release may roll out beside what runs now."""

    incompatible: list[VersionBeat]
    unheard: list[Unheard]
    unheard_compatible: bool  # the unheard-of processes' assumed release is within the window

    @property
    def ok(self) -> bool:
        return not self.incompatible and (self.unheard_compatible or not self.unheard)


def check(beats: list[VersionBeat], waiting: list[Waiting], window: Window, assumed: str | None) -> Check:
    """The verdict over the live beats; a process without one is taken to run `assumed` (the newest release
    before heartbeats; None: none is recorded, so it cannot be vouched for)."""
    quiet = unheard(waiting, beats)
    vouched = assumed is not None and _within(assumed, window)
    return Check([b for b in beats if not runs_beside(b, window)], quiet, vouched)


def _within(version: str, window: Window) -> bool:
    found, since, current = parsed(version), parsed(window.since), parsed(window.current)
    if found is None or since is None or current is None:
        return False
    return since <= found <= current


@dataclass(frozen=True, slots=True)
class Convergence:
    """`upgrade status`: the live processes by release, and the unheard-of ones."""

    versions: dict[str, list[VersionBeat]]
    unheard: list[Unheard]

    @property
    def converged_on(self) -> str | None:
        """The one release every live process runs; None while two are alive, or nothing is heard."""
        if len(self.versions) != 1 or self.unheard:
            return None
        return next(iter(self.versions))

    def mixed(self) -> str:
        """`0.1.0: runtime w1, …; 0.2.0: gateway w2`, oldest first, then the unheard-of."""
        ordered = sorted(self.versions, key=lambda v: parsed(v) or ())
        parts = [f"{v}: {', '.join(f'{b.service} {b.worker}' for b in self.versions[v])}" for v in ordered]
        return "; ".join([*parts, *(str(u) for u in self.unheard)])


def convergence(beats: list[VersionBeat], waiting: list[Waiting]) -> Convergence:
    versions: dict[str, list[VersionBeat]] = defaultdict(list)
    for beat in beats:
        versions[beat.version].append(beat)
    return Convergence(dict(versions), unheard(waiting, beats))


def contract_blockers(beats: list[VersionBeat], waiting: list[Waiting], current: str = VERSION) -> list[str]:
    """What keeps `current`'s contracting step from running: each live process of an older release (or of no
    release one can read), and each one seen pulling that no heartbeat accounts for (a release before them)."""
    floor = parsed(current)
    older = [described(b) for b in beats if floor is None or (v := parsed(b.version)) is None or v < floor]
    return [*older, *(str(u) for u in unheard(waiting, beats))]
