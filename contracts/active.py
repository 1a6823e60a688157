"""Active runs per guest and per session: the record the gateway adds a run to and the runtime removes it from."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from crashsafe.contracts.run_events import Budget

# How long past a run's own deadline its entry still counts: the time compensations may take after a hand-off.
# Past it the entry no longer counts, so a run whose end was never recorded (a crash) cannot wedge a guest.
GRACE_S = 30.0


def entry_deadline(now: datetime, budget: Budget | None = None) -> datetime:
    """Until when a run admitted `now` counts as active if nobody records its end."""
    return now + timedelta(seconds=(budget or Budget()).deadline_s + GRACE_S)


class ActiveRuns(msgspec.Struct, frozen=True, kw_only=True):
    """The active runs of one guest (or one session): run id -> the deadline after which it no longer counts."""

    runs: dict[str, datetime] = {}

    def live(self, now: datetime) -> dict[str, datetime]:
        return {run_id: until for run_id, until in self.runs.items() if until > now}

    def with_run(self, run_id: str, until: datetime, now: datetime) -> ActiveRuns:
        """This record with the run added (an entry already there keeps its deadline) and dead entries dropped."""
        live = self.live(now)
        return ActiveRuns(runs={**live, run_id: live.get(run_id, until)})

    def without_run(self, run_id: str, now: datetime) -> ActiveRuns:
        return ActiveRuns(runs={r: until for r, until in self.live(now).items() if r != run_id})

    def retry_after_s(self, now: datetime) -> float:
        """When the first live entry stops counting, at the latest (its run usually ends well before)."""
        live = self.live(now)
        return max(min((until - now).total_seconds() for until in live.values()), 1.0) if live else 1.0


active_encoder = msgspec.json.Encoder()
active_decoder = msgspec.json.Decoder(ActiveRuns)


class StallMark(msgspec.Struct, frozen=True, kw_only=True):
    """The value of `stalled.<run_id>` in the `{ns}_active` bucket: a runtime's watchdog ended its process while
    the run's agent's code held the event loop (code a signal cannot stop). Whoever holds the run next hands it
    off with `agent_fault` (or, ended already, leaves it with the person) and never runs its agent's code again."""

    run_id: str
    worker: str
    stalled_s: float
    at: datetime
    where: str = ""  # the agent's line the loop was held at, as the watchdog saw it


stall_encoder = msgspec.json.Encoder()
stall_decoder = msgspec.json.Decoder(StallMark)
