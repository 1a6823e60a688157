"""Business identity and the support agent through the real stack (gateway, runtime, executors as processes, the
sandbox): a room asked for twice by a hostile script is one hold and one charge, and the support agent refunds
the guest's own payment through an executor that serves `refund_payment` only to a support run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from crashsafe.natsd import NatsServer
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import unique

HOLD = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}'
PAY = 'obey: create_payment {"booking_id": "$booking_id"}'


@pytest.fixture(scope="module")
async def stack(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[StackClient]:
    async with open_stack(tmp_path_factory.mktemp("identity"), nats_url=nats_server.url) as client:
        yield client


def _of(events: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    steps = {e["step_no"] for e in events if e["type"] == "run.action_requested" and e["tool"] == tool}
    return [e for e in events if e["type"] == "run.action_completed" and e["step_no"] in steps]


async def test_a_room_asked_twice_then_paid_is_one_hold_and_one_charge(stack: StackClient) -> None:
    guest = unique("guest")
    run_id = await stack.submit(
        f"obey: create_booking {HOLD}\nobey: create_booking {HOLD}\n{PAY}", guest_id=guest
    )
    assert (await stack.wait_terminal(run_id))["status"] == "completed"
    events = await stack.events(run_id)
    holds = _of(events, "create_booking")
    assert len(holds) == 2 and len({h["key"] for h in holds}) == 1
    assert len({h["result"]["booking_id"] for h in holds}) == 1
    counts = await stack.counts(guest)
    assert (counts["booking"], counts["charge"]) == (1, 1)


async def test_support_refunds_the_guests_own_payment_and_not_anothers(stack: StackClient) -> None:
    guest, stranger = unique("guest"), unique("guest")
    booked = await stack.submit(f"obey: create_booking {HOLD}\n{PAY}", guest_id=guest)
    assert (await stack.wait_terminal(booked))["status"] == "completed"
    (paid,) = _of(await stack.events(booked), "create_payment")
    payment_id = paid["result"]["payment_id"]
    refund = f'obey: find_payments {{}}\nobey: refund_payment {{"payment_id": "{payment_id}", "amount_cents": 500}}'

    theirs = await stack.submit(refund, guest_id=stranger, agent="support")
    assert (await stack.wait_terminal(theirs))["status"] == "completed"
    rejected = [e for e in await stack.events(theirs) if e["type"] == "run.tool_rejected"]
    assert [e["error"]["code"] for e in rejected] == ["unknown_payment"]

    mine = await stack.submit(refund, guest_id=guest, agent="support")
    assert (await stack.wait_terminal(mine))["status"] == "completed"
    (refunded,) = _of(await stack.events(mine), "refund_payment")
    assert refunded["status"] == "succeeded", refunded
    refunds = [e for e in (await stack.ledger(guest))["entries"] if e["kind"] == "refund"]
    assert [r["amount_cents"] for r in refunds] == [500]
