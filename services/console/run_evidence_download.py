"""The console's evidence download (issue 34): the run page's button, one run's evidence bundle as a file, for a
client that may see the run; asks the providers by key as the provider view does, under the same per-key rate."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get

from crashsafe.contracts.errors import RunNotFound
from crashsafe.contracts.evidence import bundle_encoder
from crashsafe.contracts.keys import is_run_id
from crashsafe.contracts.run_events import RunStarted, decode_event
from crashsafe.domain.registry import Registry
from crashsafe.services.console.console_router import session_of
from crashsafe.services.console.pages_operate import provider_views_limit
from crashsafe.services.operations.run_evidence import gather
from crashsafe.services.records.capability_keys import read_public_keys
from crashsafe.services.records.run_journal import RunJournal


@get("/runs/{run_id:str}/evidence", include_in_schema=False)
async def run_evidence(request: Request[Any, Any, Any], run_id: str) -> Response[bytes]:
    """The run's evidence bundle (`crashsafe verify` checks it offline), as an attachment."""
    session = await session_of(request)
    provider_views_limit(request, session.client)
    state = request.app.state
    if not is_run_id(run_id):
        raise RunNotFound(run_id=run_id[:64])
    settings = state.settings
    # The tenant first, from the run's first event alone: another tenant's run costs no provider a lookup.
    first = await RunJournal(state.broker, settings.namespace).first(run_id)
    try:
        started = decode_event(first.data) if first is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        started = None
    if not isinstance(started, RunStarted) or not session.client.sees(started.tenant):
        raise RunNotFound(run_id=run_id)
    registry: Registry = state.registry
    keys = read_public_keys(settings.capability_verify_keys)
    bundle = await gather(state.broker, settings.namespace, registry, settings.registry, run_id, keys)
    if bundle is None:
        raise RunNotFound(run_id=run_id)
    return Response(
        bundle_encoder.encode(bundle),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{run_id}.evidence.json"'},
    )


HANDLERS = [run_evidence]
