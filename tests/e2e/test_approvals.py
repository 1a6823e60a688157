"""Approvals through the whole stack of real processes: a run waits for a decision holding no worker, every service
is SIGKILLed while it waits (the supervisor brings each back), and then the decision (the manager's, over HTTP or
the CLI) or the durable timer ends the wait. Decisions are taken once: a second one is a 409, another tenant's
approval is a 404.

The test journals the hold as the runtime would have (`tests/support/holds.py`: the run's first model answer, then
`run.approval_requested` for its call), so it does not depend on which rule holds what; everything after is the
product's. The policy's own holds, through the same waits, are the eval suite's approval scenarios."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from crashsafe.contracts.clients import Scope
from crashsafe.contracts.policy import Approver
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from tests.support.holds import held_search, key_id_of
from tests.support.stack import StackClient, auth_header, cli_env, crashsafe, supervised
from tests.support.waiting import eventually


async def _held(client: StackClient, broker: Broker, ttl_s: float) -> tuple[str, str]:
    """A booking run of the stack's tenant whose hotel search a rule held for a manager: (run id, approval id)."""
    return await held_search(
        client,
        broker,
        approver=Approver.MANAGER.value,
        ttl_s=ttl_s,
        question="Your manager must approve this search.",
    )


async def _approval(client: StackClient, approval_id: str) -> dict[str, Any] | None:
    try:
        response = await client.gateway.get(f"/v1/approvals/{approval_id}")
    except httpx.TransportError:
        return None  # the gateway is restarting
    return dict(response.json()) if response.status_code == 200 else None


async def _kill_everything_while_it_waits(client: StackClient) -> None:
    stack = client.stack
    for name in list(stack.services):
        stack.kill(name)

    async def back() -> bool:
        return not stack.dead() and await _ready(client)

    await eventually(back, what="every service back after SIGKILL", timeout_s=120)


async def _ready(client: StackClient) -> bool:
    try:
        return (await client.gateway.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


def _decisions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "run.approval_decided"]


@pytest.mark.parametrize("decision", ["approve", "reject", "expire"])
async def test_an_approval_is_decided_once_after_every_service_was_killed_while_waiting(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker, decision: str
) -> None:
    client = await start_stack()
    run_id, approval_id = await _held(client, broker, ttl_s=6 if decision == "expire" else 3600)
    record = await eventually(lambda: _approval(client, approval_id), what="the approval's record")
    assert record["status"] == "pending" and record["run_id"] == run_id
    summary = await client.summary(run_id)
    assert summary is not None and summary["awaiting_approval"] == approval_id
    assert summary["reply"] == "Your manager must approve this search."
    listed = (await client.gateway.get("/v1/approvals", params={"status": "pending"})).json()["approvals"]
    assert approval_id in [a["approval_id"] for a in listed]
    # The stack's admin key started the run (it is admin, so approvals:decide): it may not decide it (issue 31,
    # item 9). The stack's approver key does, below.
    own = await client.gateway.post(
        f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "x"}
    )
    assert own.status_code == 403 and run_id in own.json()["error"]["message"], own.text

    async with supervised(client.stack):
        await _kill_everything_while_it_waits(client)
        if decision == "expire":
            ended = await client.wait_terminal(run_id, timeout_s=120)
        else:
            response = await client.manager.post(
                f"/v1/approvals/{approval_id}", json={"decision": decision, "approver": "ana", "reason": "ok"}
            )
            assert response.status_code == 200, response.text
            ended = await client.wait_terminal(run_id, timeout_s=120)

    events = await client.events(run_id)
    (decided,) = _decisions(events)
    expected = {"approve": "approved", "reject": "rejected", "expire": "expired"}[decision]
    assert decided["decision"] == expected
    assert decided["decided_by"] == ("timer" if decision == "expire" else "manager:ana")
    searched = [e for e in events if e["type"] == "run.action_requested" and e["tool"] == "search_hotels"]
    if decision == "approve":
        assert ended["outcome"] == "completed" and len(searched) == 1
    else:
        assert not searched
        assert ended["outcome"] == "completed"
        assert ("not given in time" if decision == "expire" else "declined by manager:ana") in ended["reply"]

    # Once decided, never again: a second decision is a 409 naming what the record says.
    again = await client.manager.post(
        f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "bob"}
    )
    assert again.status_code == 409, again.text
    error = again.json()["error"]
    assert error["code"] == "approval_not_pending" and error["details"]["status"] == expected


