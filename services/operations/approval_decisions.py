"""Approvals as an operator or a manager sees and decides them: the console reads the records and decides with the
API's own function (services/platform/approvals.py `decide`); the CLI asks the gateway over HTTP, as a manager's
script would (the gateway is the one writer of a manager's decision)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from crashsafe.contracts.approvals import ApprovalRecord
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain import approval_flow as approval_rules
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.approval_records import ApprovalRecords, decide, shown

# A manager's decision: the one the API (POST /v1/approvals/{id}) takes; the console calls it from here.
__all__ = ["GatewayAnswer", "approvals_shown", "decide", "decide_through_gateway", "list_through_gateway"]


async def approvals_shown(
    broker: Broker, ns: Namespace, sees: Callable[[str], bool], wanted: str | None, now: datetime
) -> list[tuple[ApprovalRecord, str]]:
    """The approvals a client sees (its tenant's; an admin all), newest first, each with what it means now
    (a pending record past its deadline is expired, whether or not the timer has moved it yet)."""
    records = await ApprovalRecords(broker, ns).scan()
    return [(r, approval_rules.current_status(r, now)) for r in shown(records, sees, wanted, now)]


@dataclass(frozen=True, slots=True)
class GatewayAnswer:
    """The gateway's answer: its status, and its JSON body (None if it sent none) or its text."""

    status: int
    body: Any
    text: str


def _answer(response: httpx.Response) -> GatewayAnswer:
    try:
        body = response.json()
    except ValueError:
        body = None
    return GatewayAnswer(response.status_code, body, response.text)


async def list_through_gateway(url: str, headers: dict[str, str], status: str | None) -> GatewayAnswer:
    """GET /v1/approvals (200: `{"approvals": [...]}`), with the key in `headers`."""
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
        return _answer(await http.get("/v1/approvals", params={"status": status} if status else None))


async def decide_through_gateway(
    url: str, headers: dict[str, str], approval_id: str, decision: str, approver: str, reason: str
) -> GatewayAnswer:
    """POST /v1/approvals/{id}: approve or reject once (409 if decided already)."""
    body = {"decision": decision, "approver": approver, "reason": reason}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
        return _answer(await http.post(f"/v1/approvals/{approval_id}", json=body))
