"""The sandbox is the world crash tests measure against, so its idempotency, faults and script must be exact.

The pure cores here; the HTTP shell over real HTTP is in tests/integration/test_sandbox_http.py."""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.sandbox import scripted_model
from crashsafe.sandbox.books import SqliteBooks
from crashsafe.sandbox.errors import (
    ErrorCode,
    EventIdConflict,
    IdempotencyConflict,
    InvalidRequest,
    KeyExpired,
    MissingIdempotencyKey,
    NotFound,
    SandboxError,
)
from crashsafe.sandbox.faults import AfterCommit, ChargeFate, FaultBoard, FaultSpec, FaultTarget, Refusal
from crashsafe.sandbox.ledger import HOTELS, SandboxLedger
from crashsafe.sandbox.records import (
    AuditBatch,
    AuditRecordIn,
    BookingRequest,
    CrmUpdateRequest,
    EffectKind,
    EmailRequest,
    Payment,
    PaymentRequest,
    RefundRequest,
    ReleaseRequest,
)
from tests.support.paths import ROOT
from tests.support.world import BOOKING_TEXT as LISBON
from tests.support.world import BOOKING_TOOLS as TOOL_NAMES
from tests.support.world import OFFERED_TOOLS as TOOLS

SANDBOX_DIR = ROOT / "sandbox"


class Clock:
    """A clock that advances one second per reading, so ledger timestamps are predictable."""

    def __init__(self) -> None:
        self.t = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.t += timedelta(seconds=1)
        return self.t


def new_ledger() -> SandboxLedger:
    return SandboxLedger(now=Clock())


def lisbon_booking(guest: str = "g1", hotel: str = "lis-1") -> BookingRequest:
    return BookingRequest(hotel_id=hotel, guest_id=guest, check_in="2031-12-01", check_out="2031-12-03")


# Pure core: ledger


def test_catalogue_has_two_or_more_hotels_in_each_demo_city() -> None:
    for city in ("Lisbon", "Berlin", "Paris"):
        assert len([h for h in HOTELS if h.city == city and h.available]) >= 2


def test_search_is_case_insensitive_and_unknown_city_is_empty() -> None:
    ledger = new_ledger()
    assert [h.hotel_id for h in ledger.search("  LISBON ")] == ["lis-1", "lis-2", "lis-3"]
    assert ledger.search("Atlantis") == []
    with pytest.raises(InvalidRequest) as bad:
        ledger.search("Lisbon", "2031-12-03", "2031-12-01")
    assert bad.value.code is ErrorCode.INVALID_DATES


def test_booking_computes_nights_and_total_from_the_nightly_rate() -> None:
    outcome = new_ledger().create_booking("k1", lisbon_booking())
    assert not outcome.replayed
    booking = outcome.record
    assert (booking.nights, booking.total_cents, booking.currency, booking.status) == (
        2,
        24000,
        "EUR",
        "held",
    )
    assert (booking.hotel_name, booking.city, booking.key) == ("Casa do Alfama", "Lisbon", "k1")


@pytest.mark.parametrize(
    ("check_in", "check_out"),
    [("2031-12-03", "2031-12-01"), ("2031-12-01", "2031-12-01"), ("soon", "2031-12-01")],
)
def test_booking_refuses_stays_that_do_not_end_after_they_start(check_in: str, check_out: str) -> None:
    ledger = new_ledger()
    with pytest.raises(InvalidRequest) as refused:
        ledger.create_booking("k1", BookingRequest("lis-1", "g1", check_in, check_out))
    assert refused.value.code is ErrorCode.INVALID_DATES
    assert ledger.view().entries == []


def test_replay_with_same_key_and_body_returns_the_record_without_a_second_effect() -> None:
    ledger = new_ledger()
    first = ledger.create_booking("k1", lisbon_booking())
    again = ledger.create_booking("k1", lisbon_booking())
    assert again.replayed and again.record == first.record
    view = ledger.view()
    assert view.counts["booking"] == 1 and view.replays["booking"] == 1


