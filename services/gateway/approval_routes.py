"""The approvals API: list and read a tenant's approvals, and a manager's decision (compare-and-set, once)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State

from crashsafe.contracts.approvals import ApprovalDecisionBody, ApprovalRecord, ApprovalStatus
from crashsafe.contracts.clients import Scope
from crashsafe.contracts.errors import CrashsafeError, InvalidRequest, UnprocessableBody
from crashsafe.domain import approval_flow as approval_rules
from crashsafe.domain.access import require_approver
from crashsafe.services.gateway import openapi as api
from crashsafe.services.gateway.door import error_response, read_body
from crashsafe.services.platform.logs import log
from crashsafe.services.records import approval_records
from crashsafe.services.records.approval_records import ApprovalRecords

logger = logging.getLogger("crashsafe.gateway")  # the gateway's one logger, whatever the module


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
        return error_response(exc)
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
        return error_response(exc)
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
            body = _decision_decoder.decode(await read_body(request))
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
            decider=client.key_id,  # never the key that started the run, an admin's included
        )
    except CrashsafeError as exc:
        return error_response(exc)
    log(
        logger,
        logging.INFO,
        "approval decided",
        run_id=moved.record.run_id,
        approval_id=approval_id,
        decision=decision.value,
    )
    return Response(content=_approval_json(moved.record, datetime.now(UTC)), status_code=200)
