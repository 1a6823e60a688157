"""The runtime shell: takes inbound events, outcomes, wakes and fired timers off JetStream, and hands each to its
use case (a guest's message, a receipt, a wake). Runs move only through the drive loop, journals only through the
one append path (`append_path.py`)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.capabilities import CapabilityIssuer, OutcomeRefusal
from crashsafe.contracts.errors import OutcomeRefused
from crashsafe.contracts.headers import Header
from crashsafe.contracts.inbound import inbound_decoder
from crashsafe.contracts.journal_chain import in_namespace
from crashsafe.contracts.spans import SpanName
from crashsafe.contracts.stream_routes import runtime_routes
from crashsafe.contracts.streams import (
    RUNTIME_MAX_DELIVER,
    ConsumerSpec,
    active_spec,
    approvals_spec,
    receipts_consumer,
    runtime_consumers,
    sessions_spec,
    timers_consumer,
)
from crashsafe.contracts.tool_messages import ActionOutcome, RunWake, runtime_message_decoder
from crashsafe.domain import intake
from crashsafe.domain.authority import outcome_refusal, receipt_refusal
from crashsafe.domain.fold import fold_run
from crashsafe.domain.registry import Registry
from crashsafe.services.knowledge.library import Library
from crashsafe.services.platform import metrics, probes, seam_checks
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.deliveries import Deliveries
from crashsafe.services.platform.hook_limit import HookLimit
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.jetstream_reads import StoredMessage
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import all_streams, require
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from, span
from crashsafe.services.records.guest_profiles import GuestProfiles
from crashsafe.services.records.run_catalog import RunCatalog
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.action_requests import ActionRequests
from crashsafe.services.runtime.append_path import RunAppends, Write
from crashsafe.services.runtime.deadlines import Deadlines
from crashsafe.services.runtime.drive_loop import DriveLoop
from crashsafe.services.runtime.guest_messages import GuestMessages
from crashsafe.services.runtime.held_actions import ApprovalDesk
from crashsafe.services.runtime.held_runs import HeldRun, HeldRuns
from crashsafe.services.runtime.lanes import SessionLanes
from crashsafe.services.runtime.model import Model
from crashsafe.services.runtime.run_checkpoints import RunCheckpoints


def utcnow() -> datetime:
    return datetime.now(UTC)


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
        self.settings = settings
        self.registry = registry
        self.ns = settings.namespace
        self.logger = logger
        self.worker = settings.worker_id
        # The parts around the loop; the composition root passes each in (the defaults are for tests).
        self.catalog = catalog or RunCatalog(registry)
        self.lanes = lanes or SessionLanes()
        self.profiles = profiles or GuestProfiles()
        library = library or Library()
        # Apart from readiness: without its documents the runtime still serves everything but policy answers.
        metrics.KNOWLEDGE_AVAILABLE.set(1 if library.available else 0)
        self.runs = HeldRuns()
        self.requests = ActionRequests(broker, settings, issuer, bus=True)
        self.checkpoints = RunCheckpoints(broker, self.ns, issuer, logger)
        self.appends = RunAppends(
            RunJournal(broker, self.ns),
            self.runs,
            broker,
            self.ns,
            self.worker,
            logger,
            self.requests,
            self.checkpoints,
        )
        self.deadlines = Deadlines(broker, settings, logger)
        self.loop = DriveLoop(
            appends=self.appends,
            requests=self.requests,
            deadlines=self.deadlines,
            registry=registry,
            catalog=self.catalog,
            approvals=approvals or ApprovalDesk(),
            lanes=self.lanes,
            library=library,
            model=model,
            settings=settings,
            logger=logger,
            hook_limit=HookLimit(settings.hook_limit_s),  # armed by the composition root (it owns SIGALRM)
        )
        self.messages = GuestMessages(
            appends=self.appends,
            loop=self.loop,
            lanes=self.lanes,
            profiles=self.profiles,
            catalog=self.catalog,
            registry=registry,
            logger=logger,
        )
        # The use cases a guest's message goes through, as the inbound handler (and tests) call them.
        self.admit, self.join, self.accept = self.messages.admit, self.messages.join, self.messages.accept
        self.deliveries = Deliveries(
            broker,
            self.ns,
            "runtime",
            logger,
            max_deliver=RUNTIME_MAX_DELIVER,
            ack_wait_s=settings.ack_wait_s,
        )
        inbound, outcomes = runtime_consumers(self.ns, settings.ack_wait_s)
        self.consumers: tuple[ConsumerSpec, ...] = (
            inbound,
            outcomes,
            timers_consumer(self.ns, settings.ack_wait_s),
            receipts_consumer(self.ns, settings.ack_wait_s),
        )

    @property
    def journal(self) -> RunJournal:
        """The journal the one append path writes (tests put a racing or gated one in its place)."""
        return self.appends.journal

    @journal.setter
    def journal(self, journal: RunJournal) -> None:
        self.appends.journal = journal

    @property
    def model(self) -> Model:
        """The model the drive loop asks (a test swaps in another script between runs)."""
        return self.loop.model

    @model.setter
    def model(self, model: Model) -> None:
        self.loop.model = model

    async def start(self) -> None:
        """Check its streams (StreamMissing), declare its durables (ConsumerShapeChanged), prove its seams
        (SeamBroken), and only then take work: a runtime that could not append or read takes none."""
        await require(
            self.broker,
            [
                *all_streams(self.ns),
                active_spec(self.ns).stream,
                approvals_spec(self.ns).stream,
                sessions_spec(self.ns).stream,
            ],
        )
        await seam_checks.declare(self.broker, self.consumers)
        await seam_checks.prove("runtime", self.seams())
        inbound, outcomes, timers, receipts = self.consumers
        # Pulled as handlers free up (room), never waiting inside a callback (contracts/streams.py).
        for spec, handler in (
            (inbound, self._on_inbound),
            (outcomes, self._on_outcome),
            (timers, self._on_timer),
            (receipts, self._on_receipt),
        ):
            await self.broker.subscribe(spec, self.deliveries.dispatch(handler), room=self.deliveries.room)
        self.checkpoints.start()
        log(self.logger, logging.INFO, "runtime ready", worker=self.worker, namespace=self.ns.name)

    def ops_checks(self) -> dict[str, probes.Check]:
        """Readiness: NATS, the streams and buckets it checked at start, and its seams."""
        return {
            **probes.basic_checks(
                self.broker,
                all_streams(self.ns),
                [active_spec(self.ns), approvals_spec(self.ns), sessions_spec(self.ns)],
            ),
            **self.seams(),
        }

    def seams(self) -> dict[str, probes.Check]:
        """Each subject it writes (a run event of each class, an action request of each family, a wake, a timer,
        a ticket, a dead letter) lands in the stream it expects, and its three durables are in their shape."""
        return {
            **seam_checks.route_checks(self.broker, runtime_routes(self.ns, self.registry.families)),
            **seam_checks.consumer_checks(self.broker, self.consumers),
        }

    def ops_samplers(self) -> list[probes.Sampler]:
        return [probes.lag_sampler(self.broker, lambda: self.consumers)]

    def stop_timers(self) -> None:
        self.deadlines.stop()
        self.checkpoints.stop()

    # Message handlers ---------------------------------------------------------------------------------------

    async def _on_inbound(self, msg: Msg) -> None:
        event = intake.addressed(inbound_decoder.decode(msg.data), self.registry.default_agent)
        self._came_again(msg, event.run_id)
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
        run_id = self.ns.fired_run(msg.subject)
        wake = intake.fired(runtime_message_decoder.decode(msg.data), msg.subject, run_id)
        self._came_again(msg, wake.run_id)
        async with self.runs.lock(wake.run_id):
            with span(
                SpanName.RUNTIME_STEP, context_from(msg.headers), run_id=wake.run_id, event_type="timer"
            ) as ctx:
                await self.wake(wake, ctx)

    async def _on_outcome(self, msg: Msg) -> None:
        """An executor's outcome, or a wake (the reconciler's, an operator's, a deadline's), on the outcomes stream."""
        message = runtime_message_decoder.decode(msg.data)
        self._came_again(msg, message.run_id)
        is_outcome = isinstance(message, ActionOutcome)
        with span(
            SpanName.RUNTIME_STEP,
            context_from(msg.headers),
            run_id=message.run_id,
            event_type="outcome" if is_outcome else "wake",
        ) as ctx:
            source, subject_run = self.ns.outcome_source(msg.subject) or ("", "")
            intake.on_its_subject(message, source, subject_run)
            async with self.runs.lock(message.run_id):
                if isinstance(message, ActionOutcome):
                    await self.record_outcome(message, ctx, source)
                else:
                    await self.wake(message, ctx)

    async def _on_receipt(self, msg: Msg) -> None:
        """A receipt an executor appended to its run's journal (the journal as the bus): the run folds it as the
        journal holds it and moves on; nothing is appended to say it again."""
        run_id = self.ns.journal_run(msg.subject) or ""
        self._came_again(msg, run_id)
        with span(
            SpanName.RUNTIME_STEP, context_from(msg.headers), run_id=run_id, event_type="receipt"
        ) as ctx:
            async with self.runs.lock(run_id):
                await self.take_receipt(run_id, msg.metadata.sequence.stream, msg, ctx)

    def _came_again(self, msg: Msg, run_id: str) -> None:
        """A redelivered message may be the one whose run's agent held another process's loop: look again."""
        if msg.metadata.num_delivered > 1:
            self.loop.suspect(run_id)

    # Use cases ----------------------------------------------------------------------------------------------

    async def record_outcome(self, outcome: ActionOutcome, ctx: Context, source: str) -> None:
        """Journal an executor's outcome. `source` is the family token of the subject it came on: an outcome is
        journaled only for a request the run journaled, with its tool and step, from the family it was sent to."""
        # Not marked resumed before the outcome is known to be the run's: a refused one leaves the journal as it was.
        resuming = outcome.run_id not in self.runs
        run = await self.appends.load(
            outcome.run_id, ctx, mark_resume=False, what=f"a receipt of {outcome.key}"
        )
        if run is not None and outcome_refusal(run.state, outcome, source) is not None:
            # Our copy may be stale (another replica moved the run on): never drop an outcome on a stale view.
            run = await self.appends.reload(run, ctx)
        refusal = (
            outcome_refusal(run.state, outcome, source) if run is not None else OutcomeRefusal.UNREQUESTED
        )
        if refusal is not None:
            raise OutcomeRefused(
                reason=refusal, key=outcome.key, tool=outcome.tool, run_id=outcome.run_id, source=source
            )
        assert run is not None
        if resuming:
            run = await self.appends.mark_resumed(run, ctx)

        async def receipt(held: HeldRun | None, write: Write) -> None:
            assert held is not None
            if not intake.outcome_recorded(held.state, outcome):
                crash_point("runtime.after_outcome_received")
                await write(intake.completed(held.state, outcome, utcnow()))

        run, _ = await self.appends.decided(run, receipt, ctx)
        await self.loop.drive(run, ctx)

    async def take_receipt(self, run_id: str, seq: int, msg: Msg, ctx: Context) -> None:
        """Fold a journaled receipt into the held run when it comes right after what the run holds (the executor
        appends one only right after its intent, `Crashsafe-Follows`); otherwise read the run again, which folds
        it with the rest. A receipt the fold does not take is refused as an outcome message would be (dead
        letter). Never journaled again: it stands where it is, and only ever right after its intent, so no run
        had ended before it (a receipt that comes later is sent as an outcome message and journaled by a runtime)."""
        family = self.ns.receipt_writer(msg.subject) or ""
        receipt = self.journal.event(StoredMessage(seq, msg.subject, msg.data, {}))
        held = self.runs.get(run_id)
        follows = (msg.headers or {}).get(Header.FOLLOWS)
        if held is not None and follows is not None and follows == str(held.seq):
            refusal = receipt_refusal(held.state, receipt, family)
            if refusal is None:
                held.state, held.seq = fold_run(held.state, receipt), seq
                # The chain hashes what is stored, whatever link the executor wrote (a checker reads both).
                held.head = held.head.after(in_namespace(self.ns.name, msg.subject), msg.data)
                self.checkpoints.note(run_id, held.head)
            run: HeldRun | None = held
        else:
            run = await self.appends.load(
                run_id, ctx, fresh=held is None or held.seq < seq, mark_resume=False
            )
            refusal = receipt_refusal(run.state, receipt, family) if run is not None else None
        if run is None or refusal is not None:
            raise OutcomeRefused(
                reason=refusal or OutcomeRefusal.UNREQUESTED,
                key=getattr(receipt, "key", ""),
                tool=getattr(receipt, "tool", ""),
                run_id=run_id,
                source=family,
            )
        if held is None and not run.state.terminal:
            run = await self.appends.mark_resumed(run, ctx)
        crash_point("runtime.after_outcome_received")
        await self.loop.drive(run, ctx)

    async def wake(self, wake: RunWake, ctx: Context) -> None:
        """A wake-up: journaled (if the run heeds it), the requests it names re-sent, the run driven again."""
        resuming = wake.run_id not in self.runs
        run = await self.appends.load(wake.run_id, ctx, fresh=True, mark_resume=False, what="a wake")
        if run is None or not intake.heeds(run.state, wake):
            return

        async def nudge(held: HeldRun | None, write: Write) -> None:
            assert held is not None
            await write(intake.nudged(held.state, wake, utcnow()))

        run, _ = await self.appends.decided(run, nudge, ctx)
        if resuming and not run.state.terminal:
            # Picked up by a wake alone (its worker died, nothing was redelivered yet): the journal says where it
            # resumed and who took it, exactly as when an inbound message or an outcome brings it back.
            run = await self.appends.mark_resumed(run, ctx)
        run.published.clear()  # a wake means something may have been lost: publish pending requests again
        await self.requests.resolve(run, wake.keys, ctx)
        await self.loop.drive(run, ctx)