def test_same_key_with_a_different_body_is_a_typed_conflict() -> None:
    ledger = new_ledger()
    ledger.create_booking("k1", lisbon_booking())
    with pytest.raises(IdempotencyConflict) as conflict:
        ledger.create_booking("k1", lisbon_booking(hotel="lis-2"))
    assert conflict.value.key == "k1"
    assert conflict.value.to_body()["error"]["code"] == "idempotency_conflict"
    assert ledger.view().counts["booking"] == 1


def test_a_refused_write_stores_nothing_so_the_key_stays_usable() -> None:
    ledger = new_ledger()
    with pytest.raises(NotFound):
        ledger.create_booking("k1", lisbon_booking(hotel="nope-1"))
    assert ledger.create_booking("k1", lisbon_booking()).replayed is False


def test_keys_are_required_and_live_in_one_namespace_per_effect_kind() -> None:
    ledger = new_ledger()
    with pytest.raises(MissingIdempotencyKey):
        ledger.create_booking("", lisbon_booking())
    booking = ledger.create_booking("same", lisbon_booking()).record
    payment = ledger.create_payment("same", PaymentRequest(booking.booking_id, "g1", 24000, "EUR")).record
    assert payment.payment_id.startswith("pay_")


def test_payment_must_match_the_booking_total_guest_and_currency() -> None:
    ledger = new_ledger()
    booking = ledger.create_booking("b", lisbon_booking()).record
    cases = [
        (PaymentRequest(booking.booking_id, "g1", 1), ErrorCode.AMOUNT_MISMATCH),
        (PaymentRequest(booking.booking_id, "g1", 24000, "USD"), ErrorCode.CURRENCY_MISMATCH),
        (PaymentRequest(booking.booking_id, "intruder", 24000), ErrorCode.GUEST_MISMATCH),
        (PaymentRequest("bk_missing", "g1", 24000), ErrorCode.BOOKING_NOT_FOUND),
    ]
    for body, code in cases:
        with pytest.raises(SandboxError) as refused:
            ledger.create_payment("p", body)
        assert refused.value.code is code
    payment = ledger.create_payment("p", PaymentRequest(booking.booking_id, "g1", 24000)).record
    assert (payment.amount_cents, payment.currency, payment.status) == (24000, "EUR", "captured")
    assert ledger.view().counts["charge"] == 1


def test_released_booking_cannot_be_paid_and_lookup_shows_current_state() -> None:
    ledger = new_ledger()
    created = ledger.create_booking("b", lisbon_booking()).record
    released = ledger.release_booking("r", ReleaseRequest(created.booking_id))
    assert released.record.status == "released"
    assert ledger.release_booking("r", ReleaseRequest(created.booking_id)).replayed
    with pytest.raises(SandboxError) as refused:
        ledger.create_payment("p", PaymentRequest(created.booking_id, "g1", 24000))
    assert refused.value.code is ErrorCode.BOOKING_RELEASED
    # A replay answers with the saved response; a lookup answers with the resource as it is now.
    assert ledger.create_booking("b", lisbon_booking()).record.status == "held"
    assert ledger.lookup(EffectKind.BOOKING, "b").status == "released"
    with pytest.raises(NotFound) as missing:
        ledger.lookup(EffectKind.BOOKING, "never-sent")
    assert missing.value.code is ErrorCode.KEY_NOT_FOUND


def test_refunds_are_bounded_by_what_was_paid() -> None:
    ledger = new_ledger()
    booking = ledger.create_booking("b", lisbon_booking()).record
    payment = ledger.create_payment("p", PaymentRequest(booking.booking_id, "g1", 24000)).record
    assert ledger.refund_payment("r1", RefundRequest(payment.payment_id, 4000)).record.amount_cents == 4000
    with pytest.raises(InvalidRequest) as refused:
        ledger.refund_payment("r2", RefundRequest(payment.payment_id, 30000))
    assert refused.value.code is ErrorCode.REFUND_EXCEEDS_PAYMENT
    assert ledger.refund_payment("r3", RefundRequest(payment.payment_id)).record.amount_cents == 20000
    with pytest.raises(NotFound):
        ledger.refund_payment("r4", RefundRequest("pay_missing"))


