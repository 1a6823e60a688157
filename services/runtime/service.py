"""The runtime shell: takes inbound events and outcomes off JetStream, folds the run, journals decisions, asks tools."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.capabilities import CapabilityIssuer, OutcomeRefusal
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import (
    CatalogRevisionGone,
    CrashsafeError,
    ModelUnavailable,
    OutcomeRefused,
    PoisonMessage,
    RunVersionConflict,
    SessionOfAnotherGuest,
)
from crashsafe.contracts.inbound import InboundEvent, inbound_decoder
from crashsafe.contracts.keys import GuestScope, KeyScheme
from crashsafe.contracts.run_events import (
    MAX_EVENT_BYTES,
    ActionCompleted,
    ActionRequested,
    HandOffReason,
    Origin,
    Passage,
    PolicyDenied,
    RunCompleted,
    RunEvent,
    RunHandedOff,
    RunNudged,
    RunResumed,
    RunStarted,
    TurnReceived,
    UnknownEvent,
    event_encoder,
    request_for,
)
from crashsafe.contracts.spans import SpanAttr, SpanName
from crashsafe.contracts.streams import (
    RUNTIME_MAX_DELIVER,
    ConsumerSpec,
    active_spec,
    approvals_spec,
    runtime_consumers,
    sessions_spec,
    timers_consumer,
)
from crashsafe.contracts.subjects import WAKE_TOKEN, Header, StreamKind
from crashsafe.contracts.support import ticket_for
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    OutcomeStatus,
    RunWake,
    runtime_message_decoder,
    tool_encoder,
)
from crashsafe.domain.agent import Agent
from crashsafe.domain.authority import Terms, outcome_refusal, resend_terms, terms_for, to_resolve
from crashsafe.domain.decide import (
    Append,
    AskModel,
    AwaitActions,
    AwaitApproval,
    DecideApproval,
    Idle,
    Move,
    next_move,
    policy_unavailable,
)
from crashsafe.domain.fold import fold_run, passages_item, replay
from crashsafe.domain.handoff import handoff_reply
from crashsafe.domain.model_calls import ModelReply, ask_at_risk, model_answered, model_asked, model_rejected
from crashsafe.domain.registry import Registry
from crashsafe.domain.retrieval import retrieval_query
from crashsafe.domain.run_state import RunState
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform import metrics, probes
from crashsafe.services.platform.active_runs import release_active
from crashsafe.services.platform.asks import wake_run
from crashsafe.services.platform.consumer import Deliveries
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.guests import GuestProfiles
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.journal import RunJournal
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import all_streams, require
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tickets import publish_ticket
from crashsafe.services.platform.tracing import annotate, context_from, headers_for, span, trace_id_of
from crashsafe.services.runtime.approvals import ApprovalDesk
from crashsafe.services.runtime.catalog import RunCatalog
from crashsafe.services.runtime.lanes import SessionLanes
from crashsafe.services.runtime.model import Model

MAX_CACHED_RUNS = 50_000
_sizer = msgspec.json.Encoder()  # measures what a model call sends, for the budget's token estimate
MAX_CONFLICT_RETRIES = 20
DEADLINE_SLACK_S = 0.05  # wake just after the deadline, so `next_move` sees it passed
# Metric children per agent (and hand-off reason), made once.
_RUNS_STARTED = metrics.Children(metrics.RUNS_STARTED)
_RUNS_COMPLETED = metrics.Children(metrics.RUNS_COMPLETED)
_RUNS_HANDED_OFF = metrics.Children(metrics.RUNS_HANDED_OFF)
_STEP_SECONDS = metrics.Children(metrics.STEP_SECONDS)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _journal_headers(state: RunState, ctx: Context) -> dict[str, str]:
    """The trace context and, for an event appended after its run ended (a late receipt after a hand-off),
    `Crashsafe-Run-Ended`: the projector re-plans the run's projections from it, reading no journal to find out."""
    headers = headers_for(ctx)
    if state.terminal:
        headers[Header.RUN_ENDED] = "1"
    return headers


@dataclass
class _Run:
    """A run this worker holds in memory: its folded state, its journal version, the requests it published."""

    state: RunState
    seq: int
    published: set[str] = field(default_factory=set)  # `_sent(request)` of each


def _sent(intent: ActionRequested) -> str:
    """What `_Run.published` remembers of a request: its step and key (a business key may repeat across steps)."""
    return f"{intent.step_no}:{intent.key}"


