"""The runtime's one append path: every event it journals goes through `RunAppends`, which appends with the
run's expected sequence, folds what it appended into the held run, and has the one conflict policy.

The conflict policy: a decision (`Decide`) is taken on the held run and writes its events through the `Write` it
is given. If an append meets `RunVersionConflict` (another replica moved the run), the run is read again from its
journal and the WHOLE decision is taken again on the fresh state (it may now decide something else, or nothing),
at most MAX_CONFLICT_RETRIES times; past that the conflict is raised (retry later: the message is nak'd and comes
again, never acked with its event unjournaled). Nothing is ever re-appended blind."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from opentelemetry.context import Context

from crashsafe.contracts.errors import RunVersionConflict
from crashsafe.contracts.headers import Header
from crashsafe.contracts.journal_chain import CHAIN_HEADER, START, in_namespace
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunStarted,
    TurnReceived,
    event_encoder,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.support import ticket_for
from crashsafe.domain import intake
from crashsafe.domain.fold import fold_run, replay
from crashsafe.domain.run_state import RunState
from crashsafe.services.platform import metrics
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.tracing import headers_for, trace_id_of
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.support_tickets import publish_ticket
from crashsafe.services.runtime.action_requests import ActionRequests, request_span
from crashsafe.services.runtime.held_runs import HeldRun, HeldRuns
from crashsafe.services.runtime.run_checkpoints import RunCheckpoints

MAX_CONFLICT_RETRIES = 20
# Metric children per agent (and hand-off reason), made once.
_RUNS_STARTED = metrics.Children(metrics.RUNS_STARTED)
_RUNS_COMPLETED = metrics.Children(metrics.RUNS_COMPLETED)
_RUNS_HANDED_OFF = metrics.Children(metrics.RUNS_HANDED_OFF)

T = TypeVar("T")
Write = Callable[[Sequence[RunEvent]], Awaitable[HeldRun]]
# A decision on the held run (None: a run not started yet), writing what it decides; taken again after a conflict.
Decide = Callable[[HeldRun | None, Write], Awaitable[T]]


def utcnow() -> datetime:
    return datetime.now(UTC)


def journal_headers(state: RunState, ctx: Context) -> dict[str, str]:
    """The trace context and, for an event appended after its run ended (a late receipt after a hand-off),
    `Crashsafe-Run-Ended`: the projector re-plans the run's projections from it, reading no journal to find out."""
    headers = headers_for(ctx)
    if state.terminal:
        headers[Header.RUN_ENDED] = "1"
    return headers