def test_ledger_records_every_effect_in_order_with_the_injected_clock() -> None:
    ledger = new_ledger()
    booking = ledger.create_booking("b", lisbon_booking()).record
    ledger.create_payment("p", PaymentRequest(booking.booking_id, "g1", 24000))
    ledger.send_email("e", EmailRequest("g1", "booking_confirmation", booking.booking_id))
    ledger.update_crm("c", CrmUpdateRequest("g1", booking.booking_id, {"a": 1, "b": 2}))
    # CRM fields in another order are the same body, not a conflict.
    assert ledger.update_crm("c", CrmUpdateRequest("g1", booking.booking_id, {"b": 2, "a": 1})).replayed
    ledger.create_booking("other", lisbon_booking(guest="g2"))

    view = ledger.view(guest_id="g1")
    assert [e.kind for e in view.entries] == ["booking", "charge", "email", "crm_update"]
    assert [e.at for e in view.entries] == [f"2026-01-01T00:00:0{s}.000Z" for s in (1, 2, 3, 4)]
    assert view.entries[1].amount_cents == 24000 and view.entries[1].ref.startswith("pay_")
    assert view.counts == {
        "booking": 1,
        "booking_release": 0,
        "charge": 1,
        "refund": 0,
        "email": 1,
        "crm_update": 1,
    }
    assert ledger.view().counts["booking"] == 2
    ledger.reset()
    assert ledger.view().entries == []


def test_durable_books_remember_every_effect_key_and_state_across_a_restart(tmp_path: Path) -> None:
    """A second ledger over the same file is the provider after a restart: the same records, entries and keys."""
    clock = Clock()
    books = SqliteBooks.in_dir(tmp_path)
    ledger = SandboxLedger(now=clock, books=books)
    booking = ledger.create_booking("b", lisbon_booking()).record
    payment = ledger.create_payment("p", PaymentRequest(booking.booking_id, "g1", 24000)).record
    ledger.refund_payment("r", RefundRequest(payment.payment_id, 4000))
    other = ledger.create_booking("b2", lisbon_booking(guest="g2")).record
    ledger.release_booking("rel", ReleaseRequest(other.booking_id))
    ledger.update_crm("c", CrmUpdateRequest("g1", booking.booking_id, {"a": 1}))
    before = ledger.view()
    books.close()

    reborn = SandboxLedger(now=clock, books=SqliteBooks.in_dir(tmp_path))

    assert reborn.view().entries == before.entries
    assert reborn.lookup(EffectKind.CHARGE, "p") == payment
    assert reborn.lookup(EffectKind.BOOKING, "b2").status == "released"  # the resource as it is now
    again = reborn.create_payment("p", PaymentRequest(booking.booking_id, "g1", 24000))
    assert again.replayed and again.record == payment  # the key is remembered: no second charge
    with pytest.raises(IdempotencyConflict):
        reborn.create_booking("b", lisbon_booking(hotel="lis-2"))
    with pytest.raises(InvalidRequest) as refused:  # what was refunded is remembered too
        reborn.refund_payment("r2", RefundRequest(payment.payment_id, 20001))
    assert refused.value.code is ErrorCode.REFUND_EXCEEDS_PAYMENT
    assert reborn.view().counts == before.counts
    reborn.reset()
    assert SandboxLedger(now=clock, books=SqliteBooks.in_dir(tmp_path)).view().entries == []


