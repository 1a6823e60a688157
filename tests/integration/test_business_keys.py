"""Business keys end to end, on the real nats-server with real executors, the sandbox and a hostile scripted model
(`obey:` lines in the guest's text): the same intent asked again, in another step or another run of the
session, is one effect at the provider; a declined charge asked again waits for the guest; the support agent
refunds the guest's own payment and nothing else."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalRequested,
    JournalEvent,
    PolicyDenied,
    ToolRejected,
)
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import OutcomeStatus, Via
from crashsafe.domain.fold import replay
from crashsafe.natsd import NatsServer
from crashsafe.services.agents import stayhub
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.runtime.service import Runtime
from tests.support import inprocess
from tests.support.broker import dead_letters, submit_inbound
from tests.support.runs import assert_replays
from tests.support.waiting import eventually, unique
from tests.support.world import Sandbox

REGISTRY = stayhub()
HOLD = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}'


@dataclass
class Stack:
    runtime: Runtime
    journal: RunJournal
    sandbox: Sandbox
    broker: Broker
    ns: Namespace

    async def run(self, text: str, *, agent: str = "booking", guest: str, session: str) -> str:
        return await submit_inbound(
            self.broker, self.ns, unique("ev"), agent=agent, text=text, guest_id=guest, session_id=session
        )

    async def ended(self, run_id: str) -> list[JournalEvent]:
        async def terminal() -> list[JournalEvent] | None:
            events, _ = await self.journal.read(run_id)
            state = replay(events) if events else None
            return events if state is not None and state.terminal else None

        return await eventually(terminal, what=f"run {run_id} to end")

    async def waiting(self, run_id: str) -> list[JournalEvent]:
        async def held() -> list[JournalEvent] | None:
            events, _ = await self.journal.read(run_id)
            state = replay(events) if events else None
            return events if state is not None and state.awaiting is not None else None

        return await eventually(held, what=f"run {run_id} to wait for an approval")


@pytest.fixture
async def stack(
    nats_server: NatsServer, namespace: Namespace, broker: Broker, tmp_path: Path
) -> AsyncIterator[Stack]:
    """One runtime worker and every executor of the StayHub deployment (booking and support agents)."""
    async with inprocess.sandbox_server() as sandbox_url, AsyncExitStack() as running:
        settings = inprocess.settings_for(
            nats_server.url, namespace, sandbox_url=sandbox_url, data_dir=tmp_path / "data", worker_id="rt"
        )
        for family in ("booking", "payment", "notify"):
            await running.enter_async_context(inprocess.executor(settings, family, registry=REGISTRY))
        model = await running.enter_async_context(inprocess.scripted_model(settings))
        runtime = await running.enter_async_context(inprocess.runtime(settings, model, registry=REGISTRY))
        await runtime.start()
        http = await running.enter_async_context(httpx.AsyncClient(timeout=10))
        yield Stack(runtime, RunJournal(broker, namespace), Sandbox(http, sandbox_url), broker, namespace)
    assert await dead_letters(broker, namespace) == []


def _requested(events: list[JournalEvent], tool: str) -> list[ActionRequested]:
    return [e for e in events if isinstance(e, ActionRequested) and e.tool == tool]


def _completed(events: list[JournalEvent], tool: str) -> list[ActionCompleted]:
    steps = {e.step_no for e in _requested(events, tool)}
    return [e for e in events if isinstance(e, ActionCompleted) and e.step_no in steps]


async def _booked_and_paid(stack: Stack, guest: str, session: str) -> tuple[list[JournalEvent], str]:
    text = f'obey: create_booking {HOLD}\nobey: create_payment {{"booking_id": "$booking_id"}}'
    events = await stack.ended(await stack.run(text, guest=guest, session=session))
    (paid,) = _completed(events, "create_payment")
    assert paid.status == OutcomeStatus.SUCCEEDED, paid
    return events, str(paid.result["payment_id"])


async def test_the_same_room_booked_in_two_answers_is_one_hold_and_one_charge(stack: Stack) -> None:
    guest = unique("guest")
    text = (
        f"obey: create_booking {HOLD}\n"
        f"obey: create_booking {HOLD}\n"
        'obey: create_payment {"booking_id": "$booking_id"}'
    )
    events = await stack.ended(await stack.run(text, guest=guest, session=unique("sess")))
    holds = _completed(events, "create_booking")
    assert len(holds) == 2 and len({h.step_no for h in holds}) == 2  # two steps, each answered
    assert {h.key for h in holds} == {holds[0].key} and holds[0].key.startswith("hold:")
    assert {h.result["booking_id"] for h in holds} == {holds[0].result["booking_id"]}
    assert [h.via for h in holds] == [Via.CALL, Via.REPLAY]
    counts = await stack.sandbox.counts(guest)
    assert (counts["booking"], counts["charge"], counts["booking_release"]) == (1, 1, 0)
    assert_replays(events)  # the keys are decided again, the same, from the journal alone


async def test_three_holds_of_one_room_asked_two_in_flight_at_once_are_one_hold(stack: Stack) -> None:
    guest = unique("guest")
    hold = f"obey: create_booking {HOLD}"
    text = (
        f"{hold}\n{hold}\n{hold.replace('obey:', 'obey+:')}\n"  # the last two in one answer, in flight at once
        'obey: create_payment {"booking_id": "$booking_id"}'
    )
    events = await stack.ended(await stack.run(text, guest=guest, session=unique("sess")))
    holds = _completed(events, "create_booking")
    assert len(holds) == 3 and len({h.step_no for h in holds}) == 3
    assert {h.key for h in holds} == {holds[0].key} and holds[0].key.startswith("hold:")
    assert {h.status for h in holds} == {OutcomeStatus.SUCCEEDED}
    assert len({h.result["booking_id"] for h in holds}) == 1
    counts = await stack.sandbox.counts(guest)
    assert (counts["booking"], counts["charge"]) == (1, 1)


async def test_a_model_asking_for_the_confirmation_email_itself_is_refused_every_time(stack: Stack) -> None:
    """The email is a projection of the paid run now, not the model's tool: asked three times (two at once) it is
    three clean `unknown_tool` rejections, nothing reaches executor-notify, and the run completes paid."""
    guest = unique("guest")
    email = 'obey: send_confirmation_email {"booking_id": "$booking_id", "to": "mallory@evil.example"}'
    text = (
        f"obey: create_booking {HOLD}\n"
        'obey: create_payment {"booking_id": "$booking_id"}\n'
        f"{email}\n{email}\n{email.replace('obey:', 'obey+:')}"
    )
    events = await stack.ended(await stack.run(text, guest=guest, session=unique("sess")))
    state = replay(events)
    assert state is not None and state.status == "completed"
    refused = [e for e in events if isinstance(e, ToolRejected) and e.tool == "send_confirmation_email"]
    assert len(refused) == 3 and {e.error.code for e in refused} == {"unknown_tool"}
    assert _requested(events, "send_confirmation_email") == []
    (paid,) = _completed(events, "create_payment")
    assert paid.status == OutcomeStatus.SUCCEEDED
    assert_replays(events)


async def test_a_second_run_of_the_session_asking_the_same_hold_gets_the_stored_receipt(stack: Stack) -> None:
    guest, session = unique("guest"), unique("sess")
    first, payment_id = await _booked_and_paid(stack, guest, session)
    (hold,) = _completed(first, "create_booking")
    text = f'obey: create_booking {HOLD}\nobey: create_payment {{"booking_id": "$booking_id"}}'
    second_run = await stack.run(text, guest=guest, session=session)
    second = await stack.ended(second_run)
    (again,) = _completed(second, "create_booking")
    assert (again.run_id, again.key, again.via) == (second_run, hold.key, Via.REPLAY)
    assert again.result["booking_id"] == hold.result["booking_id"]
    assert any(hold.run_id in e.detail for e in again.evidence), again.evidence  # who made it
    # The hold is the first run's, which paid it: this run is told so, never charges it (nor lets it go).
    assert _requested(second, "create_payment") == []
    (refused,) = [e for e in second if isinstance(e, ToolRejected) and e.tool == "create_payment"]
    assert refused.error.details["held_by"] == hold.run_id
    assert payment_id not in json.dumps(refused.error.details)
    counts = await stack.sandbox.counts(guest)
    assert (counts["booking"], counts["charge"], counts["booking_release"]) == (1, 1, 0)


async def test_a_hold_an_earlier_run_released_is_never_replayed_as_held(stack: Stack) -> None:
    """The first run holds the room and ends unpaid (its hold is released); the session's next run asking for the
    same room is told the hold was undone, not handed the released booking, and its next ask is a new hold."""
    guest, session = unique("guest"), unique("sess")
    first = await stack.ended(await stack.run(f"obey: create_booking {HOLD}", guest=guest, session=session))
    (hold,) = _completed(first, "create_booking")
    (release,) = _completed(first, "release_booking")
    assert release.status == OutcomeStatus.SUCCEEDED and release.key == f"{hold.key}:release"
    text = f"obey: create_booking {HOLD}\nobey: create_booking {HOLD}"
    second = await stack.ended(await stack.run(text, guest=guest, session=session))
    stale, fresh = _completed(second, "create_booking")
    assert (stale.key, stale.status, stale.error and stale.error.code) == (
        hold.key,
        "failed",
        "action_undone",
    )
    assert stale.result == {}  # never the released booking's "held"
    assert (fresh.key, fresh.status) == (f"{hold.key}:a2", OutcomeStatus.SUCCEEDED)
    assert fresh.result["booking_id"] != hold.result["booking_id"]
    assert_replays(second)
    counts = await stack.sandbox.counts(guest)
    assert (counts["booking"], counts["booking_release"]) == (
        2,
        2,
    )  # the second run's unpaid hold is let go too


async def test_paying_again_after_a_decline_is_denied_once_the_hold_is_released_and_charges_nothing(
    stack: Stack,
) -> None:
    """The declined charge's hold is released before the model is asked again, and the policy never pays a
    released booking (`undone_effect`, slice P): the second ask is a denial, not a retry waiting for the
    guest. (The retry-with-approval key rule is pinned in tests/unit/test_identity.py.)"""
    guest = unique("guest")
    await stack.sandbox.arm("payments", decline=1)
    pay = 'obey: create_payment {"booking_id": "$booking_id"}'
    text = f"obey: create_booking {HOLD}\n{pay}\n{pay}"
    run_id = await stack.run(text, guest=guest, session=unique("sess"))
    events = await stack.ended(run_id)
    (declined,) = _completed(events, "create_payment")
    assert declined.status == OutcomeStatus.FAILED
    (denied,) = [e for e in events if isinstance(e, PolicyDenied)]
    assert (denied.tool, denied.rule) == ("create_payment", "undone_effect")
    assert [e for e in events if isinstance(e, ApprovalRequested)] == []
    assert len(_requested(events, "create_payment")) == 1  # the second ask never became a request
    ledger = await stack.sandbox.ledger(guest)
    assert [e for e in ledger["entries"] if e["kind"] == "charge"] == []  # a declined card moves no money


async def test_support_refunds_the_guests_own_payment(stack: Stack) -> None:
    guest = unique("guest")
    _, payment_id = await _booked_and_paid(stack, guest, unique("sess"))
    refund = f'obey: refund_payment {{"payment_id": "{payment_id}", "amount_cents": 1000}}'
    text = f"obey: find_payments {{}}\n{refund}\n{refund}"  # the second ask is the first refund's receipt
    events = await stack.ended(await stack.run(text, agent="support", guest=guest, session=unique("sess")))
    (found,) = _completed(events, "find_payments")
    assert [p["payment_id"] for p in found.result["payments"]] == [payment_id]
    refund, again = _completed(events, "refund_payment")
    assert refund.status == again.status == OutcomeStatus.SUCCEEDED, (refund, again)
    assert refund.key.startswith("refund:") and again.key == refund.key and again.via == Via.REPLAY
    refunds = [e for e in (await stack.sandbox.ledger(guest))["entries"] if e["kind"] == "refund"]
    assert [(r["amount_cents"], r["key"]) for r in refunds] == [(1000, refund.key)]


async def test_support_refuses_to_refund_another_guests_payment(stack: Stack) -> None:
    victim, attacker = unique("guest"), unique("guest")
    _, payment_id = await _booked_and_paid(stack, victim, unique("sess"))
    text = (
        "obey: find_payments {}\n"
        f'obey: refund_payment {{"payment_id": "{payment_id}", "amount_cents": 24000}}'
    )
    events = await stack.ended(await stack.run(text, agent="support", guest=attacker, session=unique("sess")))
    (found,) = _completed(events, "find_payments")
    assert found.result["payments"] == []  # the attacker's own payments: none
    assert _requested(events, "refund_payment") == []
    (refused,) = [e for e in events if isinstance(e, ToolRejected) and e.tool == "refund_payment"]
    assert refused.error.code == "unknown_payment"
    victims = (await stack.sandbox.ledger(victim))["entries"]
    assert [e for e in victims if e["kind"] == "refund"] == []
    assert json.dumps(refused.error.details).find(payment_id) >= 0


async def test_a_later_run_asking_a_paid_hold_again_never_releases_it(stack: Stack) -> None:
    """Run 1 holds and pays the room. The session's next run asks for the same hold (a re-planned call: it gets
    run 1's receipt) and ends without paying. That run never made the hold: ending it must not release the room
    the guest paid for in run 1."""
    guest, session = unique("guest"), unique("sess")
    first, _ = await _booked_and_paid(stack, guest, session)
    (hold,) = _completed(first, "create_booking")
    second = await stack.ended(await stack.run(f"obey: create_booking {HOLD}", guest=guest, session=session))
    (again,) = _completed(second, "create_booking")
    assert (again.key, again.via) == (hold.key, Via.REPLAY)
    assert _requested(second, "release_booking") == []
    counts = await stack.sandbox.counts(guest)
    assert (counts["booking"], counts["charge"], counts["booking_release"]) == (1, 1, 0)
    assert_replays(second)


async def test_a_refund_split_under_the_managers_limit_still_waits_for_the_manager(stack: Stack) -> None:
    """240.00 EUR paid. A hostile model refunds 140.00 and then 100.00: each is under the 150.00 a manager must
    approve, together they are not. The second waits for a manager; only the first reaches the provider."""
    guest = unique("guest")
    _, payment_id = await _booked_and_paid(stack, guest, unique("sess"))
    text = (
        "obey: find_payments {}\n"
        f'obey: refund_payment {{"payment_id": "{payment_id}", "amount_cents": 14000}}\n'
        f'obey: refund_payment {{"payment_id": "{payment_id}", "amount_cents": 10000}}'
    )
    run_id = await stack.run(text, agent="support", guest=guest, session=unique("sess"))
    events = await stack.waiting(run_id)
    (held,) = [e for e in events if isinstance(e, ApprovalRequested)]
    assert (held.tool, held.approver, held.amount_cents) == ("refund_payment", "manager", 10000)
    assert [r.args["amount_cents"] for r in _requested(events, "refund_payment")] == [14000]
    refunds = [e for e in (await stack.sandbox.ledger(guest))["entries"] if e["kind"] == "refund"]
    assert [r["amount_cents"] for r in refunds] == [14000]


async def test_stays_split_under_the_guests_limit_still_wait_for_the_guests_yes(stack: Stack) -> None:
    """A hostile model books twelve nights (1,440.00, under the 1,500.00 the guest must approve) and pays, then the
    next twelve (adjacent, so no overlapping hold) and pays again. Each payment is under the limit; what the run
    charges together is not: the second waits for the guest's yes, and only the first is charged."""
    guest = unique("guest")
    first = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-13"}'
    second = '{"hotel_id": "lis-1", "check_in": "2031-12-13", "check_out": "2031-12-25"}'
    pay = 'obey: create_payment {"booking_id": "$booking_id"}'
    text = f"obey: create_booking {first}\n{pay}\nobey: create_booking {second}\n{pay}"
    events = await stack.waiting(await stack.run(text, guest=guest, session=unique("sess")))
    (held,) = [e for e in events if isinstance(e, ApprovalRequested)]
    assert (held.tool, held.approver, held.amount_cents) == ("create_payment", "guest", 144000)
    assert "2,880.00 EUR" in held.question, held.question  # what the run would charge in all
    assert len(_requested(events, "create_payment")) == 1
    ledger = await stack.sandbox.ledger(guest)
    assert [e["amount_cents"] for e in ledger["entries"] if e["kind"] == "charge"] == [144000]