def _still_moving(journal: RunJournal, run_id: str, run: _Run | None) -> RunVersionConflict:
    """The error of a message that lost every append race: retry later, with the sequence it last expected."""
    return RunVersionConflict(subject=journal.ns.run_events(run_id), expected_seq=run.seq if run else 0)


class Runtime:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        registry: Registry,
        model: Model,
        logger: logging.Logger,
        issuer: CapabilityIssuer,
        *,
        catalog: RunCatalog | None = None,
        approvals: ApprovalDesk | None = None,
        lanes: SessionLanes | None = None,
        profiles: GuestProfiles | None = None,
        library: Library | None = None,
    ) -> None:
        self.broker = broker
        # The parts around the loop; the composition root passes each in (the defaults are for tests).
        self.catalog = catalog or RunCatalog(registry)
        self.approvals = approvals or ApprovalDesk()
        self.lanes = lanes or SessionLanes()
        self.profiles = profiles or GuestProfiles()
        self.library = library or Library()
        # Apart from readiness: without its documents the runtime still serves everything but policy answers.
        metrics.KNOWLEDGE_AVAILABLE.set(1 if self.library.available else 0)
        # Signs every action request this runtime publishes; the only holder of the signing key.
        self.issuer = issuer
        self.settings = settings
        self.registry = registry
        self.ns = settings.namespace
        self.model = model
        self.logger = logger
        self.journal = RunJournal(broker, self.ns)
        self.worker = settings.worker_id
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        # One lock per guest session with messages in hand, and how many handlers share it.
        self._sessions: dict[str, tuple[asyncio.Lock, int]] = {}
        # A wake at the deadline of each run this worker saw waiting on actions (see `_arm_deadline`).
        self._deadlines: dict[str, asyncio.TimerHandle] = {}
        self._wakes: set[asyncio.Task[None]] = set()
        self.deliveries = Deliveries(
            broker,
            self.ns,
            "runtime",
            logger,
            max_deliver=RUNTIME_MAX_DELIVER,
            ack_wait_s=settings.ack_wait_s,
        )
        self.consumers: tuple[ConsumerSpec, ...] = ()  # its durables, once started

    async def start(self) -> None:
        await require(
            self.broker,
            [
                *all_streams(self.ns),
                active_spec(self.ns).stream,
                approvals_spec(self.ns).stream,
                sessions_spec(self.ns).stream,
            ],
        )
        inbound, outcomes = runtime_consumers(self.ns, self.settings.ack_wait_s)
        timers = timers_consumer(self.ns, self.settings.ack_wait_s)
        self.consumers = (inbound, outcomes, timers)
        for spec in (inbound, outcomes, timers):
            await self.broker.ensure_consumer(spec)
        # Pulled as handlers free up (room), never waiting inside a callback (contracts/streams.py).
        await self.broker.subscribe(
            inbound, self.deliveries.dispatch(self._on_inbound), room=self.deliveries.room
        )
        await self.broker.subscribe(
            outcomes, self.deliveries.dispatch(self._on_runtime_message), room=self.deliveries.room
        )
        await self.broker.subscribe(
            timers, self.deliveries.dispatch(self._on_timer), room=self.deliveries.room
        )
        log(self.logger, logging.INFO, "runtime ready", worker=self.worker, namespace=self.ns.name)

    def ops_checks(self) -> dict[str, probes.Check]:
        """Readiness: NATS, the streams and buckets it checked at start, and its three durables."""
        return {
            **probes.basic_checks(
                self.broker,
                all_streams(self.ns),
                [active_spec(self.ns), approvals_spec(self.ns), sessions_spec(self.ns)],
            ),
            **probes.consumer_checks(self.broker, self.consumers),
        }

    def ops_samplers(self) -> list[probes.Sampler]:
        return [probes.lag_sampler(self.broker, lambda: self.consumers)]

    # Message handlers ---------------------------------------------------------------------------------------

    async def _on_inbound(self, msg: Msg) -> None:
        event = inbound_decoder.decode(msg.data)
        with span(
            SpanName.RUNTIME_STEP,
            context_from(msg.headers),
            run_id=event.run_id,
            agent=event.agent,
            event_type="inbound",
        ) as ctx:
            await self.admit(event, ctx, redelivered=msg.metadata.num_delivered > 1)

    async def _on_timer(self, msg: Msg) -> None:
        """A fired durable timer (an approval's expiry): a wake of its run, which then asks the record."""
        wake = runtime_message_decoder.decode(msg.data)
        run_id = self.ns.fired_run(msg.subject)
        if not isinstance(wake, RunWake) or run_id is None or wake.run_id != run_id:
            raise PoisonMessage(
                f"a timer on {msg.subject} that is not a wake of its run", run_id=run_id or ""
            )
        async with self._lock(run_id):
            with span(
                SpanName.RUNTIME_STEP, context_from(msg.headers), run_id=run_id, event_type="timer"
            ) as ctx:
                await self.wake(wake, ctx)

    async def _on_runtime_message(self, msg: Msg) -> None:
        message = runtime_message_decoder.decode(msg.data)
        with span(
            SpanName.RUNTIME_STEP,
            context_from(msg.headers),
            run_id=message.run_id,
            event_type="outcome" if isinstance(message, ActionOutcome) else "wake",
        ) as ctx:
            await self._runtime_message(msg, message, ctx)

    async def _runtime_message(self, msg: Msg, message: ActionOutcome | RunWake, ctx: Context) -> None:
        source, subject_run = self.ns.outcome_source(msg.subject) or ("", "")
        key, tool = (message.key, message.tool) if isinstance(message, ActionOutcome) else ("", "")
        if subject_run != message.run_id or isinstance(message, ActionOutcome) == (source == WAKE_TOKEN):
            # A message for one run on another's subject, an outcome posing as a wake-up, or the reverse.
            raise OutcomeRefused(
                reason=OutcomeRefusal.WRONG_SUBJECT, key=key, tool=tool, run_id=message.run_id, source=source
            )
        async with self._lock(message.run_id):
            if isinstance(message, ActionOutcome):
                await self.record_outcome(message, ctx, source)
            else:
                await self.wake(message, ctx)

    # Use cases ----------------------------------------------------------------------------------------------

    async def admit(self, event: InboundEvent, ctx: Context, redelivered: bool = False) -> None:
        """A guest message, in its session's lane: it starts its own run if the session is free (or its owner
        has ended), else it becomes the next turn of the run that owns the session. The lane record decides
        (compare-and-set), not the gateway's hint (`turn_of`), which may be stale by now.

        Messages of one session are taken one at a time, in the order they were delivered (the session's lock is
        taken before the first await, and asyncio's locks are fair)."""
        session = f"{event.tenant}/{event.message.session_id}"
        lock, users = self._sessions.get(session, (asyncio.Lock(), 0))
        self._sessions[session] = (lock, users + 1)
        try:
            async with lock:
                if redelivered and await self._taken_already(event):
                    return
                await self._admit(event, ctx)
        finally:
            lock, users = self._sessions[session]
            if users <= 1:
                del self._sessions[session]
            else:
                self._sessions[session] = (lock, users - 1)

    async def _admit(self, event: InboundEvent, ctx: Context) -> None:
        for _ in range(MAX_CONFLICT_RETRIES):
            owner = await self._lane_owner(event, ctx)
            if owner == event.run_id:
                async with self._lock(event.run_id):
                    await self.accept(event, ctx)
                return
            stranger = False
            async with self._lock(owner):
                try:
                    if await self.join(owner, event, ctx):
                        return
                except SessionOfAnotherGuest:
                    stranger = True
            if stranger:
                # The session changed hands after the gateway checked the guest (it answered 202): the message
                # must not answer another guest's run, nor be lost. It becomes its own run, outside the lane.
                log(
                    self.logger,
                    logging.WARNING,
                    "a turn of another guest's session starts its own run",
                    run_id=event.run_id,
                    owner=owner,
                )
                async with self._lock(event.run_id):
                    await self.accept(msgspec.structs.replace(event, turn_of=""), ctx)
                return
            # The owner ended before the turn reached it: decide the lane again.
        raise RunVersionConflict(subject=self.ns.run_events(event.run_id), expected_seq=0)

    async def _taken_already(self, event: InboundEvent) -> bool:
        """A message that comes again (its handler died before the ack) may already be a turn of a run of its
        session that has ended since: never start a second run of it. Asked only on a redelivery. Journals are
        read for the session's owner and its last finished runs (at most 6)."""
        if not event.tenant:
            return False
        owner = await self.lanes.owner(event.tenant, event.message.session_id)
        finished = await self.lanes.finished_runs(event.tenant, event.message.session_id)
        for run_id in {owner, *finished} - {"", event.run_id}:
            # The journal, never this replica's cached copy: a run it holds waiting may have taken this very
            # message as a turn on another replica and ended there (the copy would say "not ended, not taken").
            state = await self._peek(run_id, cached=False)
            if state is not None and state.terminal and event.message.event_id in state.turn_ids:
                return True  # (a run still active that holds it is driven again by the usual path)
        return False

    async def _lane_owner(self, event: InboundEvent, ctx: Context) -> str:
        """The run this message belongs to: its own, or the session's active run."""
        tenant, session = event.tenant, event.message.session_id
        if not tenant or event.run_id in self._runs:
            return event.run_id
        if await self.broker.first_on_subject(
            self.ns.stream(StreamKind.RUNS), self.ns.run_events(event.run_id)
        ):
            return event.run_id  # it started its run already (a redelivery)
        for _ in range(MAX_CONFLICT_RETRIES):
            owner = await self.lanes.owner(tenant, session)
            if owner == event.run_id:
                return owner  # the gateway claimed the session for this message's run
            if not owner:
                won = await self.lanes.take_over(
                    tenant, session, event.run_id, "", None, event.message.guest_id
                )
                if won == event.run_id:
                    return won
                continue
            state = await self._peek(owner)
            if state is not None and not state.terminal:
                return owner
            if state is None:
                first = await self.broker.last_on_subject(
                    self.ns.stream(StreamKind.INBOUND), self.ns.inbound(owner)
                )
                if first is not None:
                    # The owner's own message is on its way: start its run now, so this turn joins it in order.
                    started = inbound_decoder.decode(first.data)
                    async with self._lock(owner):
                        await self.accept(msgspec.structs.replace(started, turn_of=""), ctx)
                    return owner
            # The owner ended (or never started: its gateway died between claiming and publishing).
            won = await self.lanes.take_over(
                tenant, session, event.run_id, owner, state, event.message.guest_id
            )
            if won == event.run_id:
                return won
        return event.run_id

    async def _peek(self, run_id: str, cached: bool = True) -> RunState | None:
        held = self._runs.get(run_id) if cached else None
        if held is not None and not held.state.terminal:
            return held.state
        events, _ = await self.journal.read(run_id)
        return replay(events)

    async def join(self, owner: str, event: InboundEvent, ctx: Context) -> bool:
        """Journal the message as the owner's next turn (once per event id) and drive the owner; False if the
        owner has ended (the caller decides the lane again)."""
        run = await self._load(owner, ctx)
        for _ in range(MAX_CONFLICT_RETRIES):
            if run is None or run.state.terminal:
                return False
            if event.message.guest_id != run.state.guest_id:
                # Another guest's message in this session must never answer this run's approval.
                raise SessionOfAnotherGuest(session_id=event.message.session_id[:128], run_id=owner)
            if event.message.event_id in run.state.turn_ids:
                break  # journaled already (the message came again after a crash)
            turn = TurnReceived(
                run_id=owner, at=utcnow(), event_id=event.message.event_id, text=event.message.text
            )
            try:
                self._apply(run, turn, await self.journal.append(turn, run.seq, headers_for(ctx)))
                crash_point("runtime.after_turn_journaled")
                break
            except RunVersionConflict:
                run = await self._reload(run, ctx)
        else:
            # Lost the race every time: the turn is not journaled, so the message must come again (nak), not ack.
            raise _still_moving(self.journal, owner, run)
        assert run is not None
        await self._drive(run, ctx)
        return True

    async def accept(self, event: InboundEvent, ctx: Context) -> None:
        # Optimistic: a new run is created by appending at sequence 0; only a clash costs a read of the journal.
        run = self._runs.get(event.run_id)
        if run is None:
            now = utcnow()
            if event.agent not in self.registry.agents:
                raise PoisonMessage(f"inbound event names unknown agent {event.agent!r}", run_id=event.run_id)
            revision, config = self.catalog.current(event.agent)
            budget = config.budget
            profile = (
                await self.profiles.read(event.tenant, event.message.guest_id) if config.memory else None
            )
            history = await self.lanes.history(event.tenant, event.message.session_id, event.message.guest_id)
            started = RunStarted(
                run_id=event.run_id,
                at=now,
                agent=event.agent,
                session_id=event.message.session_id,
                guest_id=event.message.guest_id,
                event_id=event.message.event_id,
                idempotency_key=event.key,
                input_hash=event.input_hash,
                text=event.message.text,
                budget=budget,
                deadline_at=now + timedelta(seconds=budget.deadline_s),
                tenant=event.tenant,
                catalog_revision=revision,
                profile=profile,
                history=history,
                key_scheme=KeyScheme.BUSINESS,
                guest_scope=GuestScope.TENANT,  # the guest is (tenant, guest) at every provider
            )
            try:
                seq = await self.journal.append(started, 0, headers_for(ctx))
                run = self._remember(_Run(fold_run(None, started), seq))
                _RUNS_STARTED(event.agent).inc()
                log(self.logger, logging.DEBUG, "run started", run_id=event.run_id, trace_id=trace_id_of(ctx))
            except RunVersionConflict:
                run = await self._load(event.run_id, ctx, fresh=True)
        if run is not None:
            await self._drive(run, ctx)

    async def record_outcome(self, outcome: ActionOutcome, ctx: Context, source: str) -> None:
        """Journal an executor's outcome. `source` is the family token of the subject it came on: an outcome is
        journaled only for a request the run journaled, with its tool and step, from the family it was sent to."""
        # Not marked resumed before the outcome is known to be the run's: a refused one leaves the journal as it was.
        resuming = outcome.run_id not in self._runs
        run = await self._load(outcome.run_id, ctx, mark_resume=False)
        if run is None:
            raise OutcomeRefused(
                reason=OutcomeRefusal.UNREQUESTED,
                key=outcome.key,
                tool=outcome.tool,
                run_id=outcome.run_id,
                source=source,
            )
        if outcome_refusal(run.state, outcome, source) is not None:
            # Our copy may be stale (another replica moved the run on): never drop an outcome on a stale view.
            run = await self._reload(run, ctx)
        refusal = outcome_refusal(run.state, outcome, source)
        if refusal is not None:
            raise OutcomeRefused(
                reason=refusal, key=outcome.key, tool=outcome.tool, run_id=outcome.run_id, source=source
            )
        if resuming and not run.state.terminal:
            await self._mark_resumed(run, ctx)
        for _ in range(MAX_CONFLICT_RETRIES):
            settles_unknown = (
                run.state.unknown_step(outcome.step_no) is not None
                and outcome.status != OutcomeStatus.UNKNOWN
            )
            if run.state.pending_step(outcome.step_no) is None and not settles_unknown:
                break  # already journaled (a redelivery): nothing to record
            crash_point("runtime.after_outcome_received")
            completed = ActionCompleted(
                run_id=outcome.run_id,
                at=utcnow(),
                step_no=outcome.step_no,
                key=outcome.key,
                status=outcome.status,
                result=outcome.result,
                error=outcome.error,
                provider_ref=outcome.provider_ref,
                via=outcome.via,
                attempts=outcome.attempts,
                deliveries=outcome.deliveries,
                evidence=outcome.evidence,
            )
            try:
                self._apply(
                    run,
                    completed,
                    await self.journal.append(completed, run.seq, _journal_headers(run.state, ctx)),
                )
                break
            except RunVersionConflict:
                run = await self._reload(run, ctx)
        else:
            # The receipt is not journaled: it must come again (nak), never be acked (guarantee 3).
            raise _still_moving(self.journal, outcome.run_id, run)
        await self._drive(run, ctx)

    async def wake(self, wake: RunWake, ctx: Context) -> None:
        run = await self._load(wake.run_id, ctx, fresh=True, mark_resume=False)
        if run is None:
            return
        if (
            run.state.terminal
            and not any(
                run.state.unknown_step(r.step_no) for r, _ in run.state.completed if r.key in wake.keys
            )
            and not any(p.key in wake.keys for p in run.state.pending)
        ):
            # An ended run is nudged only about its unknown outcomes and what it left pending at hand-off.
            return
        nudged = RunNudged(run_id=wake.run_id, at=utcnow(), by=wake.by, reason=wake.reason, keys=wake.keys)
        try:
            self._apply(run, nudged, await self.journal.append(nudged, run.seq, headers_for(ctx)))
        except RunVersionConflict:
            run = await self._reload(run, ctx)
        run.published.clear()  # a wake means something may have been lost: publish pending requests again
        # Only the runtime publishes action requests: the keys a wake names are re-sent from the journal, with a
        # fresh capability and a fresh message id (so they pass the duplicate window), to the owning executor,
        # which answers from its receipt or asks the provider by key.
        for intent in to_resolve(run.state, wake.keys):
            await self._publish_request(
                intent,
                ctx,
                resend_terms(intent, utcnow()),
                f"resolve:{uuid.uuid4().hex}",
                agent=run.state.agent,
            )
            run.published.add(_sent(intent))
        await self._drive(run, ctx)

    # The loop -----------------------------------------------------------------------------------------------

    async def _drive(self, run: _Run, ctx: Context) -> None:
        """Advance the run until it waits on an action or ends. Every decision is journaled before it acts."""
        annotate(ctx, step_no=run.state.next_step, agent=run.state.agent)
        started = time.perf_counter()
        try:
            await self._drive_on(run, ctx)
        finally:
            _STEP_SECONDS(run.state.agent).observe(time.perf_counter() - started)

    async def _drive_on(self, run: _Run, ctx: Context) -> None:
        agent = self.registry.agents.get(run.state.agent)
        if agent is None:
            raise PoisonMessage(
                f"run {run.state.run_id} names agent {run.state.agent!r}, which this deployment does not run",
                run_id=run.state.run_id,
            )
        gone: CatalogRevisionGone | None = None
        try:
            config = await self.catalog.pinned(run.state.started.catalog_revision, run.state.agent)
        except CatalogRevisionGone as exc:
            # Never run on under another revision's rules, and never leave the run (and its session) wedged:
            # it is handed to a person, and what it must still undo is undone under the agent's built-in config.
            gone, config = exc, agent.config
        conflicts = 0
        while True:
            # Every turn of the loop yields: however many moves a run takes, the event loop keeps turning (other
            # runs, heartbeats, probes). A move that makes no progress is an AgentFault hand-off in `next_move`.
            await asyncio.sleep(0)
            move: Move
            if gone is None or run.state.terminal:
                move = next_move(run.state, agent, utcnow(), config)
            else:
                reason = HandOffReason.CATALOG_REVISION_GONE
                move = Append(
                    (
                        RunHandedOff(
                            run_id=run.state.run_id,
                            at=utcnow(),
                            reason=reason,
                            detail=gone.message,
                            reply=handoff_reply(reason),
                        ),
                    )
                )
            try:
                match move:
                    case Idle(fault=fault):
                        self._report_fault(run.state, fault)
                        await release_active(self.broker, self.ns, run.state, self.logger)
                        await self.lanes.release(run.state)
                        self._settle(run)
                        return
                    case AwaitApproval(approval=approval):
                        # Calls before the held one in the same answer are journaled intents: send them now,
                        # not once the approval is decided (a manager's may take a day).
                        await self._publish_pending(run, ctx)
                        decided = await self.approvals.wait(run.state, approval, ctx)
                        if decided is None:
                            # Waits holding no worker; its folded state stays in the bounded cache, so a guest's
                            # message while it waits is journaled without reading and folding the whole journal
                            # again (nor a `run.resumed` per message).
                            return
                        self._apply(
                            run, decided, await self.journal.append(decided, run.seq, headers_for(ctx))
                        )
                    case DecideApproval():
                        decided = await self.approvals.decide(run.state, move, ctx)
                        self._apply(
                            run, decided, await self.journal.append(decided, run.seq, headers_for(ctx))
                        )
                    case Append(events=events):
                        for event in events:
                            self._apply(
                                run, event, await self.journal.append(event, run.seq, headers_for(ctx))
                            )
                            if isinstance(event, ActionRequested):
                                crash_point("runtime.after_action_journaled")
                            if isinstance(event, PolicyDenied):
                                metrics.POLICY_DENIALS.labels(rule=event.rule).inc()
                            if isinstance(event, RunHandedOff):
                                await self._ticket(run.state, event)
                    case AskModel(input=items):
                        query = retrieval_query(run.state, config)
                        unanswerable = (
                            policy_unavailable(run.state, agent, query, self.library.problem, utcnow())
                            if query
                            else None
                        )
                        if unanswerable is not None:
                            self._apply(
                                run,
                                unanswerable,
                                await self.journal.append(unanswerable, run.seq, headers_for(ctx)),
                            )
                            await self._ticket(run.state, unanswerable)
                            continue
                        passages = tuple(self.library.search(query)) if query else ()
                        reply = await self._ask(run, agent, items, ctx, config, passages)
                        crash_point("runtime.after_model_answer")
                        answered: RunEvent = model_answered(run.state, reply, utcnow(), passages)
                        size = len(event_encoder.encode(answered))
                        if size > MAX_EVENT_BYTES:
                            answered = model_rejected(run.state, reply, size, utcnow())
                            log(
                                self.logger,
                                logging.WARNING,
                                "model answer too large for the journal; refused",
                                run_id=run.state.run_id,
                                step_no=run.state.next_step,
                                bytes=size,
                            )
                        self._apply(
                            run, answered, await self.journal.append(answered, run.seq, headers_for(ctx))
                        )
                    case AwaitActions(fault=fault):
                        self._report_fault(run.state, fault)
                        await self._publish_pending(run, ctx)
                        self._arm_deadline(run.state)
                        return
            except RunVersionConflict:
                conflicts += 1
                if conflicts > MAX_CONFLICT_RETRIES:
                    raise
                run = await self._reload(run, ctx)

    def _report_fault(self, state: RunState, fault: str) -> None:
        """An ended run's agent faulted deciding what to undo: nothing is journaled (it is with a person already),
        so it is said here, as an error an operator is alerted on, never passed over in silence."""
        if fault:
            log(
                self.logger,
                logging.ERROR,
                "agent fault in an ended run: what it should still undo is not planned; a person must check",
                run_id=state.run_id,
                agent=state.agent,
                status=state.status,
                fault=fault,
            )

    async def _publish_pending(self, run: _Run, ctx: Context) -> None:
        for request in run.state.pending:
            if _sent(request) not in run.published:
                await self._publish_request(request, ctx, agent=run.state.agent)
                run.published.add(_sent(request))

    async def _ticket(self, state: RunState, handed: RunHandedOff) -> None:
        """A handed-off run goes to the support queue once journaled; a failed publish never wedges the run
        (the reconciler republishes tickets it finds missing)."""
        started = state.started
        ticket = ticket_for(
            handed,
            tenant=started.tenant,
            agent=started.agent,
            guest_id=started.guest_id,
            session_id=started.session_id,
        )
        await publish_ticket(self.broker, self.ns, ticket, self.logger)

    def _arm_deadline(self, state: RunState) -> None:
        """Wake the run at its deadline if it is still waiting then: `next_move` hands it off and leaves what is
        pending to the reconciler. The wake goes through the outcomes stream, so any replica may handle it; if
        this worker dies first, the reconciler's wakes for overdue actions reach the same decision later."""
        if state.terminal or state.run_id in self._deadlines:
            return
        if all(p.origin == Origin.COMPENSATION for p in state.pending):
            return  # compensations are exempt from the deadline
        run_id = state.run_id
        delay = max((state.deadline_at - utcnow()).total_seconds(), 0.0) + DEADLINE_SLACK_S

        def fire() -> None:
            self._deadlines.pop(run_id, None)
            task = asyncio.get_running_loop().create_task(self._wake_at_deadline(run_id))
            self._wakes.add(task)
            task.add_done_callback(self._wakes.discard)

        self._deadlines[run_id] = asyncio.get_running_loop().call_later(delay, fire)

    async def _wake_at_deadline(self, run_id: str) -> None:
        try:
            await wake_run(
                self.broker,
                self.settings,
                run_id,
                "deadline passed with actions pending",
                f"runtime:{self.worker}",
            )
        except CrashsafeError as exc:  # the broker is down: the reconciler's wakes are the backstop
            log(self.logger, logging.WARNING, "deadline wake not sent", run_id=run_id, error=exc.message)

    def stop_timers(self) -> None:
        for handle in self._deadlines.values():
            handle.cancel()
        self._deadlines.clear()

    async def _ask(
        self,
        run: _Run,
        agent: Agent,
        items: tuple[dict[str, Any], ...],
        ctx: Context,
        config: AgentConfig,
        passages: tuple[Passage, ...] = (),
    ) -> ModelReply:
        """Call the model so that the call counts against the budgets even if its answer never reaches the
        journal: journaled before the call when the run is at risk of a crash, and after a call that failed.
        Retrieved passages go in just before the answer's place, where the fold puts them on replay."""
        if passages:
            items = (*items, passages_item(list(passages)))
        size = len(_sizer.encode(items))
        # The model asked first: the pinned configuration's first route, else the deployment's.
        model_name = config.routes[0].model if config.routes else self.settings.model
        if ask_at_risk(run.state):
            asked = model_asked(run.state, model_name, size, utcnow())
            self._apply(run, asked, await self.journal.append(asked, run.seq, headers_for(ctx)))
        try:
            with span(
                SpanName.MODEL_CALL,
                ctx,
                run_id=run.state.run_id,
                step_no=run.state.next_step,
                agent=agent.name,
                **{SpanAttr.ROUTE: model_name},
            ) as called:
                reply = await self.model.answer(agent, items, config, run.state.deadline_at)
                annotate(called, route=reply.provider, outcome=f"{len(reply.tool_calls)} tool call(s)")
                return reply
        except ModelUnavailable as exc:
            failed = model_asked(run.state, model_name, size, utcnow(), failed=exc.message[:500])
            try:
                self._apply(run, failed, await self.journal.append(failed, run.seq, headers_for(ctx)))
            except CrashsafeError:
                pass  # the run moved, or the broker is down: the model's failure is what the caller must see
            raise

    async def _publish_request(
        self,
        intent: ActionRequested,
        ctx: Context,
        terms: Terms | None = None,
        msg_id: str = "request",
        *,
        agent: str,
    ) -> None:
        """Sign the journaled request and send it to the executor owning its key. Nats-Msg-Id
        (`<msg_id>:<run>:<step>:<key>`) dedups a re-publish inside the window; the executor's store dedups it forever."""
        subject = self.ns.actions_for_key(intent.family, intent.key, self.settings.partitions)
        terms = terms or terms_for(intent, utcnow())
        # Bound to the run's agent: an executor serves a compensation-only tool to a plan only for the agent
        # whose model may ask for it (support's refund_payment), never to a booking run.
        request = self.issuer.grant(request_for(intent), terms.origin, terms.expires_at, agent)
        with span(
            SpanName.ACTION_REQUEST,
            ctx,
            run_id=intent.run_id,
            step_no=intent.step_no,
            idempotency_key=intent.key,
            tool=intent.tool,
        ) as sent:
            await self.broker.publish(
                subject,
                tool_encoder.encode(request),
                # The run and step too: a business key may be asked by two steps or two runs, each its own request.
                msg_id=f"{msg_id}:{intent.run_id}:{intent.step_no}:{intent.key}",
                headers=headers_for(sent),
            )

    # Run cache ----------------------------------------------------------------------------------------------

    def _lock(self, run_id: str) -> asyncio.Lock:
        lock = self._locks.get(run_id)
        if lock is None:
            lock = self._locks[run_id] = asyncio.Lock()
        return lock

    def _apply(self, run: _Run, event: RunEvent | UnknownEvent, seq: int) -> None:
        run.state = fold_run(run.state, event)
        run.seq = seq
        # Counted where they are journaled (each append happens once: a clash raises before it gets here).
        if isinstance(event, RunCompleted):
            _RUNS_COMPLETED(run.state.agent).inc()
        elif isinstance(event, RunHandedOff):
            _RUNS_HANDED_OFF(run.state.agent, str(event.reason)).inc()

    def _remember(self, run: _Run) -> _Run:
        self._runs[run.state.run_id] = run
        self._runs.move_to_end(run.state.run_id)
        while len(self._runs) > MAX_CACHED_RUNS:
            old, _ = self._runs.popitem(last=False)
            self._locks.pop(old, None)
        return run

    def _settle(self, run: _Run) -> None:
        if run.state.terminal:
            self._runs.pop(run.state.run_id, None)
            lock = self._locks.get(run.state.run_id)
            if lock is not None and not lock.locked():
                self._locks.pop(run.state.run_id, None)

    async def _reload(self, run: _Run, ctx: Context) -> _Run:
        fresh = await self._load(run.state.run_id, ctx, fresh=True, mark_resume=False)
        assert fresh is not None
        fresh.published |= run.published
        return fresh

    async def _load(
        self, run_id: str, ctx: Context, fresh: bool = False, mark_resume: bool = True
    ) -> _Run | None:
        if not fresh and run_id in self._runs:
            self._runs.move_to_end(run_id)
            return self._runs[run_id]
        events, seq = await self.journal.read(run_id)
        state = replay(events)
        if state is None:
            return None
        run = self._remember(_Run(state, seq))
        if mark_resume and not state.terminal:
            await self._mark_resumed(run, ctx)
        return run

    async def _mark_resumed(self, run: _Run, ctx: Context) -> None:
        resumed = RunResumed(
            run_id=run.state.run_id,
            at=utcnow(),
            worker=self.worker,
            next_step=run.state.next_step,
            reason="worker picked up a run it did not hold in memory",
        )
        try:
            self._apply(run, resumed, await self.journal.append(resumed, run.seq, headers_for(ctx)))
            log(
                self.logger,
                logging.INFO,
                "run resumed",
                run_id=run.state.run_id,
                next_step=run.state.next_step,
            )
        except RunVersionConflict:
            pass  # another worker moved it; the caller's next append will re-fold
