"""The gateway's HTTP shell (Litestar on uvicorn): accepts guest events, answers run status and journals."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from opentelemetry.context import Context

from contracts.errors import CrashsafeError, RunNotFound, SubjectFull, UnknownAgent
from contracts.inbound import InboundEvent, InboundMessage, inbound_decoder, inbound_encoder
from contracts.keys import is_run_id
from contracts.run_events import JournalEvent, RunStarted, UnknownEvent, decode_event
from contracts.streams import stream_specs
from contracts.subjects import Header, Namespace, StreamKind
from services.gateway.core import Admission, admit, conflict, status_for
from services.platform.crashpoints import crash_point
from services.platform.jetstream import Broker
from services.platform.provisioning import all_streams, require
from services.platform.journal import RunJournal
from services.platform.logs import log
from services.platform.settings import Settings
from services.platform.tracing import context_from, headers_for, trace_id_of
from services.registry import Registry
from services.platform.asks import reconcile_run
from services.runtime.core.fold import replay, summarize

logger = logging.getLogger("crashsafe.gateway")


def _error(exc: CrashsafeError) -> Response[Any]:
    body = {"error": {"code": exc.code.value, "message": exc.message, "details": exc.details()}}
    return Response(content=body, status_code=status_for(exc))


async def _accept(state: State, request: Request[Any, Any, Any]) -> Response[Any]:
    broker: Broker = state.broker
    settings: Settings = state.settings
    ns = settings.namespace
    registry: Registry = state.registry
    agent = request.query_params.get("agent", registry.default_agent)
    admission = admit(await request.body(), request.headers.get(Header.IDEMPOTENCY_KEY), agent)
    if agent not in registry.agents:
        raise UnknownAgent(agent, known=sorted(registry.agents))
    ctx = context_from(dict(request.headers))
    # The run journal is the lasting guard: a run that exists answers from its run.started, publishing nothing.
    duplicate = await _matches_journal(broker, ns, admission)
    if not duplicate:
        event = InboundEvent(
            key=admission.key,
            run_id=admission.run_id,
            input_hash=admission.input_hash,
            message=InboundMessage.of(admission.message),
            agent=agent,
            received_at=datetime.now(UTC),
        )
        duplicate = await _publish_once(broker, ns, event, ctx)
    crash_point("gateway.after_publish")
    log(
        logger,
        logging.DEBUG,
        "accepted",
        run_id=admission.run_id,
        key=admission.key,
        duplicate=duplicate,
        trace_id=trace_id_of(ctx),
    )
    return Response(content={"run_id": admission.run_id, "duplicate": duplicate}, status_code=202)


async def _matches_journal(broker: Broker, ns: Namespace, admission: Admission) -> bool:
    """True if the run already exists with this input; a conflict if it exists with another; False if new."""
    first = await broker.first_on_subject(ns.stream(StreamKind.RUNS), ns.run_events(admission.run_id))
    if first is None:
        return False
    started = decode_event(first.data)
    if not isinstance(started, RunStarted) or started.input_hash != admission.input_hash:
        raise conflict(admission.key, admission.run_id)
    return True


async def _publish_once(broker: Broker, ns: Namespace, event: InboundEvent, ctx: Context) -> bool:
    """Publish the run's one inbound message; True if it was already there (the same input), else a conflict."""
    subject = ns.inbound(event.run_id)
    payload = inbound_encoder.encode(event)
    try:
        published = await broker.publish(subject, payload, msg_id=event.run_id, headers=headers_for(ctx))
        if not published.duplicate:
            return False
    except SubjectFull:
        pass  # the per-run subject already holds this run's first message: the guard past the duplicate window
    original = await broker.last_on_subject(ns.stream(StreamKind.INBOUND), subject)
    if original is None:
        # Inside the duplicate window but the message is gone (purged or aged out, and no run yet): the id alone
        # blocks it, so publish under an id bound to this input; the runtime's run.started at sequence 0 still
        # makes one run of it.
        await broker.publish(
            subject, payload, msg_id=f"{event.run_id}:{event.input_hash}", headers=headers_for(ctx)
        )
        return False
    if inbound_decoder.decode(original.data).input_hash != event.input_hash:
        raise conflict(event.key, event.run_id)
    return True


