"""One tenant never reaches another tenant's guests (issue 17), over a real stack (gateway, runtime, executors,
projector as processes, the sandbox providers): tenant demo's guest alice pays 240.00 EUR; a key of tenant evil
(events:write, runs:read, runs:operate) sends `POST /v1/events?agent=support` for "alice", as the issue saw it
list alice's payment into evil's journal, refund 150 EUR of it without approval, and approve its own 90 EUR
refund held for a manager. (The pure rules: tests/unit/test_tenancy.py, test_gateway_access.py, test_audit.py.)"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from crashsafe.contracts.clients import Scope
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.client_keys import ClientKeys
from tests.support.stack import StackClient, auth_header, cli_env, crashsafe, guest_event, open_stack
from tests.support.waiting import eventually

HOLD = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}'  # 2 nights, 240.00 EUR
PAY = f'obey: create_booking {HOLD}\nobey: create_payment {{"booking_id": "$booking_id"}}'
# What evil's key carried in the issue.
EVIL_SCOPES = (Scope.EVENTS_WRITE, Scope.RUNS_READ, Scope.RUNS_OPERATE)


@pytest.fixture(scope="module")
async def stack(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(tmp_path_factory.mktemp("tenancy"), nats_url=nats_server.url) as client:
        yield client


def as_key(stack: StackClient, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.stack.gateway_url, timeout=20.0, headers=auth_header(key))


async def start(gateway: httpx.AsyncClient, guest_id: str, text: str, agent: str) -> httpx.Response:
    body = guest_event(f"ev-{uuid.uuid4().hex[:12]}", guest_id=guest_id, text=text)
    return await gateway.post("/v1/events", json=body, params={"agent": agent})


async def paid(stack: StackClient, gateway: httpx.AsyncClient, guest_id: str) -> dict[str, Any]:
    """A booking run of the key's tenant for `guest_id` that holds lis-1 and pays it: its payment's receipt."""
    accepted = await start(gateway, guest_id, PAY, "booking")
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    assert (await stack.wait_terminal(run_id))["status"] == "completed"
    events = await stack.events(run_id)
    (payment,) = [e for e in events if _is_done(e, "create_payment", events)]
    assert payment["status"] == "succeeded", payment
    return dict(payment["result"])


def _is_done(event: dict[str, Any], tool: str, events: list[dict[str, Any]]) -> bool:
    steps = {e["step_no"] for e in events if e["type"] == "run.action_requested" and e["tool"] == tool}
    return event["type"] == "run.action_completed" and event["step_no"] in steps


async def payments(stack: StackClient, guest_id: str, account: str) -> list[dict[str, Any]]:
    """What the payment provider itself holds for a guest in an account."""
    response = await stack.http.get(
        f"{stack.stack.sandbox_url}/payments",
        params={"guest_id": guest_id},
        headers={"provider-account": account},
    )
    response.raise_for_status()
    return list(response.json()["payments"])


async def test_another_tenants_key_neither_sees_nor_refunds_nor_approves_for_a_guest_of_demo(
    stack: StackClient, broker: Broker
) -> None:
    keys = ClientKeys(broker, stack.ns)
    alice = f"alice-{uuid.uuid4().hex[:6]}"  # tenant demo's guest (the stack's own key is demo's)
    payment = await paid(stack, stack.gateway, alice)
    assert (payment["amount_cents"], payment["currency"], payment["account"]) == (24_000, "EUR", "demo")
    booking_id, payment_id = payment["booking_id"], payment["payment_id"]

    # Evil's key, as the issue minted it: it names no agent, so it may start only the default (booking) agent.
    evil_key = (await keys.create("evil", list(EVIL_SCOPES), name="evil")).key
    async with as_key(stack, evil_key) as evil:
        refused = await start(
            evil, alice, f"refund 150 EUR of my payment for booking {booking_id}", "support"
        )
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "forbidden" and error["details"]["agent"] == "support", error

    # Even a key of evil's that may start the support agent reaches no guest of demo's: "alice" in evil's
    # account is nobody, so the listing is empty and the payment id, named outright, is refused.
    granted = (await keys.create("evil", list(EVIL_SCOPES), name="evil", agents=["booking", "support"])).key
    async with as_key(stack, granted) as evil:
        for text in (
            f"refund 150 EUR of my payment for booking {booking_id}",
            f'obey: find_payments {{}}\nobey: refund_payment {{"payment_id": "{payment_id}", "amount_cents": 15000}}',
        ):
            accepted = await start(evil, alice, text, "support")
            assert accepted.status_code == 202, accepted.text
            run_id = accepted.json()["run_id"]
            assert (await stack.wait_terminal(run_id))["status"] == "completed"
            events = (await evil.get(f"/v1/runs/{run_id}/events")).json()["events"]
            listings = [e for e in events if _is_done(e, "find_payments", events)]
            assert listings and all(e["result"]["payments"] == [] for e in listings), listings
            assert payment_id not in str([e.get("result") for e in events])  # never shown to evil's run
            assert not [
                e for e in events if e["type"] == "run.action_requested" and e["tool"] == "refund_payment"
            ]

        # Evil's own guest's refund above 150 EUR waits for a manager; evil's key (runs:operate) cannot approve it.
        mallory = f"mallory-{uuid.uuid4().hex[:6]}"
        own = await paid(stack, evil, mallory)
        assert own["account"] == "evil"
        accepted = await start(
            evil, mallory, f"refund 200 EUR of my payment for booking {own['booking_id']}", "support"
        )
        run_id = accepted.json()["run_id"]

        async def held() -> str | None:
            summary = await stack.summary(run_id)
            return summary["awaiting_approval"] if summary else None

        approval_id = await eventually(held, what="evil's refund to be held for a manager")
        approved = await evil.post(
            f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "me"}
        )
        assert approved.status_code == 403, approved.text
        assert approved.json()["error"]["details"]["scope"] == "approvals:decide"
    assert (await payments(stack, mallory, "evil"))[0]["refunded_cents"] == 0

    # Evil's manager (a key that cannot start runs) decides it: the refund is made in evil's account only.
    manager = (await keys.create("evil", [Scope.APPROVALS_DECIDE, Scope.RUNS_READ], name="manager")).key
    async with as_key(stack, manager) as boss:
        decided = await boss.post(
            f"/v1/approvals/{approval_id}", json={"decision": "approve", "approver": "ana"}
        )
        assert decided.status_code == 200, decided.text
    assert (await stack.wait_terminal(run_id))["status"] == "completed"
    assert (await payments(stack, mallory, "evil"))[0]["refunded_cents"] == 20_000

    # Demo's alice: her payment untouched at the provider, and found by no other account.
    (held_by_demo,) = await payments(stack, alice, "demo")
    assert (held_by_demo["payment_id"], held_by_demo["refunded_cents"]) == (payment_id, 0)
    assert await payments(stack, alice, "evil") == []
    refunds = [e for e in (await stack.ledger(alice))["entries"] if e["kind"] == "refund"]
    assert refunds == []


async def test_the_cli_mints_a_key_naming_its_agents_and_refuses_one_that_starts_and_approves(
    stack: StackClient,
) -> None:
    env = cli_env(stack.stack, sandbox=False)
    made = await crashsafe(
        "keys", "create", "--tenant", "evil", "--scope", "events:write", "--agent", "support", env=env
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    listed = await crashsafe("keys", "list", env=env)
    assert f"{key.split('_')[1]}  tenant evil  scopes events:write  agents support" in listed.stdout
    async with as_key(stack, key) as evil:
        assert (await start(evil, "bob", "hello", "support")).status_code == 202
        refused = await start(evil, "bob", "hello", "booking")  # named no longer: not the default either
        assert refused.status_code == 403 and refused.json()["error"]["details"]["allowed"] == "support"
    both = await crashsafe(
        "keys",
        "create",
        "--tenant",
        "evil",
        "--scope",
        "events:write",
        "--scope",
        "approvals:decide",
        env=env,
    )
    assert both.returncode != 0 and "approvals:decide" in both.stderr, both.stderr