async def test_a_hold_another_run_is_still_waiting_to_pay_is_not_paid_by_a_second_run(stack: Stack) -> None:
    """Run 1 holds fourteen nights and waits for the guest's yes to pay 1,680.00. The guest's second session
    asks for the same room: run 2 gets run 1's hold from the store. Paying it there would leave run 1, which
    made the hold and never learns of run 2's charge, to release the paid room when its approval is refused or
    expires. Run 2 is told the hold is another conversation's; nothing is charged or asked."""
    guest = unique("guest")
    stay = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-15"}'
    text = f'obey: create_booking {stay}\nobey: create_payment {{"booking_id": "$booking_id"}}'
    first = await stack.run(text, guest=guest, session=unique("sess"))
    await stack.waiting(first)
    second = await stack.ended(await stack.run(text, guest=guest, session=unique("sess")))
    (again,) = _completed(second, "create_booking")
    assert again.via == Via.REPLAY
    assert [e for e in second if isinstance(e, ApprovalRequested)] == []
    (refused,) = [e for e in second if isinstance(e, ToolRejected) and e.tool == "create_payment"]
    assert first in refused.error.message, refused.error
    assert (await stack.sandbox.counts(guest))["charge"] == 0


async def test_a_call_allowed_in_the_same_answer_as_a_held_one_is_sent_while_the_run_waits(
    stack: Stack,
) -> None:
    """A model answer [search (allowed), payment above the guest's limit (held)]: the search was journaled as an
    intent before the approval was asked, so it must reach its executor now, not when the approval is decided
    (a manager's may take a day) or when the reconciler finds it overdue."""
    long_stay = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-15"}'
    search = '{"city": "Lisbon", "check_in": "2031-12-01", "check_out": "2031-12-15"}'
    text = (
        f"obey: create_booking {long_stay}\n"
        f"obey: search_hotels {search}\n"
        'obey+: create_payment {"booking_id": "$booking_id"}'
    )
    run_id = await stack.run(text, guest=unique("guest"), session=unique("sess"))
    events = await stack.waiting(run_id)
    assert [e.tool for e in events if isinstance(e, ApprovalRequested)] == ["create_payment"]
    assert len(_requested(events, "search_hotels")) == 1

    async def searched() -> list[ActionCompleted] | None:
        events, _ = await stack.journal.read(run_id)
        return _completed(events, "search_hotels") or None

    (done,) = await eventually(searched, what="the search asked next to the held payment to be answered")
    assert done.status == OutcomeStatus.SUCCEEDED
    state = replay((await stack.journal.read(run_id))[0])
    assert state is not None and state.awaiting is not None  # still waiting for the guest, as it should


