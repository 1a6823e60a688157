"""The drive loop: advance a run, one decided move at a time, until it waits on an action, an approval or a
person, or ends. Each move is decided by `next_move` (pure) and journaled through the one append path before
anything it asks for is done."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import msgspec
from opentelemetry.context import Context

from crashsafe.contracts.active import StallMark
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import (
    AgentFault,
    CatalogRevisionGone,
    CrashsafeError,
    ModelUnavailable,
    PoisonMessage,
)
from crashsafe.contracts.run_events import ModelRejected, Passage
from crashsafe.contracts.spans import SpanAttr, SpanName
from crashsafe.domain import intake
from crashsafe.domain.agent import Agent
from crashsafe.domain.decide import (
    Append,
    AskModel,
    AwaitActions,
    AwaitApproval,
    DecideApproval,
    Idle,
    Move,
    agent_failed,
    next_move,
    policy_unavailable,
)
from crashsafe.domain.fold import passages_item
from crashsafe.domain.model_calls import ModelReply, ask_at_risk, model_asked
from crashsafe.domain.registry import Registry
from crashsafe.domain.retrieval import retrieval_query
from crashsafe.domain.run_state import RunState
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform import metrics
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.hook_limit import HookLimit, HookOverran, where_stopped
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import annotate, span
from crashsafe.services.records.active_runs import release_active
from crashsafe.services.records.run_catalog import RunCatalog
from crashsafe.services.runtime import stall_marks
from crashsafe.services.runtime.action_requests import ActionRequests
from crashsafe.services.runtime.append_path import RunAppends, Write
from crashsafe.services.runtime.deadlines import Deadlines
from crashsafe.services.runtime.held_actions import ApprovalDesk
from crashsafe.services.runtime.held_runs import HeldRun
from crashsafe.services.runtime.lanes import SessionLanes
from crashsafe.services.runtime.model import Model

_sizer = msgspec.json.Encoder()  # measures what a model call sends, for the budget's token estimate
_STEP_SECONDS = metrics.Children(metrics.STEP_SECONDS)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class _Rules:
    """What a run is driven under: its agent and its configuration at the pinned catalog revision (`gone`: the
    revision is gone, and the run is handed off under the agent's built-in configuration)."""

    agent: Agent
    config: AgentConfig
    gone: CatalogRevisionGone | None


class DriveLoop:
    def __init__(
        self,
        *,
        appends: RunAppends,
        requests: ActionRequests,
        deadlines: Deadlines,
        registry: Registry,
        catalog: RunCatalog,
        approvals: ApprovalDesk,
        lanes: SessionLanes,
        library: Library,
        model: Model,
        settings: Settings,
        logger: logging.Logger,
        hook_limit: HookLimit | None = None,
    ) -> None:
        self.appends = appends
        self.requests = requests
        self.deadlines = deadlines
        self.registry = registry
        self.catalog = catalog
        self.approvals = approvals
        self.lanes = lanes
        self.library = library
        self.model = model
        self.settings = settings
        self.logger = logger
        self.hook_limit = hook_limit or HookLimit(0.0)
        # The run whose agent's code is deciding right now (None between decisions): no await falls between
        # setting and clearing it, so a loop that stops turning inside it stopped in that run's agent.
        self.deciding: str | None = None
        self._loop_thread = threading.get_ident()
        # Runs a redelivered message came for: their stall mark is read again (another process may have left one).
        self._suspects: set[str] = set()

    def suspect(self, run_id: str) -> None:
        """A message for the run came again: before its agent decides, look for a stall mark once more."""
        self._suspects.add(run_id)

    def on_stall(self, stalled_s: float) -> None:
        """The watchdog's last call before it ends the process (its own thread): mark the run whose agent held the
        loop, so the next process hands it off instead of driving it into the same stall."""
        run_id = self.deciding
        if run_id is None:
            return  # stuck outside an agent's decision: nothing to blame on a run
        where = where_stopped(sys._current_frames().get(self._loop_thread))
        stall_marks.record_blocking(self.settings, run_id, stalled_s, where)

    async def drive(self, run: HeldRun, ctx: Context) -> None:
        """Advance the run until it waits on an action or ends. Every decision is journaled before it acts."""
        annotate(ctx, step_no=run.state.next_step, agent=run.state.agent)
        started = time.perf_counter()
        if not run.stall_checked or run.state.run_id in self._suspects:
            self._suspects.discard(run.state.run_id)
            run.stalled = await stall_marks.read(self.appends.broker, self.appends.ns, run.state.run_id)
            run.stall_checked = True
        try:
            step = partial(self._step, rules=await self._rules(run.state), ctx=ctx)
            going = True
            while going:
                # Every turn of the loop yields: however many moves a run takes, the event loop keeps turning
                # (other runs, heartbeats, probes). A move that makes no progress is an AgentFault in `next_move`.
                await asyncio.sleep(0)
                run, going = await self.appends.decided(run, step, ctx)
        finally:
            _STEP_SECONDS(run.state.agent).observe(time.perf_counter() - started)

    async def _rules(self, state: RunState) -> _Rules:
        agent = self.registry.agents.get(state.agent)
        if agent is None:
            raise PoisonMessage(
                f"run {state.run_id} names agent {state.agent!r}, which this deployment does not run",
                run_id=state.run_id,
            )
        try:
            return _Rules(agent, await self.catalog.pinned(state.started.catalog_revision, state.agent), None)
        except CatalogRevisionGone as exc:
            # Never run on under another revision's rules, and never leave the run (and its session) wedged:
            # it is handed to a person, and what it must still undo is undone under the agent's built-in config.
            return _Rules(agent, agent.config, exc)

    async def _step(self, run: HeldRun | None, write: Write, *, rules: _Rules, ctx: Context) -> bool:
        """Take the run's next move; False once the run waits or ends (nothing more to drive)."""
        assert run is not None  # the drive loop drives held runs only
        move: Move
        if run.stalled is not None:
            move = self._stalled(run.state, rules.agent, run.stalled)
        elif rules.gone is None or run.state.terminal:
            move = self._decide(run.state, rules)
        else:
            move = Append(intake.revision_gone(run.state, utcnow(), rules.gone.message))
        match move:
            case Idle(fault=fault, undo_left=undo_left):
                self._report_fault(run.state, fault, undo_left)
                await release_active(self.appends.broker, self.appends.ns, run.state, self.logger)
                await self.lanes.release(run.state)
                if run.state.terminal:
                    self.deadlines.disarm(run.state.run_id)
                self.appends.runs.settle(run)
                return False
            case AwaitApproval(approval=approval):
                # Calls before the held one in the same answer are journaled intents: send them now, not once
                # the approval is decided (a manager's may take a day).
                await self.requests.publish_pending(run, ctx)
                decided = await self.approvals.wait(run.state, approval, ctx)
                if decided is None:
                    # Waits holding no worker; its folded state stays in the bounded cache, so a guest's message
                    # while it waits is journaled without reading and folding the whole journal again (nor a
                    # `run.resumed` per message).
                    return False
                await write((decided,))
            case DecideApproval():
                await write((await self.approvals.decide(run.state, move, ctx),))
            case Append(events=events):
                await write(events)
            case AskModel(input=items):
                await self._ask_model(run, write, rules, items, ctx)
            case AwaitActions(fault=fault, undo_left=undo_left):
                self._report_fault(run.state, fault, undo_left)
                await self.requests.publish_pending(run, ctx)
                self.deadlines.arm(run.state)
                return False
        return True

    def _decide(self, state: RunState, rules: _Rules) -> Move:
        """`next_move` under the hook limit: an agent whose code runs past it is stopped, and its run handed off
        (`agent_fault`, naming the hook and the line it was stopped at), as for a hook that raised."""
        now = utcnow()
        self.deciding, self._loop_thread = state.run_id, threading.get_ident()
        try:
            return self.hook_limit.run(next_move, state, rules.agent, now, rules.config)
        except HookOverran as overran:
            fault = AgentFault(
                agent=rules.agent.name, hook=overran.hook_of(rules.agent), problem=str(overran)
            )
            log(
                self.logger,
                logging.ERROR,
                "agent code stopped by the hook limit",
                run_id=state.run_id,
                agent=rules.agent.name,
                limit_s=self.hook_limit.limit_s,
                where=overran.where,
            )
            return agent_failed(state, rules.agent, fault, now)
        finally:
            self.deciding = None

    def _stalled(self, state: RunState, agent: Agent, mark: StallMark) -> Move:
        """A run whose agent held a runtime's loop until its watchdog ended the process: its agent is not asked
        again (it would hold this loop too); a live run is handed off, an ended one only waits on what is out."""
        where = f" at {mark.where}" if mark.where else ""
        fault = AgentFault(
            agent=agent.name,
            hook="code",
            problem=f"held runtime {mark.worker}'s event loop for {mark.stalled_s:g} s{where}, until its "
            "watchdog ended the process; its agent is not run again for this run",
        )
        return agent_failed(state, agent, fault, utcnow())

    async def _ask_model(
        self, run: HeldRun, write: Write, rules: _Rules, items: tuple[dict[str, Any], ...], ctx: Context
    ) -> None:
        query = retrieval_query(run.state, rules.config)
        if query:
            unanswerable = policy_unavailable(run.state, rules.agent, query, self.library.problem, utcnow())
            if unanswerable is not None:
                await write((unanswerable,))
                return
        passages = tuple(self.library.search(query)) if query else ()
        reply = await self._ask(run, write, rules, items, ctx, passages)
        crash_point("runtime.after_model_answer")
        answered = intake.answer(run.state, reply, utcnow(), passages)
        if isinstance(answered, ModelRejected):
            log(
                self.logger,
                logging.WARNING,
                "model answer too large for the journal; refused",
                run_id=run.state.run_id,
                step_no=run.state.next_step,
                bytes=answered.answer_bytes,
            )
        await write((answered,))

    def _report_fault(self, state: RunState, fault: str, undo_left: tuple[str, ...]) -> None:
        """An ended run's agent faulted deciding what to undo: nothing is journaled (it is with a person already),
        so it is said here, never passed over in silence. An error an operator is alerted on only where the run
        left effects the agent may have wanted undone (`left_to_undo`); else the agent's bug alone, a warning."""
        if not fault:
            return
        if undo_left:
            log(
                self.logger,
                logging.ERROR,
                "agent fault in an ended run: what it should still undo is not planned; a person must check",
                run_id=state.run_id,
                agent=state.agent,
                status=state.status,
                fault=fault,
                undo_left=", ".join(undo_left)[:1000],
            )
            return
        log(
            self.logger,
            logging.WARNING,
            "agent fault in an ended run; it left nothing to undo",
            run_id=state.run_id,
            agent=state.agent,
            status=state.status,
            fault=fault,
        )

    async def _ask(
        self,
        run: HeldRun,
        write: Write,
        rules: _Rules,
        items: tuple[dict[str, Any], ...],
        ctx: Context,
        passages: tuple[Passage, ...] = (),
    ) -> ModelReply:
        """Call the model so that the call counts against the budgets even if its answer never reaches the
        journal: journaled before the call when the run is at risk of a crash, and after a call that failed.
        Retrieved passages go in just before the answer's place, where the fold puts them on replay."""
        if passages:
            items = (*items, passages_item(list(passages)))
        size = len(_sizer.encode(items))
        config = rules.config
        # The model asked first: the pinned configuration's first route, else the deployment's.
        model_name = config.routes[0].model if config.routes else self.settings.model
        if ask_at_risk(run.state):
            await write((model_asked(run.state, model_name, size, utcnow()),))
        try:
            with span(
                SpanName.MODEL_CALL,
                ctx,
                run_id=run.state.run_id,
                step_no=run.state.next_step,
                agent=rules.agent.name,
                **{SpanAttr.ROUTE: model_name},
            ) as called:
                reply = await self.model.answer(rules.agent, items, config, run.state.deadline_at)
                annotate(called, route=reply.provider, outcome=f"{len(reply.tool_calls)} tool call(s)")
                return reply
        except ModelUnavailable as exc:
            try:
                await write((model_asked(run.state, model_name, size, utcnow(), failed=exc.message[:500]),))
            except CrashsafeError:
                pass  # the run moved, or the broker is down: the model's failure is what the caller must see
            raise
