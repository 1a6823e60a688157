"""A guest is (tenant, guest) at the providers (issue 17): every call naming a guest acts in the run's tenant's
provider account, a record of another tenant's guest of the same id is not the run's guest's, and the sandbox
providers keep accounts apart as a real provider does. Over a real stack: tests/e2e/test_tenancy.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.keys import GuestScope, action_key, tool_input_hash
from crashsafe.contracts.run_events import ActionRequested, Origin
from crashsafe.domain.policy_engine import check_policy
from crashsafe.domain.policy_verdicts import Deny
from crashsafe.sandbox.errors import NotFound
from crashsafe.sandbox.ledger import SandboxLedger
from crashsafe.sandbox.records import (
    BookingRequest,
    CrmUpdateRequest,
    EffectKind,
    EmailRequest,
    PaymentRequest,
    RefundRequest,
    ReleaseRequest,
)
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.services.agents.booking.booking_tools import CREATE_BOOKING, REFUND_PAYMENT
from crashsafe.services.agents.support.support_agent import SupportAgent
from crashsafe.services.agents.support.support_tools import FIND_PAYMENTS
from tests.support.runs import RUN, T0, Run, started

SUPPORT = SupportAgent()
# What the sandbox lists for guest alice of tenant demo: 240.00 EUR paid, nothing refunded.
DEMOS_ALICE = {
    "payment_id": "pay_1",
    "booking_id": "bk_1",
    "guest_id": "alice",
    "amount_cents": 24_000,
    "currency": "EUR",
    "status": "captured",
    "refunded_cents": 0,
    "account": "demo",
}


def run_of(tenant: str, scope: str = GuestScope.TENANT, agent: str = "support") -> Run:
    first = started(agent=agent)
    return Run(msgspec.structs.replace(first, tenant=tenant, guest_id="alice", guest_scope=scope))


def listed(run: Run, payments: list[dict[str, Any]]) -> Run:
    """The run's `find_payments`, answered with `payments` (what the provider listed)."""
    step = run.state.next_step
    args = SUPPORT.prepare(run.state, FIND_PAYMENTS.contract, {})
    assert isinstance(args, dict)
    run.add(
        ActionRequested(
            run_id=RUN,
            at=run.tick(),
            step_no=step,
            call_id=f"call_{step}",
            tool="find_payments",
            family="payment",
            args=args,
            key=action_key(RUN, step),
            input_hash=tool_input_hash("find_payments", args),
            timeout_s=2.0,
            deadline_at=run.now + timedelta(seconds=2),
        )
    )
    run.complete(step, result={"payments": payments})
    return run


def test_every_call_naming_the_guest_acts_in_the_runs_tenants_account() -> None:
    evil = run_of("evil").state
    assert SUPPORT.prepare(evil, FIND_PAYMENTS.contract, {}) == {"guest_id": "alice", "account": "evil"}
    booking = run_of("evil", agent="booking").state
    hold = BookingAgent().prepare(
        booking,
        CREATE_BOOKING.contract,
        {"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"},
    )
    assert isinstance(hold, dict) and (hold["guest_id"], hold["account"]) == ("alice", "evil")


def test_a_run_journaled_before_tenant_accounts_prepares_what_its_journal_holds() -> None:
    """Replay: a run whose run.started has no guest scope keeps the arguments it journaled (no account)."""
    old = run_of("demo", scope=GuestScope.GUEST).state
    assert SUPPORT.prepare(old, FIND_PAYMENTS.contract, {}) == {"guest_id": "alice"}


def test_another_tenants_guest_of_the_same_id_is_not_this_runs_guest() -> None:
    """Issue 17: evil's run for "alice" was shown demo's alice's payment (a provider that did not keep accounts
    apart) and refunded it, since ownership compared the guest id alone."""
    evil = listed(run_of("evil"), [DEMOS_ALICE])
    asked = {"payment_id": "pay_1", "amount_cents": 15_000}
    refused = SUPPORT.prepare(evil.state, REFUND_PAYMENT.contract, asked)
    assert isinstance(refused, ErrorInfo) and refused.code == "unknown_payment"
    args = {**asked, "currency": "EUR", "booking_id": "bk_1", "guest_id": "alice", "account": "evil"}
    verdict = check_policy(
        evil.state,
        SUPPORT.config,
        REFUND_PAYMENT.contract,
        args,
        tool_input_hash("refund_payment", args),
        Origin.MODEL,
        T0,
    )
    assert isinstance(verdict, Deny) and "not one of this guest's" in verdict.reason


def test_the_tenants_own_guest_is_refunded_in_its_own_account() -> None:
    demo = listed(run_of("demo"), [DEMOS_ALICE])
    prepared = SUPPORT.prepare(
        demo.state, REFUND_PAYMENT.contract, {"payment_id": "pay_1", "amount_cents": 9_000}
    )
    assert isinstance(prepared, dict) and prepared["account"] == "demo" and prepared["amount_cents"] == 9_000


# The sandbox providers keep accounts apart --------------------------------------------------------------------


def demo_paid(ledger: SandboxLedger) -> tuple[str, str]:
    hold = BookingRequest("lis-1", "alice", "2031-12-01", "2031-12-03", account="demo")
    booking = ledger.create_booking("k-hold", hold).record
    charge = PaymentRequest(booking.booking_id, "alice", booking.total_cents, "EUR", account="demo")
    return booking.booking_id, ledger.create_payment("k-pay", charge).record.payment_id


