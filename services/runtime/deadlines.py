"""Wakes at a run's deadline: a run this worker saw waiting on actions is woken when its deadline passes, so
`next_move` hands it off and leaves what is pending to the reconciler."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.run_events import Origin
from crashsafe.domain.run_state import RunState
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.run_asks import wake_run

DEADLINE_SLACK_S = 0.05  # wake just after the deadline, so `next_move` sees it passed


class Deadlines:
    def __init__(self, broker: Broker, settings: Settings, logger: logging.Logger) -> None:
        self.broker = broker
        self.settings = settings
        self.logger = logger
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._wakes: set[asyncio.Task[None]] = set()

    def arm(self, state: RunState) -> None:
        """Wake the run at its deadline if it is still waiting then. The wake goes through the outcomes stream, so
        any replica may handle it; if this worker dies first, the reconciler's wakes for overdue actions reach
        the same decision later."""
        if state.terminal or state.run_id in self._timers:
            return
        if all(p.origin == Origin.COMPENSATION for p in state.pending):
            return  # compensations are exempt from the deadline
        run_id = state.run_id
        delay = max((state.deadline_at - datetime.now(UTC)).total_seconds(), 0.0) + DEADLINE_SLACK_S

        def fire() -> None:
            self._timers.pop(run_id, None)
            task = asyncio.get_running_loop().create_task(self._wake(run_id))
            self._wakes.add(task)
            task.add_done_callback(self._wakes.discard)

        self._timers[run_id] = asyncio.get_running_loop().call_later(delay, fire)

    def disarm(self, run_id: str) -> None:
        """The run has ended: its wake is not needed. (Left armed, each ended run kept a timer, its closure and a
        wake to send until its deadline, 90 s by default, when the wake read its finished journal back in.)"""
        handle = self._timers.pop(run_id, None)
        if handle is not None:
            handle.cancel()

    @property
    def armed(self) -> int:
        return len(self._timers)

    def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    async def _wake(self, run_id: str) -> None:
        try:
            await wake_run(
                self.broker,
                self.settings,
                run_id,
                "deadline passed with actions pending",
                f"runtime:{self.settings.worker_id}",
            )
        except CrashsafeError as exc:  # the broker is down: the reconciler's wakes are the backstop
            log(self.logger, logging.WARNING, "deadline wake not sent", run_id=run_id, error=exc.message)