@post("/v1/events")
async def post_event(state: State, request: Request[Any, Any, Any]) -> Response[Any]:
    try:
        return await _accept(state, request)
    except CrashsafeError as exc:
        return _error(exc)


def _not_a_run_id(run_id: str) -> RunNotFound:
    return RunNotFound(
        f"{run_id!r} is not a run id (run_ + 24 hex digits); check the id returned by POST /v1/events",
        run_id=run_id[:64],
    )


def _as_json(event: JournalEvent) -> Any:
    """An event as JSON: one this version does not know is shown as it was journaled."""
    return msgspec.json.decode(event.data) if isinstance(event, UnknownEvent) else msgspec.to_builtins(event)


async def _journal(state: State, run_id: str) -> list[tuple[int, JournalEvent]]:
    if not is_run_id(run_id):
        raise _not_a_run_id(run_id)
    journal = RunJournal(state.broker, state.settings.namespace)
    events = await journal.read_with_seqs(run_id)
    if not events:
        raise RunNotFound(run_id=run_id)
    return events


@get("/v1/runs/{run_id:str}")
async def get_run(state: State, run_id: str) -> Response[Any]:
    try:
        events = await _journal(state, run_id)
    except CrashsafeError as exc:
        return _error(exc)
    run = replay(e for _, e in events)
    assert run is not None
    return Response(content=msgspec.to_builtins(summarize(run)) | {"last_seq": events[-1][0]})


@get("/v1/runs/{run_id:str}/events")
async def get_run_events(state: State, run_id: str) -> Response[Any]:
    try:
        events = await _journal(state, run_id)
    except CrashsafeError as exc:
        return _error(exc)
    return Response(content={"run_id": run_id, "events": [{"seq": seq, **_as_json(e)} for seq, e in events]})


@post("/v1/runs/{run_id:str}/reconcile", status_code=202)
async def post_reconcile(state: State, run_id: str) -> Response[Any]:
    """For an operator after an incident: resolve the run's open actions by key, then let it continue."""
    try:
        if not is_run_id(run_id):
            raise _not_a_run_id(run_id)
        done = await reconcile_run(state.broker, state.settings, run_id, by="operator:http")
    except CrashsafeError as exc:
        return _error(exc)
    return Response(
        content={"run_id": done.run_id, "status": done.status, "asked": done.asked}, status_code=202
    )


@get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz")
async def readyz(state: State) -> Response[Any]:
    broker: Broker = state.broker
    ns = state.settings.namespace
    missing = [] if broker.connected else ["nats"]
    if broker.connected:
        for spec in stream_specs(ns):
            try:
                if not await broker.stream_exists(spec.name):
                    missing.append(spec.name)
            except CrashsafeError:
                missing.append(spec.name)
    return Response(
        content={"ready": not missing, "missing": missing}, status_code=200 if not missing else 503
    )


def build_app(settings: Settings, registry: Registry) -> Litestar:
    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        broker = await Broker.connect(
            settings.nats_url, f"gateway-{settings.worker_id}", access=settings.nats_access
        )
        await require(broker, all_streams(settings.namespace))
        app.state.broker = broker
        app.state.settings = settings
        app.state.registry = registry
        try:
            yield
        finally:
            await broker.close()

    # logging_config=None keeps our JSON log handler (Litestar would install its own and drop run ids).
    return Litestar(
        route_handlers=[post_event, get_run, get_run_events, post_reconcile, healthz, readyz],
        lifespan=[lifespan],
        debug=False,
        logging_config=None,
    )