def test_a_provider_call_in_another_account_finds_nothing_of_the_guest() -> None:
    ledger = SandboxLedger(now=lambda: datetime(2026, 12, 1, tzinfo=UTC))
    booking_id, payment_id = demo_paid(ledger)
    assert ledger.payments_of("alice", "evil") == []
    assert [p.payment_id for p in ledger.payments_of("alice", "demo")] == [payment_id]
    for attempt in (
        lambda: ledger.refund_payment("k-r", RefundRequest(payment_id, 15_000, account="evil")),
        lambda: ledger.refund_payment("k-r2", RefundRequest(payment_id, 15_000)),  # the default account
        lambda: ledger.release_booking("k-rel", ReleaseRequest(booking_id, account="evil")),
        lambda: ledger.send_email(
            "k-em", EmailRequest("alice", "booking_confirmation", booking_id, account="evil")
        ),
        lambda: ledger.update_crm("k-crm", CrmUpdateRequest("alice", booking_id, account="evil")),
    ):
        with pytest.raises(NotFound):
            attempt()
    assert ledger.payments_of("alice", "demo")[0].refunded_cents == 0
    refunded = ledger.refund_payment("k-r3", RefundRequest(payment_id, 9_000, account="demo")).record
    assert (refunded.account, ledger.payments_of("alice", "demo")[0].refunded_cents) == ("demo", 9_000)


# A record in the providers' default account (issue 31, "planted bugs the suite misses") -------------------------


def default_account_paid(ledger: SandboxLedger) -> tuple[str, str]:
    """Alice's booking and payment in the providers' default account (a run from before tenants, the hotel's
    own website): same guest id as the tenant's guest, and no account of its own."""
    hold = BookingRequest("lis-1", "alice", "2031-12-01", "2031-12-03")
    booking = ledger.create_booking("k-old-hold", hold).record
    charge = PaymentRequest(booking.booking_id, "alice", booking.total_cents, "EUR")
    return booking.booking_id, ledger.create_payment("k-old-pay", charge).record.payment_id


def test_a_record_in_the_default_account_is_not_found_from_a_tenants_account() -> None:
    """The other direction of the test above: a record with no account is the default account's, never the
    asker's. Every listing a tenant's call makes names its account, so treating "no account" as the asker's own
    would hand demo's run the default account's alice (and let it refund her)."""
    ledger = SandboxLedger(now=lambda: datetime(2026, 12, 1, tzinfo=UTC))
    booking_id, payment_id = default_account_paid(ledger)
    assert ledger.payments_of("alice", "demo") == []
    with pytest.raises(NotFound):
        ledger.lookup(EffectKind.CHARGE, "k-old-pay", account="demo")
    for attempt in (
        lambda: ledger.refund_payment("k-r", RefundRequest(payment_id, 15_000, account="demo")),
        lambda: ledger.release_booking("k-rel", ReleaseRequest(booking_id, account="demo")),
        lambda: ledger.create_payment(
            "k-pay2", PaymentRequest(booking_id, "alice", 1, "EUR", account="demo")
        ),
        lambda: ledger.send_email(
            "k-em", EmailRequest("alice", "booking_confirmation", booking_id, account="demo")
        ),
        lambda: ledger.update_crm("k-crm", CrmUpdateRequest("alice", booking_id, account="demo")),
    ):
        with pytest.raises(NotFound):
            attempt()
    (own,) = ledger.payments_of("alice")
    assert (own.payment_id, own.refunded_cents) == (payment_id, 0), "the default account's alice untouched"


def test_a_tenants_run_shown_a_default_account_record_of_its_guests_id_never_takes_it_for_its_own() -> None:
    """A listing answered with the default account's alice (a provider that does not keep accounts apart, a
    lagging one): the record names no account, exactly as the sandbox writes it. A tenant's run may not refund it
    (the agent's `prepare` and the policy both refuse); a run from before tenants, in the default account, may."""
    ledger = SandboxLedger(now=lambda: datetime(2026, 12, 1, tzinfo=UTC))
    _, payment_id = default_account_paid(ledger)
    (record,) = msgspec.json.decode(msgspec.json.encode(ledger.payments_of("alice")))
    assert "account" not in record and record["guest_id"] == "alice"
    asked = {"payment_id": payment_id, "amount_cents": 15_000}
    demo = listed(run_of("demo"), [record])
    refused = SUPPORT.prepare(demo.state, REFUND_PAYMENT.contract, asked)
    assert isinstance(refused, ErrorInfo) and refused.code == "unknown_payment"
    args = {
        **asked,
        "currency": "EUR",
        "booking_id": record["booking_id"],
        "guest_id": "alice",
        "account": "demo",
    }
    verdict = check_policy(
        demo.state,
        SUPPORT.config,
        REFUND_PAYMENT.contract,
        args,
        tool_input_hash("refund_payment", args),
        Origin.MODEL,
        T0,
    )
    assert isinstance(verdict, Deny) and "not one of this guest's" in verdict.reason
    before_tenants = listed(run_of("demo", scope=GuestScope.GUEST), [record])
    prepared = SUPPORT.prepare(before_tenants.state, REFUND_PAYMENT.contract, asked)
    assert isinstance(prepared, dict) and "account" not in prepared and prepared["payment_id"] == payment_id
