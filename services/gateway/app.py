"""The gateway's HTTP shell (Litestar on uvicorn): accepts guest events, answers run status and journals."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, Router, get, post
from litestar.datastructures import State
from opentelemetry.context import Context

from crashsafe.contracts.active import entry_deadline
from crashsafe.contracts.approvals import ApprovalDecisionBody, ApprovalRecord, ApprovalStatus
from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import (
    AgentNotAllowed,
    BodyTooLarge,
    CrashsafeError,
    InvalidRequest,
    RateLimited,
    RunNotFound,
    SubjectFull,
    TooManyActiveRuns,
    Unauthenticated,
    UnknownAgent,
    UnprocessableBody,
)
from crashsafe.contracts.inbound import (
    MAX_BODY_BYTES,
    InboundEvent,
    InboundMessage,
    inbound_decoder,
    inbound_encoder,
)
from crashsafe.contracts.keys import is_run_id
from crashsafe.contracts.memory import SessionLane
from crashsafe.contracts.run_events import JournalEvent, RunStarted, UnknownEvent, decode_event
from crashsafe.contracts.streams import active_spec, approvals_spec, clients_spec, sessions_spec
from crashsafe.contracts.subjects import Header, Namespace, StreamKind
from crashsafe.contracts.synthetic import SYNTHETIC_AGENT, SYNTHETIC_TENANT
from crashsafe.domain import approval_flow as approval_rules
from crashsafe.domain.access import (
    Client,
    authenticate,
    parse_bearer,
    require,
    require_agent,
    require_approver,
)
from crashsafe.domain.admission import Admission, admit, conflict, status_for, too_large
from crashsafe.domain.fold import replay, summarize
from crashsafe.domain.registry import Registry
from crashsafe.domain.session_lanes import Owner, Refuse, given_back, lane_move
from crashsafe.domain.token_buckets import Rate, TokenBuckets
from crashsafe.services.gateway import openapi as api
from crashsafe.services.gateway import ops
from crashsafe.services.gateway.linger import linger_on_unread_bodies
from crashsafe.services.gateway.turns import TurnCaps, take_turn
from crashsafe.services.platform.crashpoints import crash_point
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.provisioning import all_streams
from crashsafe.services.platform.provisioning import require as require_streams
from crashsafe.services.platform.settings import Settings
from crashsafe.services.platform.tracing import (
    context_from,
    current,
    has_trace,
    headers_for,
    trace_id_of,
    trace_requests,
)
from crashsafe.services.records import approval_records
from crashsafe.services.records.active_runs import Caps, claim
from crashsafe.services.records.approval_records import ApprovalRecords
from crashsafe.services.records.client_keys import ClientKeys
from crashsafe.services.records.run_asks import reconcile_run
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lanes import SessionRecords

logger = logging.getLogger("crashsafe.gateway")


def _error(exc: CrashsafeError) -> Response[Any]:
    body = {"error": {"code": exc.code.value, "message": exc.message, "details": exc.details()}}
    headers = (
        {Header.RETRY_AFTER.value: str(max(1, math.ceil(exc.retry_after_s)))}
        if isinstance(exc, RateLimited)
        else None
    )
    return Response(content=body, status_code=status_for(exc), headers=headers)


class Door:
    """What every request passes: its key checked against the stored record, its scope, and the rates."""

    def __init__(self, keys: ClientKeys, settings: Settings) -> None:
        self.keys = keys
        self.clients = TokenBuckets(Rate.of(settings.rate_per_client))
        self.guests = TokenBuckets(Rate.of(settings.rate_per_guest))
        per_run = settings.reconcile_per_minute / 60
        self.reconciles = TokenBuckets(Rate(per_run, max(settings.reconcile_per_minute / 2, 1.0)))

    async def client(self, request: Request[Any, Any, Any], scope: Scope) -> Client:
        try:
            key_id, secret = parse_bearer(request.headers.get(Header.AUTHORIZATION))
            # A direct get on every request: a revocation reaches every replica with its next request.
            client = authenticate(key_id, secret, await self.keys.get(key_id))
        except Unauthenticated as exc:
            log(logger, logging.INFO, "refused", reason=exc.reason, path=request.url.path)
            raise
        require(client, scope)
        self.limit(self.clients, client.key_id, "client")
        return client

    @staticmethod
    def limit(buckets: TokenBuckets, key: str, limit: str) -> None:
        wait = buckets.take(key, time.monotonic())
        if wait:
            raise RateLimited(limit=limit, retry_after_s=wait)


async def _read_body(request: Request[Any, Any, Any]) -> bytes:
    """The body, refused before it is read if its announced length is too large, and as soon as more than the
    limit has arrived if it is sent without one (chunked): a 10 MB body is never taken in."""
    refused = too_large(request.headers.get(Header.CONTENT_LENGTH))
    if refused is not None:
        raise refused
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(size=size, limit=MAX_BODY_BYTES)
        chunks.append(chunk)
    return b"".join(chunks)


async def _accept(state: State, request: Request[Any, Any, Any]) -> Response[Any]:
    broker: Broker = state.broker
    settings: Settings = state.settings
    door: Door = state.door
    ns = settings.namespace
    registry: Registry = state.registry
    client = await door.client(request, Scope.EVENTS_WRITE)
    agent = request.query_params.get("agent", registry.default_agent)
    admission = admit(await _read_body(request), client.tenant, agent)
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
            duplicate, turn_of = True, first.turn_of
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
            owners_guest, owners_agent = await _owner(broker, ns, lane)
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
            # The run's caps: its turns (409) and its unread messages (429); counted before anything is published.
            await take_turn(broker, ns, sessions, state.turn_caps, client.tenant, message.session_id, turn_of)
        if not turn_of:
            try:
                await claim(
                    broker,
                    ns,
                    state.caps,
                    tenant=client.tenant,
                    guest_id=message.guest_id,
                    session_id=message.session_id,
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


async def _owner(broker: Broker, ns: Namespace, lane: SessionLane) -> tuple[str | None, str | None]:
    """The guest and the agent of the session's run, for a message that would be its next turn: a turn joins only
    a run of the same guest (another guest's message could answer its approval) and of an agent the key may start.
    Read before the 202 from the owner's journal, else the owner's own message (the lane's claimer wrote the
    owner's guest too): a turn accepted here is never the runtime's to refuse. (A lane that changes hands after
    this is the runtime's: a turn of another guest's run becomes its own run there.) None: not known yet."""
    owner = lane.run_id
    first = await broker.first_on_subject(ns.stream(StreamKind.RUNS), ns.run_events(owner))
    started = decode_event(first.data) if first is not None else None
    if isinstance(started, RunStarted):
        return started.guest_id, started.agent
    sent = await broker.last_on_subject(ns.stream(StreamKind.INBOUND), ns.inbound(owner))
    if sent is not None:
        inbound = inbound_decoder.decode(sent.data)
        return lane.guest_id or inbound.message.guest_id, inbound.agent
    return lane.guest_id or None, None


async def _release_lane(sessions: SessionRecords, tenant: str, session_id: str, run_id: str) -> None:
    """Give back a lane claimed for a run that was then refused (the caps), if it is still this run's."""

    await sessions.change(tenant, session_id, lambda lane: given_back(lane, run_id))


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
        return _error(exc)


def _not_a_run_id(run_id: str) -> RunNotFound:
    return RunNotFound(
        f"{run_id!r} is not a run id (run_ + 24 hex digits); check the id returned by POST /v1/events",
        run_id=run_id[:64],
    )


def _as_json(event: JournalEvent) -> Any:
    """An event as JSON: one this version does not know is shown as it was journaled."""
    return msgspec.json.decode(event.data) if isinstance(event, UnknownEvent) else msgspec.to_builtins(event)


def _visible(client: Client, run_id: str, first: JournalEvent | None) -> None:
    """Another tenant's run is not found, with the very answer a run that does not exist gets."""
    if not isinstance(first, RunStarted) or not client.sees(first.tenant):
        raise RunNotFound(run_id=run_id)


async def _journal(
    state: State, request: Request[Any, Any, Any], run_id: str
) -> list[tuple[int, JournalEvent]]:
    client = await state.door.client(request, Scope.RUNS_READ)
    if not is_run_id(run_id):
        raise _not_a_run_id(run_id)
    journal = RunJournal(state.broker, state.settings.namespace)
    events = await journal.read_with_seqs(run_id)
    _visible(client, run_id, events[0][1] if events else None)
    return events


@get(
    "/v1/runs/{run_id:str}",
    summary="A run's state",
    security=api.SECURITY,
    responses=api.ok(api.RunView, "the run folded from its journal") | api.errors(401, 403, 404, 429, 503),
)
async def get_run(state: State, request: Request[Any, Any, Any], run_id: str) -> Response[Any]:
    try:
        events = await _journal(state, request, run_id)
    except CrashsafeError as exc:
        return _error(exc)
    run = replay(e for _, e in events)
    assert run is not None
    return Response(content=msgspec.to_builtins(summarize(run)) | {"last_seq": events[-1][0]})


@get(
    "/v1/runs/{run_id:str}/events",
    summary="A run's journal",
    security=api.SECURITY,
    responses=api.ok(api.RunEvents, "every journaled event, in order") | api.errors(401, 403, 404, 429, 503),
)
async def get_run_events(state: State, request: Request[Any, Any, Any], run_id: str) -> Response[Any]:
    try:
        events = await _journal(state, request, run_id)
    except CrashsafeError as exc:
        return _error(exc)
    return Response(content={"run_id": run_id, "events": [{"seq": seq, **_as_json(e)} for seq, e in events]})


@post(
    "/v1/runs/{run_id:str}/reconcile",
    status_code=202,
    summary="Reconcile a run",
    security=api.SECURITY,
    responses=api.ok(api.Reconciled, "the run is woken to resolve its open actions by key", 202)
    | api.errors(401, 403, 404, 429, 503),
)
async def post_reconcile(state: State, request: Request[Any, Any, Any], run_id: str) -> Response[Any]:
    """For an operator after an incident: resolve the run's open actions by key, then let it continue."""
    door: Door = state.door
    try:
        client = await door.client(request, Scope.RUNS_OPERATE)
        if not is_run_id(run_id):
            raise _not_a_run_id(run_id)
        ns = state.settings.namespace
        first = await state.broker.first_on_subject(ns.stream(StreamKind.RUNS), ns.run_events(run_id))
        _visible(client, run_id, decode_event(first.data) if first is not None else None)
        # Each reconcile journals a run.nudged, kept forever: limited per run, so nobody can grow a journal at will.
        door.limit(door.reconciles, f"{client.tenant}/{run_id}", "run")
        done = await reconcile_run(state.broker, state.settings, run_id, by="operator:http")
    except CrashsafeError as exc:
        return _error(exc)
    return Response(
        content={"run_id": done.run_id, "status": done.status, "asked": done.asked}, status_code=202
    )


# Approvals ----------------------------------------------------------------------------------------------------


def _approval_json(record: ApprovalRecord, now: datetime) -> dict[str, Any]:
    """A record as the API shows it: a pending one past its expiry shows as expired (which it is)."""
    return msgspec.to_builtins(record) | {"status": approval_rules.current_status(record, now)}


@get(
    "/v1/approvals",
    summary="List approvals",
    security=api.SECURITY,
    responses=api.ok(api.Approvals, "newest first") | api.errors(401, 403, 422, 429, 503),
)
async def list_approvals(state: State, request: Request[Any, Any, Any]) -> Response[Any]:
    """Approvals of the caller's tenant (an admin: all), newest first; `?status=pending` (approved, rejected,
    expired) filters by what each record means now."""
    try:
        client = await state.door.client(request, Scope.RUNS_READ)
        wanted = request.query_params.get("status")
        if wanted is not None and wanted not in {s.value for s in ApprovalStatus}:
            raise UnprocessableBody(
                f"status must be one of {[s.value for s in ApprovalStatus]}, not {wanted!r}"
            )
        records = await ApprovalRecords(state.broker, state.settings.namespace).scan()
    except CrashsafeError as exc:
        return _error(exc)
    now = datetime.now(UTC)
    listed = [_approval_json(r, now) for r in approval_records.shown(records, client.sees, wanted, now)]
    return Response(content={"approvals": listed})


@get(
    "/v1/approvals/{approval_id:str}",
    summary="An approval",
    security=api.SECURITY,
    responses=api.ok(ApprovalRecord, "the record, its status as of now")
    | api.errors(401, 403, 404, 429, 503),
)
async def get_approval(state: State, request: Request[Any, Any, Any], approval_id: str) -> Response[Any]:
    try:
        client = await state.door.client(request, Scope.RUNS_READ)
        records = ApprovalRecords(state.broker, state.settings.namespace)
        stored = await approval_records.visible(records, client.sees, approval_id)
    except CrashsafeError as exc:
        return _error(exc)
    return Response(content=_approval_json(stored.record, datetime.now(UTC)))


_decision_decoder = msgspec.json.Decoder(ApprovalDecisionBody)


@post(
    "/v1/approvals/{approval_id:str}",
    request_max_body_size=None,
    status_code=200,
    summary="Decide an approval",
    security=api.SECURITY,
    responses=api.ok(ApprovalRecord, "decided; the run is woken")
    | api.errors(400, 401, 403, 404, 409, 413, 422, 429, 503),
)
async def post_approval(state: State, request: Request[Any, Any, Any], approval_id: str) -> Response[Any]:
    """A manager's decision: the record moves from pending once (compare-and-set); then the run is woken, and
    journals what the record says. Decided or expired already: 409 naming the status, nothing changes."""
    try:
        client = await state.door.client(request, Scope.APPROVALS_DECIDE)
        require_approver(client)  # never a key that may start the runs it would approve
        try:
            body = _decision_decoder.decode(await _read_body(request))
        except msgspec.ValidationError as exc:
            raise UnprocessableBody(
                f"body does not match the decision schema: {exc}; send"
                ' {"decision": "approve"|"reject", "approver": NAME, "reason": TEXT}'
            ) from exc
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"body is not valid JSON: {exc}; send one JSON object") from exc
        decision = ApprovalStatus.APPROVED if body.decision == "approve" else ApprovalStatus.REJECTED
        moved = await approval_records.decide(
            state.broker,
            state.settings,
            client.sees,
            approval_id,
            decision,
            f"manager:{body.approver}",
            body.reason,
        )
    except CrashsafeError as exc:
        return _error(exc)
    log(
        logger,
        logging.INFO,
        "approval decided",
        run_id=moved.record.run_id,
        approval_id=approval_id,
        decision=decision.value,
    )
    return Response(content=_approval_json(moved.record, datetime.now(UTC)), status_code=200)


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
            settings.nats_url, f"gateway-{settings.worker_id}", access=settings.nats_access
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
        app.state.caps = Caps(settings.active_runs_per_guest, settings.active_runs_per_session)
        app.state.turn_caps = TurnCaps(settings.turns_per_run, settings.run_inbox)
        app.state.broker = broker
        app.state.sessions = SessionRecords(broker, ns)
        app.state.settings = settings
        app.state.registry = registry
        try:
            yield
        finally:
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