def test_a_second_crm_update_of_one_guest_and_booking_under_another_key_answers_the_first_record() -> None:
    """The CRM's identity of a record is (guest, booking): a projection re-planned under a new key, or an in-run
    step of a run in flight across the deploy and then its projection, still make one record."""
    ledger = new_ledger()
    booking = ledger.create_booking("b", lisbon_booking()).record
    first = ledger.update_crm("crm:one", CrmUpdateRequest("g1", booking.booking_id, {"stage": "booked"}))
    second = ledger.update_crm("crm:two", CrmUpdateRequest("g1", booking.booking_id, {"stage": "paid"}))

    assert not first.replayed and second.replayed and second.record == first.record
    assert ledger.view().counts["crm_update"] == 1 and ledger.view().replays["crm_update"] == 1
    assert ledger.lookup(EffectKind.CRM_UPDATE, "crm:two") == first.record  # the second key finds it too
    again = ledger.update_crm("crm:two", CrmUpdateRequest("g1", booking.booking_id, {"stage": "paid"}))
    assert again.replayed and again.record == first.record
    with pytest.raises(IdempotencyConflict):  # each key still means one body
        ledger.update_crm("crm:two", CrmUpdateRequest("g1", booking.booking_id, {"stage": "other"}))
    # Another booking of the guest, or no booking at all, is a record of its own.
    other = ledger.create_booking("b2", lisbon_booking(hotel="lis-2")).record
    assert not ledger.update_crm("crm:three", CrmUpdateRequest("g1", other.booking_id)).replayed
    assert not ledger.update_crm("crm:four", CrmUpdateRequest("g1")).replayed
    assert not ledger.update_crm("crm:five", CrmUpdateRequest("g1")).replayed
    assert ledger.view().counts["crm_update"] == 4


def event(run_id: str, n: int, kind: str = "run.nudged", **fields: Any) -> AuditRecordIn:
    return AuditRecordIn(
        event_id=f"{run_id}/{n}",
        run_id=run_id,
        tenant="stayhub",
        type=kind,
        at=f"2026-01-01T00:00:{n:02d}Z",
        event={"type": kind, "run_id": run_id, **fields},
    )


def trail(run_id: str, upto: int, guest: str = "g1") -> AuditBatch:
    return AuditBatch(
        [event(run_id, 1, "run.started", guest_id=guest), *(event(run_id, n) for n in range(2, upto + 1))]
    )


def test_the_audit_trail_keeps_each_event_id_once_whatever_is_resent() -> None:
    ledger = new_ledger()
    assert ledger.record_audit(trail("run_a", 3)).accepted == 3
    # The next flush re-sends the prefix with the new events: only the new ones are taken.
    answer = ledger.record_audit(trail("run_a", 5))
    assert (answer.accepted, answer.duplicates) == (2, 3)
    assert ledger.record_audit(trail("run_a", 5)).accepted == 0
    # A batch repeating one event (keys of its body in another order: the same event) takes it once.
    reordered = AuditRecordIn("run_b/1", "run_b", "stayhub", "run.nudged", "t", {"b": 2, "a": 1})
    batch = AuditBatch([reordered, msgspec.structs.replace(reordered, event={"a": 1, "b": 2})])
    assert ledger.record_audit(batch) == msgspec.convert({"accepted": 1, "duplicates": 1}, type(answer))

    assert [r.event_id for r in ledger.audit_records("run_a")] == [f"run_a/{n}" for n in range(1, 6)]
    view = ledger.view()
    assert (view.audit_records, view.audit_duplicates) == (6, 3 + 5 + 1)
    assert view.entries == [] and sum(view.counts.values()) == 0  # an audit record is no effect with a key
    assert {e.event_id for e in ledger.view(guest_id="g1").audit} == {f"run_a/{n}" for n in range(1, 6)}


def test_an_event_id_resent_with_another_body_refuses_the_whole_batch() -> None:
    ledger = new_ledger()
    ledger.record_audit(trail("run_a", 2))
    forged = msgspec.structs.replace(event("run_a", 2), type="run.completed")
    with pytest.raises(EventIdConflict) as clash:
        ledger.record_audit(AuditBatch([event("run_a", 3), forged]))
    assert clash.value.code is ErrorCode.EVENT_ID_CONFLICT and clash.value.event_id == "run_a/2"
    assert [r.event_id for r in ledger.audit_records("run_a")] == ["run_a/1", "run_a/2"]  # run_a/3 not taken
    # A clash inside one batch is refused the same way.
    with pytest.raises(EventIdConflict):
        ledger.record_audit(AuditBatch([event("run_c", 1), event("run_c", 1, "run.completed")]))
    assert ledger.audit_records("run_c") == []


