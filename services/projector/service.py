"""The projector shell: plans each ended run's projections from its journal and delivers them, one pull worker
per projection tool, each task's receipt durable in KV before its message is acknowledged."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial

import msgspec
from nats.aio.msg import Msg
from opentelemetry.context import Context

from crashsafe.contracts.errors import BrokerUnavailable, CrashsafeError, ErrorCode
from crashsafe.contracts.headers import Header
from crashsafe.contracts.projections import (
    AUDIT_TRAIL_TOOL,
    PlannedProjection,
    ProjectionPlan,
    ProjectionTask,
    task_encoder,
)
from crashsafe.contracts.run_events import RunStarted, decode_event
from crashsafe.contracts.stream_routes import projector_routes
from crashsafe.contracts.streams import (
    PLANNER_HISTORY_S,
    ConsumerSpec,
    projection_consumer,
    projections_spec,
    projector_planner_consumer,
)
from crashsafe.contracts.subjects import StreamKind
from crashsafe.domain.fold import replay
from crashsafe.domain.projection_plan import RETIRED, Projecting, plan
from crashsafe.domain.projection_rules import Trigger, envelope_of, trigger
from crashsafe.domain.registry import Registry
from crashsafe.services.platform import metrics, probes, seam_checks
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.deliveries import Deliveries, dead_letter
from crashsafe.services.platform.hook_limit import HookLimit, HookOverran
from crashsafe.services.platform.jetstream import Broker, Subscription
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import require
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import context_from, headers_for
from crashsafe.services.projector.projection_delivery import ProjectionDelivery, Undeliverable
from crashsafe.services.providers.provider_calls import Providers
from crashsafe.services.records.run_journal import RunJournal

SERVICE = "projector"  # its dead letters: `<ns>.dead.projector`
# Deliveries one worker handles at once (one pull batch); a second replica shares the rest.
CONCURRENCY = 64
# Audit records per request: a journal of thousands of events goes in bounded bodies.
AUDIT_CHUNK = 200
# Runs this replica saw end, so a later event of one (a late outcome) plans it again without a journal read for
# every event of every run; bounded, and only an optimisation: the reconciler finds what a replica forgot.
ENDED_MEMORY = 100_000
# Deliveries of a message whose handler raised a bug before it is dead-lettered (a receiver's outage is not a
# bug: that is the retry policy's, in the receipt).
HANDLER_ATTEMPTS = 5


class Projector:
    """The planner on every run journal and a worker per projection tool, sharing one broker connection."""

    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        registry: Registry,
        providers: Providers,
        logger: logging.Logger,
        *,
        concurrency: int = CONCURRENCY,
        audit_chunk: int = AUDIT_CHUNK,
        history_s: float = PLANNER_HISTORY_S,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.ns = settings.namespace
        self.registry = registry
        self.tools = registry.projections
        self.logger = logger
        self.records = projections_spec(self.ns, settings.stream_replicas)
        self.concurrency = concurrency
        self.history_s = history_s
        self._dead_letter = partial(dead_letter, broker, self.ns, SERVICE, logger)
        self.delivery = ProjectionDelivery(
            broker,
            self.ns,
            self.records,
            providers,
            logger,
            self._dead_letter,
            time_scale=settings.projection_time_scale,
            audit_chunk=audit_chunk,
        )
        # One bound per consumer: a receiver that hangs holds its own worker's slots, not the planner's or
        # another receiver's.
        self._loops: list[Deliveries] = []
        self._subscriptions: list[Subscription] = []
        self._ended: OrderedDict[str, None] = OrderedDict()

    async def start(self) -> None:
        """Check its streams (StreamMissing), declare its durables (ConsumerShapeChanged), prove its seams
        (SeamBroken), and only then take work."""
        kinds = (StreamKind.RUNS, StreamKind.PROJECTIONS, StreamKind.OPS, StreamKind.DEAD_LETTERS)
        await require(self.broker, [self.ns.stream(k) for k in kinds] + [self.records.stream])
        planner, workers = self._planner(), self._workers()
        await seam_checks.declare(self.broker, [planner, *workers.values()])
        await seam_checks.prove("projector", self.seams())
        for name, tool in sorted(self.tools.items()):
            self._subscriptions.append(await self._subscribe(workers[name], self.delivery.worker(tool)))
        self._subscriptions.append(await self._subscribe(planner, self._on_run_event))
        log(self.logger, logging.INFO, "projector ready", tools=sorted(self.tools))

    def ops_checks(self) -> dict[str, probes.Check]:
        """Readiness: NATS, its streams and the receipts bucket, and its seams."""
        kinds = (StreamKind.RUNS, StreamKind.PROJECTIONS, StreamKind.OPS, StreamKind.DEAD_LETTERS)
        return {
            **probes.basic_checks(self.broker, [self.ns.stream(k) for k in kinds], [self.records]),
            **self.seams(),
        }

    def seams(self) -> dict[str, probes.Check]:
        """Each tool's tasks, its operator events and dead letters land in the streams it expects; the planner's
        and every worker's durable are in their shape."""
        return {
            **seam_checks.route_checks(self.broker, projector_routes(self.ns, self.tools)),
            **seam_checks.consumer_checks(self.broker, [self._planner(), *self._workers().values()]),
        }

    def ops_samplers(self) -> list[probes.Sampler]:
        workers = self._workers()
        backlog = {tool: metrics.PROJECTION_BACKLOG.labels(tool) for tool in workers}

        async def sample_backlog() -> None:
            # A worker's num_pending: tasks planned and not yet handed to any delivery.
            for tool, spec in workers.items():
                pending = await self.broker.consumer_pending(spec.stream, spec.durable)
                if pending is not None:
                    backlog[tool].set(pending)

        lag = probes.lag_sampler(self.broker, lambda: [self._planner(), *workers.values()])
        return [sample_backlog, lag]

    def _planner(self) -> ConsumerSpec:
        return projector_planner_consumer(self.ns, self.settings.ack_wait_s, self.history_s)

    def _workers(self) -> dict[str, ConsumerSpec]:
        return {
            name: projection_consumer(self.ns, name, self.settings.ack_wait_s) for name in sorted(self.tools)
        }

    async def close(self) -> None:
        for subscription in self._subscriptions:
            await self.broker.unsubscribe(subscription)
        self._subscriptions.clear()
        for loop in self._loops:
            await loop.drain()

    async def _subscribe(self, spec: ConsumerSpec, handler: Callable[[Msg], Awaitable[None]]) -> Subscription:
        """Pull `spec` into its own bounded delivery loop, asking only for as many messages as it has room for.
        Every handler here settles its own message; a bug is given up after HANDLER_ATTEMPTS deliveries."""
        loop = Deliveries(
            self.broker,
            self.ns,
            SERVICE,
            self.logger,
            max_deliver=HANDLER_ATTEMPTS,
            ack_wait_s=self.settings.ack_wait_s,
            concurrency=self.concurrency,
        )
        self._loops.append(loop)
        return await self.broker.subscribe(spec, loop.dispatch(handler, settles_itself=True), room=loop.room)

    # Planning -----------------------------------------------------------------------------------------------

    async def _on_run_event(self, msg: Msg) -> None:
        # The run is the one whose subject it is (a literal token, by the consumer's filter), whatever the body
        # claims: a body naming another run must not make this event plan that one.
        run_id = self.ns.journal_run(msg.subject) or ""
        try:
            event_type, _ = envelope_of(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._dead_letter(msg, f"a run event that does not decode: {exc}", ErrorCode.POISON_MESSAGE)
            return
        after_end = bool(msg.headers and msg.headers.get(Header.RUN_ENDED))
        which = trigger(event_type, run_id in self._ended, after_end)
        if which is None:
            await msg.ack()
            return
        try:
            planned = await self.plan_run(
                run_id, which, context_from(msg.headers), at_least=msg.metadata.sequence.stream
            )
        except Undeliverable as exc:
            await self._dead_letter(msg, exc.message, exc.code, {"run_id": run_id[:200]})
            return
        if planned:
            crash_point("projector.after_plan_publish")
        await msg.ack()

    async def plan_run(
        self, run_id: str, which: Trigger = Trigger.ALL, ctx: Context | None = None, at_least: int = 0
    ) -> int:
        """Read the run's journal, fold it, publish the tasks it calls for (`Nats-Msg-Id` = the task's key: a
        second plan within the duplicate window is dropped by the stream, after it by the receipt). Returns how
        many were published; raises Undeliverable for a journal that does not fold. `ctx`: the trace of the run
        event that triggered the plan, carried on each task, so its delivery joins the run's trace. `at_least`: that
        event's stream sequence; a journal read that ends before it (a replica behind answered) is tried again."""
        if not await self._may_project(run_id):
            return 0
        stored = await RunJournal(self.broker, self.ns).stored(run_id)
        if at_least and (not stored or stored[-1].seq < at_least):
            raise BrokerUnavailable(
                f"run {run_id}'s journal read ended before the event that asked for its plan ({at_least})",
                subject=self.ns.run_events(run_id),
            )
        try:
            state = replay(decode_event(m.data) for m in stored)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise Undeliverable(f"run {run_id}'s journal does not fold: {exc}", key=run_id) from None
        if state is None:
            return 0
        if state.run_id != run_id:
            raise Undeliverable(
                f"the journal on run {run_id}'s subject opens run {state.run_id[:64]!r}", key=run_id
            )
        if state.outcome is not None:
            self._remember_ended(run_id)
        agent: Projecting = self.registry.agents.get(state.agent) or RETIRED
        # The agent's `projections` hook runs under the process's time limit, as in the runtime: one that blocks is
        # this run's undeliverable plan, never a planner stalled for every tenant.
        limit = self.delivery.providers.code_limit or HookLimit(0.0)
        try:
            tasks = limit.run(plan, state, len(stored), agent, self.tools, datetime.now(UTC))
        except HookOverran as overran:
            raise Undeliverable(f"run {run_id}'s agent's projections {overran}", key=run_id) from None
        except Exception as exc:  # noqa: BLE001 -- a journal no rule expected (a hostile event) must not wedge the planner
            raise Undeliverable(
                f"run {run_id}'s projections cannot be planned: {exc!r}", key=run_id
            ) from None
        if which is Trigger.AUDIT:
            tasks = [t for t in tasks if t.tool == AUDIT_TRAIL_TOOL]
        headers = headers_for(ctx) if ctx is not None else None
        for task in tasks:
            await self.broker.publish(
                self.ns.projection(task.tool, run_id),
                task_encoder.encode(task),
                msg_id=task.key,
                headers=headers,
            )
        if which is Trigger.ALL and state.terminal:
            await self._record_plan(run_id, stored[-1].seq, len(stored), tasks)
        if tasks:
            log(self.logger, logging.DEBUG, "planned", run_id=run_id, keys=[t.key for t in tasks])
        return len(tasks)

    async def _record_plan(
        self, run_id: str, last_seq: int, events: int, tasks: list[ProjectionTask]
    ) -> None:
        """The plan beside the receipts, after its tasks (a plan on record names only tasks in the stream, or
        delivered). Only a saving for the reconciler, which reads the journal without it: a failed write is
        logged, never a reason to plan the run again."""
        planned = ProjectionPlan(
            run_id=run_id,
            events=events,
            last_seq=last_seq,
            planned_at=datetime.now(UTC),
            tasks=tuple(PlannedProjection(tool=t.tool, key=t.key) for t in tasks),
        )
        try:
            await self.broker.kv_write(
                self.records,
                self.ns.projection_plan_key(run_id),
                task_encoder.encode(planned),
                revision=None,
                ttl_s=int(PLANNER_HISTORY_S),
            )
        except CrashsafeError as exc:
            log(self.logger, logging.WARNING, "plan not recorded", run_id=run_id, error=exc.message)

    async def _may_project(self, run_id: str) -> bool:
        """Whether the run's journal can call for anything: always with an audit trail; else only if its agent
        declares projection tools. Asked of the journal's first event (one read), so a run of an agent that
        projects nothing costs no read of its whole journal. A first event that is not a run's start is left to
        the whole read, which says what is wrong with it."""
        if AUDIT_TRAIL_TOOL in self.tools:
            return True
        first = await self.broker.first_on_subject(
            self.ns.stream(StreamKind.RUNS), self.ns.run_events(run_id)
        )
        if first is None:
            return False
        try:
            started = decode_event(first.data)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            return True
        if not isinstance(started, RunStarted):
            return True
        agent = self.registry.agents.get(started.agent)
        return agent is not None and bool(agent.projection_tools)

    def _remember_ended(self, run_id: str) -> None:
        self._ended[run_id] = None
        self._ended.move_to_end(run_id)
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
