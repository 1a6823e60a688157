"""Readiness over the seams a service works through on the live broker: every subject it writes lands in the
stream it expects (that stream's subjects as the server holds them), every durable it reads is there in the shape
it declares.

A service's start waits on them (`start_when_able`): one whose seams do not work takes no work and stays unready,
so a rollout of a release the broker cannot serve stops at its first new pod instead of replacing the old ones.
Nothing is cached: each probe asks again, so an operator's later change shows at the next one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from crashsafe.contracts.consumer_shapes import compare_consumer
from crashsafe.contracts.errors import ConsumerShapeChanged, SeamBroken
from crashsafe.contracts.stream_routes import Route
from crashsafe.contracts.streams import ConsumerSpec
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.probes import Check, OpsServer, run_checks

STARTED = "started"  # the check a service not yet started fails, with why
# How often a service that cannot start yet tries again: a seam an operator fixes is taken up within this.
RETRY_S = 5.0
START_CHECK_TIMEOUT_S = 5.0


def stream_takes(broker: Broker, route: Route, subjects_of: SubjectsOf | None = None) -> Check:
    """A publish to `route.subject` lands in `route.stream`; else what that stream takes instead. Read from the
    stream's own info, which every role of every release may ask for: JetStream's lookup by subject
    (STREAM.NAMES) would need a permission a broker still configured for the previous release does not grant,
    and would keep this release unready beside it for no fault of the seam."""
    read = subjects_of or SubjectsOf(broker)

    async def check() -> str | None:
        subjects = await read(route.stream)
        if subjects is None:
            return f"no stream takes {route.subject}: stream {route.stream} does not exist"
        if route.taken_by(subjects):
            return None
        return (
            f"no stream takes {route.subject}: stream {route.stream} takes only {', '.join(subjects)};"
            " run `crashsafe infra apply` with this release"
        )

    return check


class SubjectsOf:
    """A stream's subjects as the server holds them, read once for every route of one probe: a runtime proves a
    dozen subjects on five streams, and a dozen STREAM.INFO requests at once on a loaded broker outlast a probe's
    budget. A read older than `fresh_s` is made again, so nothing stale outlives a probe."""

    def __init__(self, broker: Broker, fresh_s: float = 0.25) -> None:
        self.broker = broker
        self.fresh_s = fresh_s
        self._reads: dict[str, tuple[float, asyncio.Task[list[str] | None]]] = {}

    async def __call__(self, stream: str) -> list[str] | None:
        now = time.monotonic()
        held = self._reads.get(stream)
        if (
            held is None
            or now - held[0] > self.fresh_s
            or (held[1].done() and (held[1].cancelled() or held[1].exception()))
        ):
            held = (now, asyncio.ensure_future(self.broker.stream_subjects(stream)))
            self._reads[stream] = held
        return await asyncio.shield(held[1])


def route_checks(broker: Broker, routes: Iterable[Route]) -> dict[str, Check]:
    subjects_of = SubjectsOf(broker)
    return {f"subject:{route.subject}": stream_takes(broker, route, subjects_of) for route in routes}


def consumer_in_shape(broker: Broker, spec: ConsumerSpec, *, required: bool = True) -> Check:
    """The durable is there in the shape `spec` declares (its tuning aside: the server's is used). Not `required`:
    or not there at all (one the service makes when it needs it, as an executor does a partition's)."""

    async def check() -> str | None:
        found = await broker.consumer_shape(spec.stream, spec.durable)
        if found is None:
            return f"consumer {spec.durable} on {spec.stream} does not exist" if required else None
        shape = compare_consumer(spec, found).shape
        if not shape:
            return None
        return f"consumer {spec.durable} on {spec.stream} is of another shape: " + "; ".join(map(str, shape))

    return check


def consumer_checks(
    broker: Broker, specs: Iterable[ConsumerSpec], *, required: bool = True
) -> dict[str, Check]:
    return {f"consumer:{spec.durable}": consumer_in_shape(broker, spec, required=required) for spec in specs}


async def declare(broker: Broker, specs: Iterable[ConsumerSpec]) -> None:
    """Make each durable not made yet; then ConsumerShapeChanged for the first of another shape, if any (each one
    that could be made is, so readiness names only what is wrong)."""
    refused: list[ConsumerShapeChanged] = []
    for spec in specs:
        try:
            await broker.ensure_consumer(spec)
        except ConsumerShapeChanged as exc:
            refused.append(exc)
    if refused:
        raise refused[0]


async def prove(service: str, checks: Mapping[str, Check], timeout_s: float = START_CHECK_TIMEOUT_S) -> None:
    """SeamBroken, naming each failed check and why, unless every one passes now: a service's start, before it
    takes any work. Each check may take `timeout_s`: a start on a loaded broker waits for its answer, where a
    probe (Kubernetes' 1 s) may not."""
    readiness = await run_checks(checks, timeout_s)
    if not readiness.ready:
        raise SeamBroken(service=service, checks={name: readiness.checks[name] for name in readiness.failed})


async def start_when_able(
    ops: OpsServer,
    service: str,
    start: Callable[[], Awaitable[None]],
    checks: Callable[[], Mapping[str, Check]],
    stop: asyncio.Event,
    logger: logging.Logger,
    retry_s: float = RETRY_S,
) -> bool:
    """Start the service once it can do its job. `start` raises SeamBroken or ConsumerShapeChanged before it takes
    any work; meanwhile /readyz answers 503 with the service's `checks` and why it has not started (each new
    reason logged once), and it tries again every `retry_s`. True once started; False if stopped first."""
    said: str | None = None
    while not stop.is_set():
        try:
            await start()
            return True
        except (SeamBroken, ConsumerShapeChanged) as exc:
            why = exc.message
        ops.serve(_waiting(checks, retry_s))
        if why != said:
            log(logger, logging.WARNING, "not starting yet: a seam does not work", service=service, why=why)
            said = why
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), retry_s)
    return False


def _waiting(checks: Callable[[], Mapping[str, Check]], retry_s: float) -> Callable[[], Mapping[str, Check]]:
    async def not_started() -> str | None:
        return f"not started: it takes no work until every check passes (tried again every {retry_s:g}s)"

    return lambda: {**checks(), STARTED: not_started}