@pytest.mark.parametrize("event_id", ["run_a", "run_b/1", "run_a/0", "run_a/x", "run_a/-1", "/1"])
def test_an_event_id_must_name_a_position_in_its_own_runs_journal(event_id: str) -> None:
    ledger = new_ledger()
    with pytest.raises(InvalidRequest):
        ledger.record_audit(AuditBatch([msgspec.structs.replace(event("run_a", 1), event_id=event_id)]))
    assert ledger.view().audit == []


def test_durable_books_remember_audit_records_and_crm_identities_across_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    books = SqliteBooks.in_dir(tmp_path)
    ledger = SandboxLedger(now=clock, books=books)
    booking = ledger.create_booking("b", lisbon_booking()).record
    crm = ledger.update_crm("crm:one", CrmUpdateRequest("g1", booking.booking_id)).record
    ledger.record_audit(trail("run_a", 4))
    books.close()

    reborn = SandboxLedger(now=clock, books=SqliteBooks.in_dir(tmp_path))

    assert reborn.update_crm("crm:two", CrmUpdateRequest("g1", booking.booking_id)).record == crm
    assert reborn.view().counts["crm_update"] == 1
    assert reborn.record_audit(trail("run_a", 6)).accepted == 2
    with pytest.raises(EventIdConflict):
        reborn.record_audit(AuditBatch([event("run_a", 3, "run.completed")]))
    assert [r.event_id for r in reborn.audit_records("run_a")] == [f"run_a/{n}" for n in range(1, 7)]
    assert reborn.view(guest_id="g1").audit_records == 6
    reborn.reset()
    assert SandboxLedger(now=clock, books=SqliteBooks.in_dir(tmp_path)).view().audit == []


def test_a_key_past_the_retention_window_is_looked_up_as_expired_and_is_new_to_a_write() -> None:
    clock = Clock()  # one second per reading
    ledger = SandboxLedger(now=clock, retention=timedelta(seconds=5))
    first = ledger.create_booking("b", lisbon_booking()).record
    assert ledger.lookup(EffectKind.BOOKING, "b") == first
    clock.t += timedelta(seconds=10)

    with pytest.raises(KeyExpired) as expired:
        ledger.lookup(EffectKind.BOOKING, "b")
    assert expired.value.code is ErrorCode.KEY_EXPIRED
    assert expired.value.to_body()["error"] | {"message": ""} == {
        "type": "invalid_request_error",
        "code": "key_expired",
        "message": "",
        "key": "b",
        "kind": "booking",
        "retention_s": 5,
    }
    # Like Stripe after 24 h: the provider no longer knows the key, so the same key makes a second effect.
    assert not ledger.create_booking("b", lisbon_booking()).replayed
    assert ledger.view().counts["booking"] == 2


def test_a_lagging_lookup_says_no_such_key_until_the_lag_has_passed() -> None:
    clock = Clock()
    ledger = SandboxLedger(now=clock)
    ledger.create_booking("b", lisbon_booking())
    with pytest.raises(NotFound) as lagging:
        ledger.lookup(EffectKind.BOOKING, "b", lag=timedelta(seconds=30))
    assert lagging.value.code is ErrorCode.KEY_NOT_FOUND
    clock.t += timedelta(seconds=30)
    assert ledger.lookup(EffectKind.BOOKING, "b", lag=timedelta(seconds=30)).key == "b"


def test_a_declined_charge_is_a_record_that_moved_no_money() -> None:
    ledger = new_ledger()
    booking = ledger.create_booking("b", lisbon_booking()).record
    declined = ledger.create_payment(
        "p", PaymentRequest(booking.booking_id, "g1", 24000), ChargeFate.DECLINED
    )
    assert declined.record.status == "declined"
    assert ledger.lookup(EffectKind.CHARGE, "p").status == "declined"
    assert ledger.create_payment("p", PaymentRequest(booking.booking_id, "g1", 24000)).replayed
    assert ledger.view().counts["charge"] == 0


