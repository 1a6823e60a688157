"""Reading a run over HTTP: its state folded from the journal, the journal itself, and an operator's reconcile; another tenant's run is not found."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import CrashsafeError, RunNotFound
from crashsafe.contracts.keys import is_run_id
from crashsafe.contracts.run_events import (
    ActionRequested,
    JournalEvent,
    RunStarted,
    UnknownEvent,
    decode_event,
)
from crashsafe.domain.access import Client
from crashsafe.domain.fold import replay, summarize
from crashsafe.services.gateway import openapi as api
from crashsafe.services.gateway.door import Door, error_response
from crashsafe.services.records.run_asks import reconcile_run
from crashsafe.services.records.run_journal import RunJournal


def _not_a_run_id(run_id: str) -> RunNotFound:
    return RunNotFound(
        f"{run_id!r} is not a run id (run_ + 24 hex digits); check the id returned by POST /v1/events",
        run_id=run_id[:64],
    )


def _as_json(event: JournalEvent) -> Any:
    """An event as JSON: one this version does not know is shown as it was journaled. An intent's capability
    (the journal carries it to the executor, issue 33) is the runtime's word to the executor alone: left out."""
    if isinstance(event, UnknownEvent):
        return msgspec.json.decode(event.data)
    if isinstance(event, ActionRequested) and event.capability is not None:
        event = msgspec.structs.replace(event, capability=None)
    return msgspec.to_builtins(event)


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
        return error_response(exc)
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
        return error_response(exc)
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
        # An archived run is found too: it has nothing open, so its reconcile asks nothing and wakes nobody.
        first = await RunJournal(state.broker, state.settings.namespace).first(run_id)
        _visible(client, run_id, decode_event(first.data) if first is not None else None)
        # Each reconcile journals a run.nudged, kept forever: limited per run, so nobody can grow a journal at will.
        door.limit(door.reconciles, f"{client.tenant}/{run_id}", "run")
        done = await reconcile_run(state.broker, state.settings, run_id, by="operator:http")
    except CrashsafeError as exc:
        return error_response(exc)
    return Response(
        content={"run_id": done.run_id, "status": done.status, "asked": done.asked}, status_code=202
    )
