"""The runs a runtime worker holds in memory: each one's folded state, journal version and published requests, a
lock per run, bounded (the oldest are dropped; a dropped run is read from its journal again when it moves). Only
active runs stay: an ended one is let go once no handler holds its lock, and a lock lives only while a handler
holds it or waits on it (both once grew with every run the worker ever saw)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from crashsafe.contracts.active import StallMark
from crashsafe.contracts.journal_chain import START, ChainHead
from crashsafe.contracts.run_events import ActionRequested
from crashsafe.domain.run_state import RunState

MAX_CACHED_RUNS = 50_000


@dataclass
class HeldRun:
    """A run this worker holds in memory: its folded state, its journal version, the requests it published."""

    state: RunState
    seq: int
    published: set[str] = field(default_factory=set)  # `sent(request)` of each
    # Whether this worker has looked for the run's stall mark (a run it started itself has none), and the mark:
    # a run whose agent held some runtime's loop until its watchdog ended it is never driven by its agent again.
    stall_checked: bool = False
    stalled: StallMark | None = None
    # The run's hash chain as far as `seq` (contracts/journal_chain.py): what the next append links to.
    head: ChainHead = START


def sent(intent: ActionRequested) -> str:
    """What `HeldRun.published` remembers of a request: its step and key (a business key may repeat across steps)."""
    return f"{intent.step_no}:{intent.key}"


class HeldRuns:
    def __init__(self, limit: int = MAX_CACHED_RUNS) -> None:
        self._runs: OrderedDict[str, HeldRun] = OrderedDict()
        # run -> its lock, and how many handlers hold it or wait on it
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
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

    @asynccontextmanager
    async def lock(self, run_id: str) -> AsyncIterator[None]:
        """The run's lock, held for the block: one handler at a time moves a run in this worker (fair: in the order
        they asked). When the last handler leaves, the lock goes, and the run too if it has ended with nothing in
        flight: whatever read it in (a wake of a finished run, a late turn) does not keep it."""
        lock, users = self._locks.get(run_id, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[run_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[run_id]
            if users > 1:
                self._locks[run_id] = (lock, users - 1)
            else:
                del self._locks[run_id]
                run = self._runs.get(run_id)
                if run is not None and not run.state.pending:
                    # A run handed off with requests out stays: what it published is remembered, so a late
                    # receipt does not send them again (found by review).
                    self.settle(run)

    def remember(self, run: HeldRun) -> HeldRun:
        self._runs[run.state.run_id] = run
        self._runs.move_to_end(run.state.run_id)
        while len(self._runs) > self._limit:
            self._runs.popitem(last=False)
        return run

    def settle(self, run: HeldRun) -> None:
        """An ended run is let go."""
        if run.state.terminal:
            self._runs.pop(run.state.run_id, None)

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def locks(self) -> int:
        """Runs whose lock a handler holds or waits on now."""
        return len(self._locks)