async def test_another_tenants_approval_is_not_found_and_the_cli_decides_through_the_gateway(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack()
    run_id, approval_id = await _held(client, broker, ttl_s=3600)
    await eventually(lambda: _approval(client, approval_id), what="the approval's record")

    stranger = (
        await ClientKeys(broker, client.ns).create(
            "initech", [Scope.RUNS_OPERATE, Scope.RUNS_READ, Scope.APPROVALS_DECIDE]
        )
    ).key
    async with httpx.AsyncClient(
        base_url=client.stack.gateway_url, timeout=20.0, headers=auth_header(stranger)
    ) as other:
        assert (await other.get(f"/v1/approvals/{approval_id}")).status_code == 404
        refused = await other.post(
            f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "x"}
        )
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "approval_not_found"
        assert (await other.get("/v1/approvals")).json()["approvals"] == []
    assert (await client.gateway.get("/v1/approvals/apr_nope_2")).status_code == 404

    # The keys `crashsafe up` wrote: the CLI lists with the admin key and decides with the approver key.
    env = {**cli_env(client.stack), "CRASHSAFE_API_KEY": ""}
    gw = ("--gateway-url", client.stack.gateway_url, "--state-dir", str(client.stack.state_dir))
    approver = await ClientKeys(broker, client.ns).get(key_id_of(client.approver_key))
    assert approver is not None and sorted(approver.scopes) == ["approvals:decide", "runs:read"], approver
    listed = await crashsafe("approvals", "list", "--status", "pending", *gw, env=env)
    assert listed.returncode == 0 and approval_id in listed.stdout, listed.stderr
    # The admin key, the one that started the run, named by the operator: refused, saying why and what to use.
    own = await crashsafe(
        "approvals",
        "approve",
        approval_id,
        "--approver",
        "me",
        *gw,
        env={**env, "CRASHSAFE_API_KEY": client.api_key},
    )
    assert own.returncode == 1 and "403 forbidden" in own.stderr and run_id in own.stderr, own.stderr
    assert "approver_key" in own.stderr
    decided = await crashsafe(
        "approvals", "reject", approval_id, "--approver", "ana", "--reason", "no", *gw, env=env
    )
    assert decided.returncode == 0, decided.stderr
    twice = await crashsafe("approvals", "approve", approval_id, "--approver", "bob", *gw, env=env)
    assert twice.returncode == 1 and "409 approval_not_pending" in twice.stderr and "rejected" in twice.stderr
    ended = await client.wait_terminal(run_id)
    assert "declined by manager:ana (no)" in ended["reply"]


async def test_a_gateway_killed_between_its_decision_and_the_wake_still_gets_the_run_to_journal_it(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack(crash={"gateway": "gateway.after_approval_decided"})
    run_id, approval_id = await _held(client, broker, ttl_s=3600)
    await eventually(lambda: _approval(client, approval_id), what="the approval's record")
    async with supervised(client.stack):
        with pytest.raises(httpx.TransportError):  # the gateway died after its compare-and-set
            await client.manager.post(
                f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "ana"}
            )
        # Nobody woke the run: the reconciler's backstop finds the decided record and wakes it.
        ended = await client.wait_terminal(run_id, timeout_s=120)
        assert client.stack.services["gateway"].restarts >= 1
        # The manager's client retries: the decision was taken, once.
        again = await client.manager.post(
            f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "ana"}
        )
    assert again.status_code == 409 and again.json()["error"]["details"]["status"] == "approved"
    events = await client.events(run_id)
    (decided,) = _decisions(events)
    assert decided["decided_by"] == "manager:ana" and ended["outcome"] == "completed"
    assert any(e["type"] == "run.nudged" and e["by"].startswith("reconciler:") for e in events)
