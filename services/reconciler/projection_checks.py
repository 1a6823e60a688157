"""The reconciler's net under the projector (seed 002): ended runs whose planned projections never arrived are
published again. A run's plan on record and its receipts settle most runs without reading their journal; a
journal is read only for a run with a task to put back, or no current plan, at a bounded rate."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.projections import (
    ProjectionRecord,
    ProjectionTask,
    plan_decoder,
    record_decoder,
    task_encoder,
)
from crashsafe.contracts.run_events import JournalEvent, RunCompleted, RunHandedOff
from crashsafe.contracts.streams import PLANNER_HISTORY_S, projections_spec
from crashsafe.domain import missing_projections as missing
from crashsafe.domain.registry import Registry
from crashsafe.services.platform import metrics
from crashsafe.services.platform.hook_limit import HookLimit, HookOverran
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.run_journal import RunJournal


class ProjectionChecks:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        logger: logging.Logger,
        registry: Registry | None,
        journal: RunJournal,
    ) -> None:
        self.broker = broker
        self.ns = settings.namespace
        self.logger = logger
        self.registry = registry
        # The agents' `projections` hooks run under the process's time limit (set by the composition root).
        self.hook_limit = HookLimit(0.0)
        self.journal = journal
        self.receipts = projections_spec(self.ns)
        self.ended = missing.EndedRuns()
        scale = settings.projection_time_scale
        # An ended run is checked once the projector has had time to plan and deliver it (a minute), a pending
        # receipt is stale once its next attempt is ten minutes past (the projector's ack wait is 30 s, its
        # longest pause 5 minutes); an open run is checked again after 1, 2, 4 … 30 minutes.
        self.grace_s = 60.0 * scale
        self.stale_s = missing.STALE_S * scale
        self.recheck_s = 60.0 * scale
        self.max_gap_s = 1800.0 * scale
        # Bounded work per tick: runs checked by their plan and receipts (a few KV reads each), journals read (a
        # cold read of a run ended a minute ago is the server's dearest, ~2 ms), tasks published.
        self.checks_per_tick = 500
        self.reads_per_tick = 20
        self.publishes_per_tick = 50
        counted = ("checked", "by_plan", "republished", "missing", "stale", "settled_runs", "failed_checks")
        self.counts: dict[str, int] = dict.fromkeys(counted, 0)
        self._logged_counts: dict[str, int] = {}
        self._let_go_counted = 0
        self._logged = datetime.min.replace(tzinfo=UTC)

    def observe(self, event: JournalEvent, now: datetime, after_end: bool = False, seq: int = 0) -> None:
        """A milestone (`seq`: its stream sequence): a run's end starts its grace, and so does an event appended
        after it (`after_end`: a late receipt after a hand-off, which the projector plans again from), whether or
        not the run was settled and forgotten since, from now at the earliest (the projector plans it first); a
        later event of a tracked run restarts it."""
        oldest = now - timedelta(seconds=PLANNER_HISTORY_S)
        if isinstance(event, RunCompleted | RunHandedOff):
            missing.ended(self.ended, event.run_id, event.at, self.grace_s, oldest=oldest, seq=seq)
        elif after_end and event.at >= oldest:
            missing.ended(self.ended, event.run_id, max(event.at, now), self.grace_s, seq=seq)
        else:
            missing.moved(self.ended, event.run_id, event.at, self.grace_s, seq)

    async def tick(self, now: datetime) -> None:
        """Ended runs past their grace: judged by their plan and receipts, or their journal; the lost tasks
        published again (bounded per tick), a run forgotten once every projection is delivered or dead."""
        if self.registry is None or not self.registry.projections:
            return
        budget, reads = self.publishes_per_tick, self.reads_per_tick
        for run_id in missing.due_runs(self.ended, now, self.checks_per_tick):
            run = self.ended.runs.get(run_id)
            if run is None:
                continue  # let go at the bound while an earlier check awaited (a milestone came in meanwhile)
            try:
                if not run.needs_read and await self._by_plan(run_id, now):
                    continue
                if reads <= 0 or budget <= 0:
                    continue  # due still: read on a later tick; runs behind it may yet be settled by their plan
                reads -= 1
                budget -= await self._by_journal(run_id, now, budget)
            except CrashsafeError as exc:
                # NATS away, a bucket not yet provisioned: the run is checked again later, never dropped.
                self.counts["failed_checks"] += 1
                metrics.PROJECTION_CHECKS.labels("failed").inc()
                missing.checked(
                    self.ended, run_id, {missing.Verdict.MISSING: 1}, 0, now, self.recheck_s, self.max_gap_s
                )
                log(self.logger, logging.WARNING, "projection check failed", run_id=run_id, error=exc.message)
        metrics.PROJECTION_CHECKS_WAITING.set(len(self.ended.runs))
        if self.ended.let_go > self._let_go_counted:
            metrics.PROJECTION_CHECKS.labels("let_go").inc(self.ended.let_go - self._let_go_counted)
            self._let_go_counted = self.ended.let_go
        if now - self._logged >= timedelta(seconds=60) and self.counts != self._logged_counts:
            # The counters once a minute when they moved: what was checked, put back, found stale, given up on.
            self._logged, self._logged_counts = now, dict(self.counts)
            log(
                self.logger,
                logging.INFO,
                "projection reconciliation",
                tracked=len(self.ended.runs),
                let_go=self.ended.let_go,
                **self.counts,
            )

    async def _by_plan(self, run_id: str, now: datetime) -> bool:
        """The run judged by its plan on record and its receipts, if the plan is current and nothing needs
        publishing again; False: its journal must be read (and is, before its plan is read again). A plan or a
        receipt no rule expected (a hostile or buggy writer) is logged, and the journal decides."""
        try:
            settled = await self._settled_by_plan(run_id, now)
        except CrashsafeError:
            raise
        except Exception as exc:  # noqa: BLE001 -- never a net that stops on a record it cannot judge
            log(self.logger, logging.ERROR, "projection plan unusable", run_id=run_id, error=repr(exc))
            settled = False
        run = self.ended.runs.get(run_id)
        if not settled and run is not None:
            run.needs_read = True
        return settled

    async def _settled_by_plan(self, run_id: str, now: datetime) -> bool:
        run = self.ended.runs.get(run_id)
        entry = await self.broker.kv_get(self.receipts, self.ns.projection_plan_key(run_id))
        if run is None or entry is None or not entry.value:
            return False
        try:
            plan = plan_decoder.decode(entry.value)
        except msgspec.DecodeError:
            return False  # a newer writer's plan, or a corrupt one: the journal says what the run calls for
        if not missing.plan_current(plan, run_id, run):
            return False
        records = await self._receipts(run_id, [(t.tool, t.key) for t in plan.tasks])
        if records is None:
            return False
        counts = missing.judged_plan(plan, records, now, self.stale_s, run.sent)
        if counts is None:
            return False
        self._checked(run_id, counts, 0, now)
        self.counts["by_plan"] += 1
        metrics.PROJECTION_CHECKS.labels("plan").inc()
        return True

    async def _receipts(
        self, run_id: str, tasks: list[tuple[str, str]]
    ) -> dict[tuple[str, str], ProjectionRecord | None] | None:
        """The receipts of (tool, key) tasks, read together; None if one is unreadable (a newer writer's)."""
        # One batched read of the bucket for all of them: a round trip, not one a task.
        names = {(tool, key): self.ns.projection_record_key(tool, key) for tool, key in tasks}
        found = await self.broker.kv_get_many(self.receipts, list(names.values()))
        entries = [found[names[task]] for task in tasks]
        records: dict[tuple[str, str], ProjectionRecord | None] = {}
        for (tool, key), entry in zip(tasks, entries, strict=True):
            try:
                records[tool, key] = record_decoder.decode(entry.value) if entry is not None else None
            except msgspec.DecodeError:
                log(self.logger, logging.WARNING, "projection receipt unreadable", run_id=run_id, key=key)
                return None
        return records

    async def _by_journal(self, run_id: str, now: datetime, budget: int) -> int:
        """One ended run planned again from its journal: its lost projections published again (at most
        `budget`); returns how many."""
        assert self.registry is not None
        events, _ = await self.journal.read(run_id)
        try:
            tasks = self.hook_limit.run(missing.planned, self.registry, events, now)
        except (Exception, HookOverran) as exc:  # noqa: BLE001 -- pure code over a journal anybody may have written into
            # A journal the planner cannot plan from (a hostile or corrupt event): named in the log and left
            # alone, never a reconciler that dies on every tick.
            self.counts["failed_checks"] += 1
            log(self.logger, logging.ERROR, "projection plan failed", run_id=run_id, error=repr(exc))
            missing.forget(self.ended, run_id)
            return 0
        if tasks is None:
            missing.forget(self.ended, run_id)
            return 0
        readable: list[ProjectionTask] = []
        records: dict[tuple[str, str], ProjectionRecord | None] = {}
        for task in tasks:
            # One at a time: a receipt this version cannot read is a newer writer's, left alone, never published
            # over; the others are still judged.
            found = await self._receipts(run_id, [(task.tool, task.key)])
            if found is not None:
                records.update(found)
                readable.append(task)
        run = self.ended.runs.get(run_id)
        if run is not None:
            run.needs_read = False  # read now: a plan may settle its next check
        sent = run.sent if run is not None else {}
        again, counts = missing.to_republish(readable, records, now, self.stale_s, sent)
        again = again[:budget]
        done = run.republished if run is not None else 0
        for n, task in enumerate(again, start=done + 1):
            await self.broker.publish(
                self.ns.projection(task.tool, run_id),
                task_encoder.encode(task),
                msg_id=missing.republish_id(task.key, n, now),
            )
        missing.mark_sent(self.ended, run_id, [t.key for t in again], now)
        self._checked(run_id, counts, len(again), now)
        metrics.PROJECTION_CHECKS.labels("journal").inc()
        self.counts["republished"] += len(again)
        self.counts["missing"] += counts[missing.Verdict.MISSING]
        self.counts["stale"] += counts[missing.Verdict.STALE]
        if again:
            log(
                self.logger,
                logging.INFO,
                "projections published again",
                run_id=run_id,
                keys=[t.key for t in again],
                tracked=len(self.ended.runs),
                let_go=self.ended.let_go,
                **self.counts,
            )
        return len(again)

    def _checked(
        self, run_id: str, counts: dict[missing.Verdict, int], republished: int, now: datetime
    ) -> None:
        missing.checked(self.ended, run_id, counts, republished, now, self.recheck_s, self.max_gap_s)
        self.counts["checked"] += 1
        if run_id not in self.ended.runs:
            self.counts["settled_runs"] += 1
