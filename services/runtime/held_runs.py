"""The runs a runtime worker holds in memory: each one's folded state, journal version and published requests, a
lock per run, bounded (the oldest are dropped; a dropped run is read from its journal again when it moves)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from crashsafe.contracts.run_events import ActionRequested
from crashsafe.domain.run_state import RunState

MAX_CACHED_RUNS = 50_000


@dataclass
class HeldRun:
    """A run this worker holds in memory: its folded state, its journal version, the requests it published."""

    state: RunState
    seq: int
    published: set[str] = field(default_factory=set)  # `sent(request)` of each


def sent(intent: ActionRequested) -> str:
    """What `HeldRun.published` remembers of a request: its step and key (a business key may repeat across steps)."""
    return f"{intent.step_no}:{intent.key}"


class HeldRuns:
    def __init__(self, limit: int = MAX_CACHED_RUNS) -> None:
        self._runs: OrderedDict[str, HeldRun] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._limit = limit

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def get(self, run_id: str) -> HeldRun | None:
        return self._runs.get(run_id)

    def touch(self, run_id: str) -> HeldRun | None:
        """The held run, marked as the most recently used."""
        run = self._runs.get(run_id)
        if run is not None:
            self._runs.move_to_end(run_id)
        return run

    def lock(self, run_id: str) -> asyncio.Lock:
        """The run's lock: one handler at a time moves a run in this worker."""
        lock = self._locks.get(run_id)
        if lock is None:
            lock = self._locks[run_id] = asyncio.Lock()
        return lock

    def remember(self, run: HeldRun) -> HeldRun:
        self._runs[run.state.run_id] = run
        self._runs.move_to_end(run.state.run_id)
        while len(self._runs) > self._limit:
            old, _ = self._runs.popitem(last=False)
            self._locks.pop(old, None)
        return run

    def settle(self, run: HeldRun) -> None:
        """An ended run is let go (its lock too, unless a handler waits on it)."""
        if run.state.terminal:
            self._runs.pop(run.state.run_id, None)
            lock = self._locks.get(run.state.run_id)
            if lock is not None and not lock.locked():
                self._locks.pop(run.state.run_id, None)