def test_a_pending_charge_reads_as_captured_once_it_settles() -> None:
    clock = Clock()
    ledger = SandboxLedger(now=clock)
    booking = ledger.create_booking("b", lisbon_booking()).record
    request = PaymentRequest(booking.booking_id, "g1", 24000)
    pending = ledger.create_payment("p", request, ChargeFate.PENDING, timedelta(seconds=10)).record
    assert pending.status == "pending" and pending.settles_at is not None
    assert ledger.lookup(EffectKind.CHARGE, "p").status == "pending"
    clock.t += timedelta(seconds=10)
    settled = ledger.lookup(EffectKind.CHARGE, "p")
    assert (settled.status, settled.settles_at) == ("captured", None)  # type: ignore[union-attr]
    assert ledger.view().counts["charge"] == 1


def test_refusal_faults_and_charge_fates_count_down_one_request_at_a_time() -> None:
    board = FaultBoard()
    board.arm(
        FaultSpec(target=FaultTarget.PAYMENTS, throttle=1, retry_after_s=3, route_404=1, commit_delay_ms=50)
    )
    assert board.before(FaultTarget.PAYMENTS) == (0, Refusal.THROTTLE, 3, 0)
    assert board.before(FaultTarget.PAYMENTS) == (0, Refusal.ROUTE_404, 0, 0)
    assert board.before(FaultTarget.PAYMENTS) == (0, Refusal.NONE, 0, 50)  # a slow commit stays until cleared
    board.arm(FaultSpec(target=FaultTarget.PAYMENTS, decline=1, pending=1, pending_ms=700))
    assert board.charge_fate() == (ChargeFate.DECLINED, 0)
    assert board.charge_fate() == (ChargeFate.PENDING, 700)
    assert board.charge_fate() == (ChargeFate.CAPTURED, 0)
    assert not board.armed
    assert board.lookup_lag_ms() == 0
    board.arm(FaultSpec(target=FaultTarget.LOOKUPS, lookup_lag_ms=250))
    assert board.lookup_lag_ms() == 250 and board.armed


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_cores_import_no_web_or_network_library() -> None:
    forbidden = {"litestar", "uvicorn", "httpx", "openai", "nats", "aiosqlite", "asyncio", "socket"}
    pure = (
        "ledger.py",
        "audit_trail.py",
        "scripted_model.py",
        "faults.py",
        "records.py",
        "errors.py",
        "books.py",
    )
    for name in pure:
        assert not imported_roots(SANDBOX_DIR / name) & forbidden, name


# Pure core: faults


def test_fault_countdowns_are_consumed_one_request_at_a_time() -> None:
    board = FaultBoard()
    board.arm(
        FaultSpec(target=FaultTarget.PAYMENTS, latency_ms=20, fail_5xx=1, drop_after_commit=1, malformed=1)
    )
    assert board.before(FaultTarget.PAYMENTS) == (20, Refusal.FAIL_5XX, 0, 0)
    assert board.before(FaultTarget.PAYMENTS) == (20, Refusal.NONE, 0, 0)
    assert board.before(FaultTarget.BOOKINGS) == (0, Refusal.NONE, 0, 0)
    assert board.after_commit(FaultTarget.PAYMENTS) is AfterCommit.DROP
    assert board.after_commit(FaultTarget.PAYMENTS) is AfterCommit.MALFORMED
    assert board.after_commit(FaultTarget.PAYMENTS) is AfterCommit.DELIVER
    assert board.armed  # latency stays until cleared
    board.arm(FaultSpec(target=FaultTarget.PAYMENTS))
    assert not board.armed


