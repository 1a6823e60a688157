"""The analytics example's fold: bookings and revenue per hour, each effect counted once per action key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    JournalEvent,
    RunCompleted,
    decode_event,
    event_encoder,
)
from crashsafe.contracts.tool_messages import OutcomeStatus, Via
from crashsafe.examples.analytics.core import Figures, fold, hour_of, rows, totals

pytestmark = pytest.mark.unit

T0 = datetime(2031, 5, 1, 9, 58, tzinfo=UTC)


def _request(run_id: str, step: int, tool: str, key: str, at: datetime, **args: Any) -> ActionRequested:
    return ActionRequested(
        run_id=run_id,
        at=at,
        step_no=step,
        call_id=f"call_{step}",
        tool=tool,
        family="payment" if "payment" in tool else "booking",
        args=args,
        key=key,
        input_hash="h",
        timeout_s=5.0,
        deadline_at=at + timedelta(minutes=1),
    )


def _done(
    run_id: str,
    step: int,
    key: str,
    at: datetime,
    status: str = "succeeded",
    via: str = Via.CALL.value,
    **result: Any,
) -> ActionCompleted:
    return ActionCompleted(
        run_id=run_id, at=at, step_no=step, key=key, status=OutcomeStatus(status), result=result, via=via
    )


def booking_run(run_id: str, at: datetime, cents: int = 24_000, currency: str = "EUR") -> list[JournalEvent]:
    """A hold and its charge, receipts a minute after each request."""
    hold, charge = f"hold:{run_id}", f"charge:{run_id}"
    return [
        _request(run_id, 2, "create_booking", hold, at, hotel_id="lis-1"),
        _done(run_id, 2, hold, at + timedelta(minutes=1), booking_id=f"bk_{run_id}", total_cents=cents),
        _request(
            run_id,
            4,
            "create_payment",
            charge,
            at,
            booking_id=f"bk_{run_id}",
            amount_cents=cents,
            currency=currency,
        ),
        _done(
            run_id,
            4,
            charge,
            at + timedelta(minutes=1),
            payment_id=f"pay_{run_id}",
            amount_cents=cents,
            currency=currency,
        ),
        RunCompleted(run_id=run_id, at=at + timedelta(minutes=2), reply="Booked."),
    ]


def folded(events: list[JournalEvent | None]) -> Figures:
    figures = Figures()
    for seq, event in enumerate(events, start=1):
        fold(figures, event, seq)
    return figures


def test_a_paid_booking_is_one_booking_and_its_charge_in_the_hour_of_its_receipt() -> None:
    figures = folded([*booking_run("r1", T0)])
    (hour,) = rows(figures)
    assert hour.hour == hour_of(T0 + timedelta(minutes=1)) == "2031-05-01T09:00Z"
    assert (hour.bookings, hour.payments, hour.declined, hour.refunds) == (1, 1, 0, 0)
    assert hour.revenue_cents == {"EUR": 24_000}


def test_receipts_fall_in_the_hour_they_were_journaled_not_the_hour_of_the_request() -> None:
    figures = folded([*booking_run("r1", T0 + timedelta(minutes=1))])  # requests 09:59, receipts 10:00
    (hour,) = rows(figures)
    assert hour.hour == "2031-05-01T10:00Z"


def test_a_declined_charge_is_counted_as_declined_and_moves_no_money() -> None:
    events = booking_run("r1", T0)
    declined = _done("r1", 4, "charge:r1", T0, status="failed", payment_id="pay_r1", amount_cents=24_000)
    release = _request("r1", 5, "release_booking", "release:r1", T0, booking_id="bk_r1")
    figures = folded([*events[:3], declined, release, _done("r1", 5, "release:r1", T0, booking_id="bk_r1")])
    (hour,) = rows(figures)
    assert (hour.bookings, hour.released, hour.payments, hour.declined) == (1, 1, 0, 1)
    assert hour.revenue_cents == {}


def test_refunds_come_off_revenue_in_their_own_hour_and_currency() -> None:
    later = T0 + timedelta(hours=2)
    refund = [
        _request("r2", 3, "refund_payment", "refund:r1", later, payment_id="pay_r1", amount_cents=500),
        _done("r2", 3, "refund:r1", later, refund_id="re_1", amount_cents=500, currency="EUR"),
    ]
    figures = folded([*booking_run("r1", T0), *booking_run("r3", T0, 9_000, "USD"), *refund])
    by_hour = {r.hour: r for r in rows(figures)}
    assert by_hour["2031-05-01T09:00Z"].revenue_cents == {"EUR": 24_000, "USD": 9_000}
    assert by_hour["2031-05-01T11:00Z"].revenue_cents == {"EUR": -500}
    total = totals(figures)
    assert (total.bookings, total.payments, total.refunds) == (2, 2, 1)
    assert total.revenue_cents == {"EUR": 23_500, "USD": 9_000}


def test_one_key_is_one_effect_however_many_receipts_name_it() -> None:
    """A second run asking for the same hold gets the first hold's receipt replayed: one booking, as the
    provider's ledger holds one; so does a step's receipt journaled again after a resume."""
    first = booking_run("r1", T0)
    again = [
        _request("r9", 2, "create_booking", "hold:r1", T0, hotel_id="lis-1"),
        _done("r9", 2, "hold:r1", T0, via=Via.REPLAY.value, booking_id="bk_r1"),
    ]
    figures = folded([*first, *again, first[3]])
    assert (totals(figures).bookings, totals(figures).payments) == (1, 1)


def test_an_unknown_outcome_waits_and_its_later_resolution_counts_once() -> None:
    events = booking_run("r1", T0)
    unknown = _done("r1", 4, "charge:r1", T0, status="unknown")
    figures = folded([*events[:3], unknown])
    assert totals(figures).payments == 0
    fold(figures, events[3], 9)
    fold(figures, events[3], 10)
    assert (totals(figures).payments, totals(figures).revenue_cents) == (1, {"EUR": 24_000})


def test_unknown_types_and_undecodable_deliveries_are_skipped_never_raised() -> None:
    newer = decode_event(b'{"type":"run.from_the_future","run_id":"r1","at":"2031-05-01T09:00:00Z","x":1}')
    figures = folded([newer, None, *booking_run("r1", T0)])
    assert (figures.unknown, figures.undecodable, totals(figures).bookings) == (1, 1, 1)


@pytest.mark.parametrize("hostile", ["240.00", True, -5, None, {"cents": 1}])
def test_a_receipt_with_an_unusable_amount_falls_back_to_the_request(hostile: object) -> None:
    events = booking_run("r1", T0)
    odd = _done("r1", 4, "charge:r1", T0, payment_id="pay_r1", amount_cents=hostile, currency=["EUR"])
    assert totals(folded([*events[:3], odd])).revenue_cents == {"EUR": 24_000}


def test_a_charge_with_no_usable_amount_anywhere_is_counted_unpriced() -> None:
    request = _request("r1", 4, "create_payment", "charge:r1", T0, booking_id="bk_r1", amount_cents="a lot")
    total = totals(folded([request, _done("r1", 4, "charge:r1", T0, amount_cents=None)]))
    assert (total.payments, total.unpriced, total.revenue_cents) == (1, 1, {})


def test_the_state_survives_its_file() -> None:
    figures = folded([*booking_run("r1", T0), *booking_run("r2", T0, 100, "GBP")])
    encoded = msgspec.json.encode(figures)
    again = msgspec.json.decode(encoded, type=Figures)
    assert rows(again) == rows(figures) and again.settled == figures.settled


def _journal(i: int) -> list[JournalEvent]:
    # Events cross the wire as JSON: decode them as the consumer does.
    return [
        decode_event(event_encoder.encode(e)) for e in booking_run(f"r{i}", T0 + timedelta(minutes=37 * i))
    ]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_redelivery_in_any_order_gives_the_same_figures(data: st.DataObject) -> None:
    """After a crash, a durable redelivers what was not acknowledged, possibly after newer events: folding any
    sequence that contains every event at least once gives the figures of folding the journal once."""
    events = [e for i in range(4) for e in _journal(i)]
    once = folded(list(events))
    extra = data.draw(st.lists(st.sampled_from(events), max_size=12))
    shuffled = data.draw(st.permutations([*events, *extra]))
    assert rows(folded(list(shuffled))) == rows(once)
