"""Offline fold of a run waiting for its manager while its guest sends N messages (issue 17): linear, or not.

`python bench/fold_turns.py [N ...]` (default 2000 16000) folds the recorded approval journal up to its hold,
then N × (`run.resumed`, `run.turn_received`), with the runtime's own `replay`; the best of three, no NATS."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

from crashsafe.contracts.run_events import (
    ApprovalRequested,
    JournalEvent,
    RunResumed,
    TurnReceived,
    decode_event,
)
from crashsafe.domain.fold import replay

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "approval_guest_approves.jsonl"


def held() -> list[JournalEvent]:
    """The recorded journal up to its `run.approval_requested` (the export's header line skipped)."""
    events: list[JournalEvent] = []
    for line in CORPUS.read_text().splitlines()[1:]:
        events.append(decode_event(line.encode()))
        if isinstance(events[-1], ApprovalRequested):
            return events
    raise SystemExit(f"{CORPUS} holds no approval request")


def flooded(base: list[JournalEvent], turns: int) -> list[JournalEvent]:
    out, at, run_id = list(base), base[-1].at, base[0].run_id
    for n in range(turns):
        when = at + timedelta(milliseconds=n)
        out.append(RunResumed(run_id=run_id, at=when, worker="w", next_step=5, reason="picked up"))
        out.append(TurnReceived(run_id=run_id, at=when, event_id=f"flood-{n:08d}", text="any news?"))
    return out


def main(argv: list[str]) -> None:
    base = held()
    for turns in [int(a) for a in argv] or [2000, 16000]:
        journal = flooded(base, turns)
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            replay(journal)
            best = min(best, time.perf_counter() - began)
        print(f"{turns} turns ({len(journal)} events): {best:.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