class RunAppends:
    """Reads runs into the worker's memory and appends to their journals; the runtime's only writer of a journal."""

    def __init__(
        self,
        journal: RunJournal,
        runs: HeldRuns,
        broker: Broker,
        ns: Namespace,
        worker: str,
        logger: logging.Logger,
        requests: ActionRequests | None = None,
        checkpoints: RunCheckpoints | None = None,
    ) -> None:
        self.journal = journal
        # Signs each run's head once a second (issue 34); None: a journal no checkpoint covers (tests).
        self.checkpoints = checkpoints
        # Signs an intent the journal carries to its executor (the journal as the bus); None: never on the bus.
        self.requests = requests
        self.runs = runs
        self.broker = broker
        self.ns = ns
        self.worker = worker
        self.logger = logger

    async def decided(self, run: HeldRun, decide: Decide[T], ctx: Context) -> tuple[HeldRun, T]:
        """Take `decide` on the held run and journal what it writes (see the conflict policy above); the run as
        it then is, and what the decision answered."""
        held, answer = await self._decided(run.state.run_id, run, decide, ctx)
        assert held is not None  # a run once held is never forgotten by its journal
        return held, answer

    async def start(self, started: RunStarted, ctx: Context) -> HeldRun:
        """Start a run by appending its first event at sequence 0 (optimistic: only a clash costs a read). A clash
        means the run exists already (a redelivery, or another replica): it is read and marked resumed instead."""

        async def begin(run: HeldRun | None, write: Write) -> None:
            if run is None:
                await write((started,))
            else:
                await self._resume(run, write)

        held, _ = await self._decided(started.run_id, None, begin, ctx)
        assert held is not None  # written, or read after a clash
        return held

    async def load(
        self,
        run_id: str,
        ctx: Context,
        fresh: bool = False,
        mark_resume: bool = True,
        what: str = "a message",
    ) -> HeldRun | None:
        """The held run, or read from its journal (`fresh`: always). A run read that was not held is marked
        resumed unless `mark_resume` is False; None: the run has no journal. RunArchived: it has none because it
        was archived (`what` brought it here), and it takes no more events."""
        if not fresh:
            held = self.runs.touch(run_id)
            if held is not None:
                return held
        events, seq, head = await self.journal.writable(run_id, what)
        state = replay(events)
        if state is None:
            return None
        run = self.runs.remember(HeldRun(state, seq, head=head))
        if mark_resume and not state.terminal:
            run = await self.mark_resumed(run, ctx)
        return run

    async def reload(self, run: HeldRun, ctx: Context) -> HeldRun:
        """The run read again from its journal (this worker's copy may be stale), keeping what it published."""
        fresh = await self._reload(run.state.run_id, run, ctx)
        assert fresh is not None
        return fresh

    async def peek(self, run_id: str, cached: bool = True) -> RunState | None:
        """The run's state for a look (never held for it): the held copy if active and `cached`, else its journal."""
        held = self.runs.get(run_id) if cached else None
        if held is not None and not held.state.terminal:
            return held.state
        events, _ = await self.journal.read(run_id)
        return replay(events)

    async def mark_resumed(self, run: HeldRun, ctx: Context) -> HeldRun:
        """Journal that this worker picked up an active run it did not hold."""

        async def resume(held: HeldRun | None, write: Write) -> None:
            assert held is not None
            await self._resume(held, write)

        run, _ = await self.decided(run, resume, ctx)
        return run

    async def _resume(self, run: HeldRun, write: Write) -> None:
        resumed = intake.resumed(run.state, utcnow(), self.worker)
        if resumed:
            await write(resumed)
            log(
                self.logger,
                logging.INFO,
                "run resumed",
                run_id=run.state.run_id,
                next_step=run.state.next_step,
            )

    async def _decided(
        self, run_id: str, run: HeldRun | None, decide: Decide[T], ctx: Context
    ) -> tuple[HeldRun | None, T]:
        held = run

        async def write(events: Sequence[RunEvent]) -> HeldRun:
            nonlocal held
            for event in events:
                held = await self._append(run_id, held, event, ctx)
            assert held is not None
            return held

        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                answer = await decide(held, write)
                return held, answer  # as the decision's writes left it
            except RunVersionConflict:
                held = await self._reload(run_id, held, ctx)
        # Lost the race every time: what it decided is not journaled, so its message must come again (nak).
        raise RunVersionConflict(subject=self.ns.run_events(run_id), expected_seq=held.seq if held else 0)

    async def _append(self, run_id: str, run: HeldRun | None, event: RunEvent, ctx: Context) -> HeldRun:
        """THE append: at the run's expected sequence, folded into the held run once the journal has it."""
        expected, head = (run.seq, run.head) if run is not None else (0, START)
        # Only a receipt says the run has ended: a late one after a hand-off re-plans the run's projections.
        headers = (
            journal_headers(run.state, ctx)
            if run is not None and isinstance(event, ActionCompleted)
            else headers_for(ctx)
        )
        ended = run is not None and run.state.terminal
        bussed = (
            self.requests.on_the_bus(event, run.state.agent)
            if isinstance(event, ActionRequested) and run is not None and self.requests is not None
            else None
        )
        # Its link in the run's hash chain (contracts/journal_chain.py): after the head of what the run holds.
        link = {CHAIN_HEADER: head.link().header()}
        if bussed is None:
            subject = self.journal.subject_for(event, ended)
            seq = await self.journal.append(
                event, expected, {**headers, **link}, after_end=ended, subject=subject
            )
        else:
            # The intent is the request its executor pulls (the journal as the bus): traced as one.
            event, subject = bussed
            with request_span(event, ctx) as requested:
                seq = await self.journal.append(
                    event, expected, {**headers_for(requested), **link}, subject=subject
                )
        # The hash is over the stored bytes, which are this encoding (msgspec's is deterministic).
        head = head.after(in_namespace(self.ns.name, subject), event_encoder.encode(event))
        if run is None:
            # Started here, at sequence 0: no process has driven it yet, so no stall mark can name it.
            run = self.runs.remember(HeldRun(fold_run(None, event), seq, stall_checked=True, head=head))
        else:
            run.state = fold_run(run.state, event)
            run.seq, run.head = seq, head
        if self.checkpoints is not None:
            self.checkpoints.note(run_id, head)
        await self._journaled(run, event, ctx)
        return run

    async def _journaled(self, run: HeldRun, event: RunEvent, ctx: Context) -> None:
        """What follows an event's append, once (a clash raises before it gets here): metrics, crash seams, and a
        handed-off run's ticket to the support queue (a failed publish never wedges the run: the reconciler
        republishes tickets it finds missing)."""
        match event:
            case RunStarted(agent=agent):
                _RUNS_STARTED(agent).inc()
                log(
                    self.logger,
                    logging.DEBUG,
                    "run started",
                    run_id=run.state.run_id,
                    trace_id=trace_id_of(ctx),
                )
            case TurnReceived():
                crash_point("runtime.after_turn_journaled")
            case ActionRequested():
                crash_point("runtime.after_action_journaled")
            case PolicyDenied(rule=rule):
                metrics.POLICY_DENIALS.labels(rule=rule).inc()
            case RunCompleted():
                _RUNS_COMPLETED(run.state.agent).inc()
            case RunHandedOff(reason=reason):
                _RUNS_HANDED_OFF(run.state.agent, str(reason)).inc()
                started = run.state.started
                ticket = ticket_for(
                    event,
                    tenant=started.tenant,
                    agent=started.agent,
                    guest_id=started.guest_id,
                    session_id=started.session_id,
                )
                await publish_ticket(self.broker, self.ns, ticket, self.logger)
            case _:
                pass

    async def _reload(self, run_id: str, run: HeldRun | None, ctx: Context) -> HeldRun | None:
        fresh = await self.load(run_id, ctx, fresh=True, mark_resume=False)
        if fresh is not None and run is not None:
            fresh.published |= run.published
            fresh.stall_checked, fresh.stalled = run.stall_checked, run.stalled
        return fresh