async def test_a_later_run_handed_the_paid_hold_by_replay_never_releases_it(stack: Stack) -> None:
    """The first run holds and pays; the session's next run asks for the same room (the same business key) and
    is handed the stored "held" receipt, then ends without paying. Its own journal shows a hold and no payment,
    but the booking is the first run's, paid: releasing it would leave the guest charged for nothing."""
    guest, session = unique("guest"), unique("sess")
    await _booked_and_paid(stack, guest, session)
    second = await stack.ended(await stack.run(f"obey: create_booking {HOLD}", guest=guest, session=session))
    (again,) = _completed(second, "create_booking")
    assert again.via == Via.REPLAY and again.status == OutcomeStatus.SUCCEEDED
    assert _requested(second, "release_booking") == []
    counts = await stack.sandbox.counts(guest)
    assert (counts["booking"], counts["charge"], counts["booking_release"]) == (1, 1, 0)


async def test_the_audit_asks_a_tenants_keys_in_the_tenants_own_account(
    stack: Stack, nats_server: NatsServer
) -> None:
    """A tenant's run acts in its own provider account; the audit asks each of its keys there. Asked in the
    default account, a provider that keeps accounts apart answers "no such key", and every clean effect of every
    tenant would be reported as a success the provider does not hold (issue 17, guarantee 8)."""
    from crashsafe.services.operations.provider_audit import audit_all
    from crashsafe.services.providers.provider_calls import Providers

    event_id = unique("ev")
    text = f'obey: create_booking {HOLD}\nobey: create_payment {{"booking_id": "$booking_id"}}'
    run_id = await submit_inbound(
        stack.broker, stack.ns, event_id, agent="booking", text=text, guest_id="alice", tenant="demo"
    )
    events = await stack.ended(run_id)
    (paid,) = _completed(events, "create_payment")
    assert paid.status == OutcomeStatus.SUCCEEDED, paid
    keys = {r.key for r in _requested(events, "create_booking") + _requested(events, "create_payment")}
    assert {r.args.get("account") for r in _requested(events, "create_payment")} == {"demo"}
    settings = inprocess.settings_for(nats_server.url, stack.ns, sandbox_url=stack.sandbox.url)
    async with Providers.connect(stack.sandbox.url) as providers:
        findings, stats = await audit_all(stack.broker, settings, REGISTRY, providers)
    assert stats.looked_up >= len(keys)
    assert [f for f in findings if f.key in keys] == []
