"""The gateway's HTTP shell (Litestar on uvicorn): accepts guest events, answers run status and journals."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from litestar import Litestar, Request, Response, Router, get, post
from litestar.datastructures import State
from opentelemetry.context import Context

from crashsafe.contracts.active import entry_deadline
from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import (
    AgentNotAllowed,
    CrashsafeError,
    SubjectFull,
    TooManyActiveRuns,
    UnknownAgent,
)
from crashsafe.contracts.headers import Header
from crashsafe.contracts.inbound import InboundEvent, InboundMessage, inbound_decoder, inbound_encoder
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.run_events import RunStarted, decode_event
from crashsafe.contracts.streams import active_spec, approvals_spec, clients_spec, sessions_spec
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.contracts.synthetic_turn import SYNTHETIC_AGENT, SYNTHETIC_TENANT
from crashsafe.domain.access import (
    Client,
    authenticate,
    parse_bearer,
    require_agent,
)
from crashsafe.domain.admission import Admission, admit, conflict
from crashsafe.domain.intake import addressed
from crashsafe.domain.registry import Registry
from crashsafe.domain.session_lanes import Owner, Refuse, given_back, lane_move
from crashsafe.services.gateway import openapi as api
from crashsafe.services.gateway import ops
from crashsafe.services.gateway.approval_routes import get_approval, list_approvals, post_approval
from crashsafe.services.gateway.door import Door, error_response, read_body
from crashsafe.services.gateway.linger import linger_on_unread_bodies
from crashsafe.services.gateway.run_routes import get_run, get_run_events, post_reconcile
from crashsafe.services.gateway.turns import TurnCaps, published_turn
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import all_streams
from crashsafe.services.platform.provisioning import require as require_streams
from crashsafe.services.platform.run_archive import open_archive
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import (
    context_from,
    current,
    has_trace,
    headers_for,
    trace_id_of,
    trace_requests,
)
from crashsafe.services.platform.version_beats import VersionBeats
from crashsafe.services.records.active_runs import Caps, claim
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lane_records import SessionRecords
from crashsafe.services.records.turn_holders import turn_holder

logger = logging.getLogger("crashsafe.gateway")


async def _accept(state: State, request: Request[Any, Any, Any]) -> Response[Any]:
    broker: Broker = state.broker
    settings: Settings = state.settings
    door: Door = state.door
    ns = settings.namespace
    registry: Registry = state.registry
    client = await door.client(request, Scope.EVENTS_WRITE)
    agent = request.query_params.get("agent", registry.default_agent)
    admission = admit(await read_body(request), client.tenant, agent)
    if agent not in registry.agents:
        raise UnknownAgent(agent, known=sorted(registry.agents))
    may_start(client, agent, registry.default_agent)
    message = admission.message
    door.limit(door.guests, f"{client.tenant}/{message.guest_id}", "guest")
    # The request's `gateway.request` span (trace_requests), whose context the inbound message carries on.
    ctx = current() if has_trace(current()) else context_from(dict(request.headers))
    # The run journal is the lasting guard: a run that exists answers from its run.started, publishing nothing.
    duplicate = await _matches_journal(broker, ns, admission)
    turn_of = ""
    if not duplicate:
        earlier = await broker.last_on_subject(ns.stream(StreamKind.INBOUND), ns.inbound(admission.run_id))
        if earlier is not None:
            # Published before (a retry): answer as the first time did, the turn it was, claiming nothing.
            first = inbound_decoder.decode(earlier.data)
            if first.input_hash != admission.input_hash:
                raise conflict(admission.key, admission.run_id)
            duplicate, turn_of = True, await _holder(state, client.tenant, admission, first.turn_of)
    if not duplicate:
        received_at = datetime.now(UTC)
        sessions: SessionRecords = state.sessions
        # The session lane: a free session is claimed for this run (compare-and-set); a session whose run is
        # active gets this message as that run's next turn (the runtime checks the lane again when it arrives).
        lane = await sessions.claim_lane(
            client.tenant, message.session_id, admission.run_id, message.guest_id
        )
        turn_of = "" if lane.run_id == admission.run_id else lane.run_id
        if turn_of:
            owners_guest, owners_agent = await _owner(broker, ns, lane, registry.default_agent)
            move = lane_move(
                lane,
                run_id=admission.run_id,
                guest_id=message.guest_id,
                session_id=message.session_id,
                owner=Owner(guest_id=owners_guest),
            )
            if isinstance(move, Refuse):
                raise move.error
            if owners_agent is not None:
                # The message speaks to the owner's agent (its model, its approval): as if it started that agent.
                may_start(client, owners_agent, registry.default_agent)
        if not turn_of:
            try:
                await claim(
                    broker,
                    ns,
                    state.caps,
                    tenant=client.tenant,
                    guest_id=message.guest_id,
                    run_id=admission.run_id,
                    until=entry_deadline(received_at),
                )
            except TooManyActiveRuns:
                await _release_lane(sessions, client.tenant, message.session_id, admission.run_id)
                raise
        event = InboundEvent(
            key=admission.key,
            run_id=admission.run_id,
            input_hash=admission.input_hash,
            message=InboundMessage.of(message),
            agent=agent,
            received_at=received_at,
            tenant=client.tenant,
            turn_of=turn_of,
            sent_by=client.key_id,
        )
        if turn_of:
            # The run's caps: its turns (409) and its unread messages (429), counted before anything is published
            # and given back if the publish fails (the client's retry is then counted once).
            duplicate = await published_turn(
                broker,
                ns,
                sessions,
                state.turn_caps,
                client.tenant,
                message.session_id,
                turn_of,
                lambda: _publish_once(broker, ns, event, ctx),
            )
        else:
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
    body: dict[str, Any] = {"run_id": turn_of or admission.run_id, "duplicate": duplicate}
    if turn_of:
        body |= {"turn": True, "event_run_id": admission.run_id}
    return Response(content=body, status_code=202)


def may_start(client: Client, agent: str, default_agent: str) -> None:
    """A key starts only the agents it names, and writes only into runs of those agents (a turn is a message to
    the run's agent: its model, its approval)."""
    if client.tenant == SYNTHETIC_TENANT:
        if agent != SYNTHETIC_AGENT:
            # The synthetic turn's tenant: its key sits on the reconciler's pod; leaked, it may still only search.
            raise AgentNotAllowed(
                agent=agent, allowed=SYNTHETIC_AGENT, tenant=client.tenant, key_id=client.key_id
            )
    else:
        require_agent(client, agent, default_agent)


async def _owner(
    broker: Broker, ns: Namespace, lane: SessionLane, default_agent: str
) -> tuple[str | None, str | None]:
    """The guest and the agent of the session's run, for a message that would be its next turn: a turn joins only
    a run of the same guest (another guest's message could answer its approval) and of an agent the key may start.
    Read before the 202 from the owner's journal, else the owner's own message (the lane's claimer wrote the
    owner's guest too): a turn accepted here is never the runtime's to refuse. (A lane that changes hands after
    this is the runtime's: a turn of another guest's run becomes its own run there.) None: not known yet."""
    owner = lane.run_id
    first = await RunJournal(broker, ns).first(owner)  # an owner archived since: its archive's run.started
    started = decode_event(first.data) if first is not None else None
    if isinstance(started, RunStarted):
        return started.guest_id, started.agent
    sent = await broker.last_on_subject(ns.stream(StreamKind.INBOUND), ns.inbound(owner))
    if sent is not None:
        inbound = addressed(inbound_decoder.decode(sent.data), default_agent)
        return lane.guest_id or inbound.message.guest_id, inbound.agent
    return lane.guest_id or None, None


async def _holder(state: State, tenant: str, admission: Admission, hinted: str) -> str:
    """The run that took a retried message as its turn, for the answer: the runtime decides where a message goes
    when it takes it, which may not be where the first answer said (the lane changed hands meanwhile). The first
    answer's run (`hinted`, "" if it was to start its own) while no run has taken it yet."""
    sessions: SessionRecords = state.sessions
    marked = await sessions.turn_mark(tenant, admission.run_id)
    lane, _ = await sessions.get(tenant, admission.message.session_id)
    journal = RunJournal(state.broker, state.settings.namespace)
    found = await turn_holder(journal, lane, admission.message.event_id, (marked, hinted), admission.run_id)
    return found[0] if found is not None else hinted


async def _release_lane(sessions: SessionRecords, tenant: str, session_id: str, run_id: str) -> None:
    """Give back a lane claimed for a run that was then refused (the caps), if it is still this run's."""

    await sessions.change(tenant, session_id, lambda lane: given_back(lane, run_id))


async def _matches_journal(broker: Broker, ns: Namespace, admission: Admission) -> bool:
    """True if the run already exists with this input; a conflict if it exists with another; False if new. A run
    archived and purged is asked of the archive (one lookup per new run): after INBOUND's 7 days it is all that
    remembers the event (the stream is read first, and a run is archived before it is purged: no gap between)."""
    first = await RunJournal(broker, ns).first(admission.run_id)
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


# The body limit is ours (_read_body, before the body is read), not Litestar's 10 MB default and untyped 413.
@post(
    "/v1/events",
    request_max_body_size=None,
    status_code=202,
    summary="Accept a guest event",
    security=api.SECURITY,
    responses=api.ok(api.Accepted, "accepted, durable (or the same event again: `duplicate`)", 202)
    | api.errors(400, 401, 403, 409, 413, 422, 429, 503),
)
async def post_event(state: State, request: Request[Any, Any, Any]) -> Response[Any]:
    """The event is journaled before the answer: 202 means it will run. The run id is derived from the tenant
    and `event_id`, so a retry of the same event answers the same run (`duplicate: true`)."""
    try:
        return await _accept(state, request)
    except CrashsafeError as exc:
        return error_response(exc)


@get("/healthz", summary="Liveness", responses=api.ok(api.Health, "the process answers"))
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get(
    "/readyz",
    summary="Readiness",
    responses=api.ok(api.Readiness, "NATS and every stream reachable")
    | {503: api.ok(api.Readiness, "not ready: what is missing")[200]},
)
async def readyz(state: State) -> Response[Any]:
    # NATS, its streams and buckets, each check named with its reason (services/gateway/ops.py).
    return await ops.readiness(state)


async def _schema_for_clients_only(request: Request[Any, Any, Any]) -> Response[Any] | None:
    """The API's description is for holders of a key (any scope): to anyone else /schema is not there at all,
    the very 404 it answered before it was served."""
    path = request.url.path
    if path != api.SCHEMA_PATH and not path.startswith(api.SCHEMA_PATH + "/"):
        return None
    door: Door = request.app.state.door
    try:
        key_id, secret = parse_bearer(request.headers.get(Header.AUTHORIZATION))
        authenticate(key_id, secret, await door.keys.get(key_id))
    except CrashsafeError:
        return Response(content={"error": {"code": "not_found", "message": "no such route"}}, status_code=404)
    return None


def build_app(settings: Settings, registry: Registry, mounted: Sequence[Router] = ()) -> Litestar:
    """The API, with the routers the process's composition root mounts beside it (the console: bootstrap.py),
    each lent the app's state (its broker, its `Door`, its settings and registry)."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        broker = await Broker.connect(
            settings.nats_url,
            f"gateway-{settings.worker_id}",
            access=settings.nats_access,
            retention=settings.retention,
            archive=open_archive(settings.archive_dir, settings.namespace.name),
        )
        ns = settings.namespace
        await require_streams(
            broker,
            [
                *all_streams(ns),
                clients_spec(ns).stream,
                active_spec(ns).stream,
                approvals_spec(ns).stream,
                sessions_spec(ns).stream,
            ],
        )
        keys = ClientKeys(broker, ns, settings.stream_replicas)
        app.state.door = Door(keys, settings)
        app.state.caps = Caps(settings.active_runs_per_guest)
        app.state.turn_caps = TurnCaps(settings.turns_per_run, settings.run_inbox)
        app.state.broker = broker
        app.state.sessions = SessionRecords(broker, ns)
        app.state.settings = settings
        app.state.registry = registry
        # The logger `configure("gateway")` named (bootstrap.py): the line says which release serves.
        beats = VersionBeats(broker, ns, Role.GATEWAY, settings.worker_id, logging.getLogger("gateway"))
        beats.start()
        try:
            yield
        finally:
            await beats.stop()
            await broker.close()

    # logging_config=None keeps our JSON log handler (Litestar would install its own and drop run ids).
    return Litestar(
        route_handlers=[
            post_event,
            get_run,
            get_run_events,
            post_reconcile,
            list_approvals,
            get_approval,
            post_approval,
            healthz,
            readyz,
            *mounted,
            ops.metrics_endpoint,
        ],
        # Outermost first: an answer given before its body was read lingers for that body (services/gateway/
        # linger.py); the request's span is open while it is counted and handled.
        middleware=[linger_on_unread_bodies, trace_requests, ops.count_requests],
        lifespan=[lifespan],
        before_request=_schema_for_clients_only,
        debug=False,
        logging_config=None,
        # Only the JSON document at /schema/openapi.json (docs/openapi.json), to key holders; no HTML viewers.
        openapi_config=api.config(),
    )