def test_wildcard_faults_spare_the_reconciliation_lookups() -> None:
    board = FaultBoard()
    board.arm(FaultSpec(target=FaultTarget.ALL, fail_5xx=2))
    assert board.before(FaultTarget.LOOKUPS).refusal is Refusal.NONE
    assert board.before(None).refusal is Refusal.NONE
    assert board.before(FaultTarget.MODEL).refusal is Refusal.FAIL_5XX
    board.arm(FaultSpec(target=FaultTarget.LOOKUPS, fail_5xx=1))
    assert board.before(FaultTarget.LOOKUPS).refusal is Refusal.FAIL_5XX


# Pure core: scripted model


def call_output(item: dict[str, Any], output: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": item["call_id"], "output": json.dumps(output)}


def run_script(
    ledger: SandboxLedger, items: list[dict[str, Any]], guest: str = "g1"
) -> tuple[list[str], str]:
    """Drive the script with the pure ledger as the tools, the way the runtime and executor would."""
    called: list[str] = []
    totals: dict[str, int] = {}
    for step in range(10):
        item = scripted_model.respond(items, TOOLS)["output"][0]
        if item["type"] == "message":
            return called, item["content"][0]["text"]
        called.append(item["name"])
        try:
            output = tool_result(
                ledger, item["name"], f"{guest}:{step}", guest, json.loads(item["arguments"]), totals
            )
        except SandboxError as exc:
            output = exc.to_body()
        items = [*items, item, call_output(item, output)]
    raise AssertionError(f"script did not finish: {called}")


def tool_result(
    ledger: SandboxLedger, name: str, key: str, guest: str, args: dict[str, Any], totals: dict[str, int]
) -> Any:
    record: Any
    match name:
        case "search_hotels":
            return {
                "hotels": msgspec.to_builtins(
                    ledger.search(args["city"], args["check_in"], args["check_out"])
                )
            }
        case "create_booking":
            record = ledger.create_booking(key, BookingRequest(guest_id=guest, **args)).record
            totals[record.booking_id] = record.total_cents
        case "create_payment":
            # The executor, not the model, supplies the amount.
            record = ledger.create_payment(
                key, PaymentRequest(args["booking_id"], guest, totals[args["booking_id"]])
            ).record
        case _:
            raise AssertionError(f"the script called {name}, which the booking run does not offer")
    return msgspec.to_builtins(record)


def test_script_books_pays_then_confirms_leaving_the_email_and_crm_to_the_projections() -> None:
    ledger = new_ledger()
    called, final = run_script(
        ledger, [{"role": "user", "content": [{"type": "input_text", "text": LISBON}]}]
    )
    assert called == TOOL_NAMES == ["search_hotels", "create_booking", "create_payment"]
    booking = ledger.lookup(EffectKind.BOOKING, "g1:1")
    payment = ledger.lookup(EffectKind.CHARGE, "g1:2")
    assert isinstance(payment, Payment)
    assert final == (
        "Your room at Casa do Alfama in Lisbon from 2031-12-01 to 2031-12-03 is booked and paid (EUR 240.00). "
        f"Booking {booking.booking_id}, payment {payment.payment_id}. The confirmation email is on its way."
    )
    assert ledger.view().counts == {
        "booking": 1,
        "booking_release": 0,
        "charge": 1,
        "refund": 0,
        "email": 0,
        "crm_update": 0,
    }


def test_script_of_a_conversation_that_emailed_before_the_change_confirms_instead_of_going_on() -> None:
    """A run in flight across the deploy: its history holds the email (and CRM) steps the old script asked for;
    the script confirms the booking after either, never asks for the next one."""
    items: list[dict[str, Any]] = [{"role": "user", "content": LISBON}]
    for output in (
        {"hotels": [{"hotel_id": "lis-1", "available": True}]},
        {"booking_id": "bk_1", "total_cents": 24000, "currency": "EUR"},
        {"payment_id": "pay_1", "amount_cents": 24000, "currency": "EUR"},
    ):
        call = scripted_model.respond(items, None)["output"][0]
        items += [call, call_output(call, output)]
    for legacy in ("send_confirmation_email", "update_crm"):
        old = {"type": "function_call", "call_id": f"call_{legacy}", "name": legacy, "arguments": "{}"}
        items += [old, call_output(old, {"status": "sent"})]
        reply = scripted_model.respond(items, None)["output"][0]
        assert reply["type"] == "message", reply
        assert "booked and paid" in reply["content"][0]["text"]


def test_script_first_step_searches_with_the_requested_city_and_dates() -> None:
    response = scripted_model.respond(
        [{"role": "user", "content": "please book a room in berlin from 2027-01-05 to 2027-01-06"}], TOOLS
    )
    item = response["output"][0]
    assert (
        item["type"] == "function_call" and item["name"] == "search_hotels" and item["status"] == "completed"
    )
    assert json.loads(item["arguments"]) == {
        "city": "berlin",
        "check_in": "2027-01-05",
        "check_out": "2027-01-06",
    }
    assert item["call_id"].startswith("call_") and item["id"].startswith("fc_")
    usage = response["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0


@pytest.mark.parametrize("user_text", ["hello there", "book something nice", ""])
def test_script_asks_which_city_and_dates_when_the_request_is_unclear(user_text: str) -> None:
    item = scripted_model.respond(user_text, TOOLS)["output"][0]
    assert item["type"] == "message"
    assert item["content"][0]["text"] == scripted_model.CLARIFYING_QUESTION


def test_script_explains_a_failed_tool_and_never_issues_another_call() -> None:
    first = scripted_model.respond(LISBON, TOOLS)["output"][0]
    items = [
        {"role": "user", "content": LISBON},
        first,
        call_output(first, {"hotels": [{"hotel_id": "lis-1", "available": True}]}),
    ]
    booking_call = scripted_model.respond(items, TOOLS)["output"][0]
    items += [booking_call, call_output(booking_call, {"booking_id": "bk_1", "total_cents": 24000})]
    pay_call = scripted_model.respond(items, TOOLS)["output"][0]
    assert json.loads(pay_call["arguments"]) == {"booking_id": "bk_1"}  # no amount: the server computes it
    items += [pay_call, call_output(pay_call, {"error": {"code": "amount_mismatch", "message": "wrong"}})]
    item = scripted_model.respond(items, TOOLS)["output"][0]
    assert item["type"] == "message"
    assert "amount_mismatch" in item["content"][0]["text"] and "sorry" in item["content"][0]["text"].lower()
    malformed = [
        *items[:-1],
        {"type": "function_call_output", "call_id": pay_call["call_id"], "output": "<html>"},
    ]
    assert (
        "malformed_tool_output" in scripted_model.respond(malformed, TOOLS)["output"][0]["content"][0]["text"]
    )


def test_script_says_when_no_hotel_is_available() -> None:
    first = scripted_model.respond(LISBON, None)["output"][0]
    sold_out = {"hotels": [{"hotel_id": "lis-3", "available": False}]}
    items = [{"role": "user", "content": LISBON}, first, call_output(first, sold_out)]
    item = scripted_model.respond(items, None)["output"][0]
    assert item["type"] == "message" and "no hotels are available in Lisbon" in item["content"][0]["text"]


def test_script_is_deterministic_byte_for_byte() -> None:
    items = [{"role": "developer", "content": "be nice"}, {"role": "user", "content": LISBON}]
    first = json.dumps(scripted_model.respond(items, TOOLS))
    assert json.dumps(scripted_model.respond(json.loads(json.dumps(items)), TOOLS)) == first
    other = scripted_model.respond([*items[:1], {"role": "user", "content": LISBON + " please"}], TOOLS)
    assert other["output"][0]["call_id"] != json.loads(first)["output"][0]["call_id"]
    assert json.loads(first)["created_at"] == scripted_model.CREATED_AT


def test_script_does_not_call_a_tool_it_was_not_given() -> None:
    item = scripted_model.respond(LISBON, [{"type": "function", "name": "update_crm"}])["output"][0]
    assert item["type"] == "message" and "search_hotels" in item["content"][0]["text"]
