"""`crashsafe approvals list|approve|reject`: actions held for a manager, through the gateway as a manager would
(the gateway is the one writer of a manager's decision), printed."""

from __future__ import annotations

import sys
from pathlib import Path

from crashsafe.deployment import DECIDING_KEY_FILES, gateway_for
from crashsafe.services.operations.approval_decisions import (
    GatewayAnswer,
    decide_through_gateway,
    list_through_gateway,
)


def _say_error(answer: GatewayAnswer) -> int:
    try:
        error = answer.body["error"]
        print(f"crashsafe: {answer.status} {error['code']}: {error['message']}", file=sys.stderr)
    except (KeyError, TypeError):
        print(f"crashsafe: gateway answered {answer.status}: {answer.text[:200]}", file=sys.stderr)
    return 1


async def approvals_list(state_dir: Path, status: str | None, gateway_url: str | None = None) -> int:
    url, headers = gateway_for(state_dir, gateway_url)
    answer = await list_through_gateway(url, headers, status)
    if answer.status != 200:
        return _say_error(answer)
    approvals = answer.body["approvals"]
    for a in approvals:
        amount = (
            f"{a['amount_cents'] / 100:,.2f} {a['currency']}" if a.get("amount_cents") is not None else "-"
        )
        by = f" by {a['decided_by']}" if a.get("decided_by") else ""
        print(
            f"{a['approval_id']}  {a['status']}{by}  {a['tool']} {amount}  approver {a['approver']}  "
            f"run {a['run_id']}  tenant {a['tenant']}  expires {a['expires_at']}  ({a['reason']})"
        )
    if not approvals:
        print(f"no {status + ' ' if status else ''}approvals")
    return 0


async def approvals_decide(
    state_dir: Path,
    approval_id: str,
    decision: str,
    approver: str,
    reason: str,
    gateway_url: str | None = None,
) -> int:
    url, headers = gateway_for(state_dir, gateway_url, DECIDING_KEY_FILES)
    answer = await decide_through_gateway(url, headers, approval_id, decision, approver, reason)
    if answer.status != 200:
        return _say_error(answer)
    record = answer.body
    print(f"{approval_id}: {record['status']} by {record['decided_by']}; the run continues")
    return 0
