"""The fake provider's books: Stripe-style idempotent writes over hotels, payments and messages, no I/O."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Generic, NamedTuple, Protocol, TypeVar

import msgspec

from crashsafe.sandbox.audit_trail import AuditBooks, AuditTrail
from crashsafe.sandbox.errors import (
    ErrorCode,
    IdempotencyConflict,
    InvalidRequest,
    KeyExpired,
    MissingIdempotencyKey,
    NotFound,
    StateConflict,
)
from crashsafe.sandbox.faults import ChargeFate
from crashsafe.sandbox.records import (
    AuditAccepted,
    AuditBatch,
    AuditRecordIn,
    Booking,
    BookingRequest,
    CrmUpdate,
    CrmUpdateRequest,
    EffectKind,
    Email,
    EmailRequest,
    Hotel,
    LedgerEntry,
    LedgerView,
    Payment,
    PaymentRequest,
    PaymentSummary,
    Record,
    Refund,
    RefundRequest,
    ReleaseRequest,
)

MAX_KEY_LENGTH = 255  # Stripe's limit; long enough for "<run_id>:<step>:<tool>" keys.
KEY_RETENTION = timedelta(hours=24)  # Stripe's: a key is remembered (replayed, looked up) for a day

# A fixed catalogue keeps demos and tests reproducible. The third hotel of each city is
# sold out so the "first available" choice is a real decision, not always index 0.
HOTELS: tuple[Hotel, ...] = (
    Hotel("lis-1", "Casa do Alfama", "Lisbon", 12000, "EUR", True),
    Hotel("lis-2", "Hotel Tejo Azul", "Lisbon", 9500, "EUR", True),
    Hotel("lis-3", "Palacio Chiado", "Lisbon", 21000, "EUR", False),
    Hotel("ber-1", "Spree Quarter Hotel", "Berlin", 11000, "EUR", True),
    Hotel("ber-2", "Kreuzberg Loft", "Berlin", 8900, "EUR", True),
    Hotel("ber-3", "Tiergarten Grand", "Berlin", 19500, "EUR", False),
    Hotel("par-1", "Hotel Rive Gauche", "Paris", 16000, "EUR", True),
    Hotel("par-2", "Le Petit Marais", "Paris", 13500, "EUR", True),
    Hotel("par-3", "Maison Montmartre", "Paris", 22000, "EUR", False),
)

R = TypeVar("R", bound=Record)


class Outcome(NamedTuple, Generic[R]):
    """A write's answer; `replayed` tells the shell to say so (Idempotent-Replayed: true)."""

    record: R
    replayed: bool


class Stored(NamedTuple):
    fingerprint: bytes
    ref: str
    # The response as first given: a replay answers with it even if the resource moved on,
    # exactly as Stripe replays the saved response.
    record: Record
    committed_at: datetime


class Snapshot(NamedTuple):
    """Everything the books hold, as a durable store gives it back after a restart."""

    writes: dict[EffectKind, dict[str, Stored]]
    resources: list[Record]
    entries: list[LedgerEntry]


class Books(AuditBooks, Protocol):
    """Where the ledger's writes are made durable (sandbox/books.py: SQLite); the ledger itself does no I/O."""

    def load(self) -> Snapshot: ...

    def commit(self, kind: EffectKind, key: str, stored: Stored, entry: LedgerEntry | None) -> None: ...

    def clear(self) -> None: ...


def check_idempotency_key(key: str | None) -> str:
    """Return the key if usable; the shell calls this before parsing the body so a keyless write is a 400."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise MissingIdempotencyKey()
    return key


def _fingerprint(body: msgspec.Struct) -> bytes:
    # Deterministic order sorts free-form dicts (CRM fields), so key order in JSON is not a "different body".
    return hashlib.sha256(msgspec.json.encode(body, order="deterministic")).digest()


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ref_of(record: Record) -> str:
    match record:
        case Booking(booking_id=ref) | Payment(payment_id=ref) | Refund(refund_id=ref):
            return ref
        case Email(email_id=ref) | CrmUpdate(crm_update_id=ref):
            return ref
    raise AssertionError(f"unhandled record {record!r}")


def _resource_id(prefix: str, kind: EffectKind, key: str) -> str:
    # Derived from the key, not a counter: stable across /_reset and identical for the same request.
    return prefix + hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()[:16]


def _parse_date(field: str, value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            ErrorCode.INVALID_DATES,
            f"{field} must be an ISO date like 2031-12-01, got {value!r}.",
            field=field,
        ) from None


def stay_nights(check_in: str, check_out: str) -> int:
    """Nights between two ISO dates; a stay must end after it starts."""
    nights = (_parse_date("check_out", check_out) - _parse_date("check_in", check_in)).days
    if nights <= 0:
        raise InvalidRequest(
            ErrorCode.INVALID_DATES,
            f"check_out ({check_out}) must be after check_in ({check_in}).",
            check_in=check_in,
            check_out=check_out,
        )
    return nights


class SandboxLedger:
    """Provider state, in memory and (given `books`) durable. Every method runs to completion without
    awaiting, so under one event loop each write is atomic and two requests with one key cannot both
    perform the effect; a write is durable before its answer is given."""

    def __init__(
        self,
        now: Callable[[], datetime],
        *,
        books: Books | None = None,
        retention: timedelta = KEY_RETENTION,
    ) -> None:
        self._now = now
        self._writing_at = datetime.min.replace(tzinfo=UTC)  # the clock reading of the write in progress
        self._books = books
        self.retention = retention
        self._clear()
        self.audit = AuditTrail(books)
        if books is not None:
            self._restore(books.load())

    def reset(self) -> None:
        self._clear()
        self.audit.clear()
        if self._books is not None:
            self._books.clear()

    def _restore(self, snapshot: Snapshot) -> None:
        for kind, writes in snapshot.writes.items():
            self._writes[kind].update(writes)
        for record in snapshot.resources:
            self._table(record)[_ref_of(record)] = record
        for update in self._crm_updates.values():
            if update.booking_id is not None:
                self._crm_by_booking.setdefault(
                    (update.account, update.guest_id, update.booking_id), update.crm_update_id
                )
        for refund in self._refunds.values():
            self._refunded_cents[refund.payment_id] = (
                self._refunded_cents.get(refund.payment_id, 0) + refund.amount_cents
            )
        self._entries.extend(snapshot.entries)

    def _table(self, record: Record) -> dict[str, Record]:
        tables: dict[type, dict[str, Record]] = {
            Booking: self._bookings,  # type: ignore[dict-item]
            Payment: self._payments,  # type: ignore[dict-item]
            Refund: self._refunds,  # type: ignore[dict-item]
            Email: self._emails,  # type: ignore[dict-item]
            CrmUpdate: self._crm_updates,  # type: ignore[dict-item]
        }
        return tables[type(record)]

    def _clear(self) -> None:
        self._hotels = {hotel.hotel_id: hotel for hotel in HOTELS}
        self._bookings: dict[str, Booking] = {}
        self._payments: dict[str, Payment] = {}
        self._refunds: dict[str, Refund] = {}
        self._refunded_cents: dict[str, int] = {}
        self._emails: dict[str, Email] = {}
        self._crm_updates: dict[str, CrmUpdate] = {}
        # The CRM's own identity of a record: one per (guest, booking), whatever key the update came with.
        self._crm_by_booking: dict[tuple[str, str, str], str] = {}
        self._writes: dict[EffectKind, dict[str, Stored]] = {kind: {} for kind in EffectKind}
        self._entries: list[LedgerEntry] = []
        self._replays: dict[EffectKind, int] = dict.fromkeys(EffectKind, 0)

    # Reads

    def search(self, city: str, check_in: str | None = None, check_out: str | None = None) -> list[Hotel]:
        if check_in is not None or check_out is not None:
            stay_nights(check_in or "", check_out or "")
        wanted = city.strip().casefold()
        return [hotel for hotel in self._hotels.values() if hotel.city.casefold() == wanted]

    def lookup(self, kind: EffectKind, key: str, lag: timedelta = timedelta(0), account: str = "") -> Record:
        """The current state of whatever `key` created: the reconciliation path after an unknown outcome.

        `lag` is a lagging read replica: a write younger than it is not seen yet (says "no such key"). `account`:
        the account asking; a key written in another account is not found from it, as at a real provider."""
        stored = self._writes[kind].get(key)
        if stored is not None and stored.record.account != account:
            stored = None
        now = self._now()
        if stored is not None and now - stored.committed_at >= self.retention:
            raise KeyExpired(key, kind.value, int(self.retention.total_seconds()))
        if stored is None or now - stored.committed_at < lag:
            raise NotFound(
                ErrorCode.KEY_NOT_FOUND,
                f"No {kind} was made with Idempotency-Key {key!r}; the request never took effect here.",
                key=key,
                kind=kind.value,
            )
        current: dict[str, Record] = {
            EffectKind.BOOKING: self._bookings,
            EffectKind.BOOKING_RELEASE: self._bookings,
            EffectKind.CHARGE: self._payments,
            EffectKind.REFUND: self._refunds,
            EffectKind.EMAIL: self._emails,
            EffectKind.CRM_UPDATE: self._crm_updates,
        }[kind]  # type: ignore[assignment]
        return self._settled(current[stored.ref], now)

    def _settled(self, record: Record, now: datetime) -> Record:
        """A pending charge reads as captured once its settlement time has passed."""
        match record:
            case Payment(status=ChargeFate.PENDING, settles_at=str(at)) if now >= datetime.fromisoformat(at):
                return msgspec.structs.replace(record, status=ChargeFate.CAPTURED.value, settles_at=None)
        return record

    def payments_of(self, guest_id: str, account: str = "") -> list[PaymentSummary]:
        """A guest's payments in an account, oldest first, each with what has been refunded of it (a read: no
        fault, no key)."""
        now = self._now()
        found = []
        for payment in self._payments.values():
            if payment.guest_id != guest_id or payment.account != account:
                continue
            settled = self._settled(payment, now)
            status = settled.status if isinstance(settled, Payment) else payment.status
            found.append(
                PaymentSummary(
                    payment_id=payment.payment_id,
                    booking_id=payment.booking_id,
                    guest_id=payment.guest_id,
                    amount_cents=payment.amount_cents,
                    currency=payment.currency,
                    status=status,
                    refunded_cents=self._refunded_cents.get(payment.payment_id, 0),
                    account=payment.account,
                )
            )
        return found

    def view(self, guest_id: str | None = None) -> LedgerView:
        entries = self._entries if guest_id is None else [e for e in self._entries if e.guest_id == guest_id]
        counts = dict.fromkeys((kind.value for kind in EffectKind), 0)
        for entry in entries:
            counts[entry.kind.value] += 1
        audit = self.audit.entries(guest_id)
        return LedgerView(
            entries=list(entries),
            counts=counts,
            replays={kind.value: n for kind, n in self._replays.items()},
            audit=audit,
            audit_records=len(audit),
            audit_duplicates=self.audit.duplicates,
        )

    def audit_records(self, run_id: str) -> list[AuditRecordIn]:
        return self.audit.of_run(run_id)

    # Writes

    def create_booking(self, key: str, body: BookingRequest) -> Outcome[Booking]:
        def effect() -> tuple[str, Booking, LedgerEntry]:
            hotel = self._hotels.get(body.hotel_id)
            if hotel is None:
                raise NotFound(
                    ErrorCode.HOTEL_NOT_FOUND,
                    f"No hotel {body.hotel_id!r}; search first and use a hotel_id from the results.",
                    hotel_id=body.hotel_id,
                )
            nights = stay_nights(body.check_in, body.check_out)
            if not hotel.available:
                raise StateConflict(
                    ErrorCode.HOTEL_UNAVAILABLE,
                    f"{hotel.name} is sold out for those dates; pick another hotel.",
                    hotel_id=hotel.hotel_id,
                )
            booking = Booking(
                booking_id=_resource_id("bk_", EffectKind.BOOKING, key),
                hotel_id=hotel.hotel_id,
                hotel_name=hotel.name,
                city=hotel.city,
                guest_id=body.guest_id,
                check_in=body.check_in,
                check_out=body.check_out,
                nights=nights,
                total_cents=nights * hotel.nightly_rate_cents,
                currency=hotel.currency,
                status="held",
                key=key,
                account=body.account,
            )
            self._bookings[booking.booking_id] = booking
            entry = self._entry(
                EffectKind.BOOKING,
                key,
                booking.guest_id,
                booking.total_cents,
                booking.currency,
                booking.booking_id,
            )
            return booking.booking_id, booking, entry

        return self._idempotent(EffectKind.BOOKING, key, body, effect)

    def release_booking(self, key: str, body: ReleaseRequest) -> Outcome[Booking]:
        def effect() -> tuple[str, Booking, LedgerEntry]:
            booking = self._held_booking(body.booking_id, body.account)
            released = msgspec.structs.replace(booking, status="released")
            self._bookings[released.booking_id] = released
            entry = self._entry(
                EffectKind.BOOKING_RELEASE,
                key,
                released.guest_id,
                released.total_cents,
                released.currency,
                released.booking_id,
            )
            return released.booking_id, released, entry

        return self._idempotent(EffectKind.BOOKING_RELEASE, key, body, effect)

    def create_payment(
        self,
        key: str,
        body: PaymentRequest,
        fate: ChargeFate = ChargeFate.CAPTURED,
        pending_for: timedelta = timedelta(0),
    ) -> Outcome[Payment]:
        """A charge; `fate` is what the card does with it (declined: a record with no money moved, no entry)."""

        def effect() -> tuple[str, Payment, LedgerEntry | None]:
            booking = self._held_booking(body.booking_id, body.account)
            self._check_guest(body.guest_id, booking)
            if body.currency is not None and body.currency != booking.currency:
                raise InvalidRequest(
                    ErrorCode.CURRENCY_MISMATCH,
                    f"Booking {booking.booking_id} is priced in {booking.currency}, not {body.currency}.",
                    expected=booking.currency,
                    got=body.currency,
                )
            if body.amount_cents != booking.total_cents:
                raise InvalidRequest(
                    ErrorCode.AMOUNT_MISMATCH,
                    f"Booking {booking.booking_id} costs {booking.total_cents} cents; "
                    f"charge exactly that, not {body.amount_cents}.",
                    expected_cents=booking.total_cents,
                    got_cents=body.amount_cents,
                )
            # A second payment for the same booking under a new key is allowed on purpose: a real
            # provider cannot tell a retry from a new purchase, which is the double charge we demo.
            payment = Payment(
                payment_id=_resource_id("pay_", EffectKind.CHARGE, key),
                booking_id=booking.booking_id,
                guest_id=booking.guest_id,
                amount_cents=body.amount_cents,
                currency=booking.currency,
                status=fate.value,
                key=key,
                settles_at=_iso(self._writing_at + pending_for) if fate is ChargeFate.PENDING else None,
                account=booking.account,
            )
            self._payments[payment.payment_id] = payment
            if fate is ChargeFate.DECLINED:
                return payment.payment_id, payment, None
            entry = self._entry(
                EffectKind.CHARGE,
                key,
                payment.guest_id,
                payment.amount_cents,
                payment.currency,
                payment.payment_id,
            )
            return payment.payment_id, payment, entry

        return self._idempotent(EffectKind.CHARGE, key, body, effect)

    def refund_payment(self, key: str, body: RefundRequest) -> Outcome[Refund]:
        def effect() -> tuple[str, Refund, LedgerEntry]:
            payment = self._payments.get(body.payment_id)
            if payment is None or payment.account != body.account:  # another account's: not found from here
                raise NotFound(
                    ErrorCode.PAYMENT_NOT_FOUND,
                    f"No payment {body.payment_id!r}; refund a payment_id returned by POST /payments.",
                    payment_id=body.payment_id,
                )
            already = self._refunded_cents.get(payment.payment_id, 0)
            remaining = payment.amount_cents - already
            amount = remaining if body.amount_cents is None else body.amount_cents
            if amount <= 0 or amount > remaining:
                raise InvalidRequest(
                    ErrorCode.REFUND_EXCEEDS_PAYMENT,
                    f"Payment {payment.payment_id} has {remaining} cents left to refund; asked for {amount}.",
                    remaining_cents=remaining,
                    got_cents=amount,
                )
            refund = Refund(
                refund_id=_resource_id("re_", EffectKind.REFUND, key),
                payment_id=payment.payment_id,
                booking_id=payment.booking_id,
                guest_id=payment.guest_id,
                amount_cents=amount,
                currency=payment.currency,
                status="succeeded",
                key=key,
                account=payment.account,
            )
            self._refunds[refund.refund_id] = refund
            self._refunded_cents[payment.payment_id] = already + amount
            entry = self._entry(
                EffectKind.REFUND,
                key,
                refund.guest_id,
                refund.amount_cents,
                refund.currency,
                refund.refund_id,
            )
            return refund.refund_id, refund, entry

        return self._idempotent(EffectKind.REFUND, key, body, effect)

    def send_email(self, key: str, body: EmailRequest) -> Outcome[Email]:
        def effect() -> tuple[str, Email, LedgerEntry]:
            if body.booking_id is not None:
                self._check_guest(body.guest_id, self._booking(body.booking_id, body.account))
            email = Email(
                email_id=_resource_id("em_", EffectKind.EMAIL, key),
                guest_id=body.guest_id,
                template=body.template,
                booking_id=body.booking_id,
                status="sent",
                key=key,
                to=body.to,
                account=body.account,
            )
            self._emails[email.email_id] = email
            entry = self._entry(EffectKind.EMAIL, key, email.guest_id, 0, None, email.email_id)
            return email.email_id, email, entry

        return self._idempotent(EffectKind.EMAIL, key, body, effect)

    def update_crm(self, key: str, body: CrmUpdateRequest) -> Outcome[CrmUpdate]:
        """A CRM record per (guest, booking): a second update of them under another key is answered with the
        first record (replayed; its key now finds it too), never a second record. Without a booking: by key."""
        if body.booking_id is not None:
            first = self._crm_by_booking.get((body.account, body.guest_id, body.booking_id))
            stored = self._writes[EffectKind.CRM_UPDATE].get(key)
            if first is not None and (stored is None or self._now() - stored.committed_at >= self.retention):
                return self._same_record(key, body, self._crm_updates[first])

        def effect() -> tuple[str, CrmUpdate, LedgerEntry]:
            if body.booking_id is not None:
                self._check_guest(body.guest_id, self._booking(body.booking_id, body.account))
            update = CrmUpdate(
                crm_update_id=_resource_id("crm_", EffectKind.CRM_UPDATE, key),
                guest_id=body.guest_id,
                booking_id=body.booking_id,
                fields=dict(body.fields),
                status="applied",
                key=key,
                account=body.account,
            )
            self._crm_updates[update.crm_update_id] = update
            if update.booking_id is not None:
                self._crm_by_booking[(update.account, update.guest_id, update.booking_id)] = (
                    update.crm_update_id
                )
            entry = self._entry(EffectKind.CRM_UPDATE, key, update.guest_id, 0, None, update.crm_update_id)
            return update.crm_update_id, update, entry

        return self._idempotent(EffectKind.CRM_UPDATE, key, body, effect)

    def record_audit(self, batch: AuditBatch) -> AuditAccepted:
        return self.audit.record(batch)

    # Internals

    def _same_record(self, key: str, body: msgspec.Struct, record: CrmUpdate) -> Outcome[CrmUpdate]:
        """Remember `key` as having asked for `record`, which another key made: no effect, no entry."""
        written = Stored(_fingerprint(body), record.crm_update_id, record, self._now())
        if self._books is not None:
            self._books.commit(EffectKind.CRM_UPDATE, key, written, None)
        self._writes[EffectKind.CRM_UPDATE][key] = written
        self._replays[EffectKind.CRM_UPDATE] += 1
        return Outcome(record, replayed=True)

    def _idempotent(
        self,
        kind: EffectKind,
        key: str,
        body: msgspec.Struct,
        effect: Callable[[], tuple[str, R, LedgerEntry | None]],
    ) -> Outcome[R]:
        check_idempotency_key(key)
        fingerprint = _fingerprint(body)
        stored = self._writes[kind].get(key)
        now = self._writing_at = self._now()
        if stored is not None and now - stored.committed_at >= self.retention:
            stored = None  # past the retention window the key is forgotten: a write with it is a new one
        if stored is not None:
            if stored.fingerprint != fingerprint:
                raise IdempotencyConflict(key, kind.value)
            self._replays[kind] += 1
            return Outcome(stored.record, replayed=True)  # type: ignore[arg-type]
        # A refused request stores nothing (like Stripe's validation failures), so the key stays
        # free for a corrected retry; `effect` raises before touching state when it refuses.
        ref, record, entry = effect()
        written = Stored(fingerprint, ref, record, now)
        if self._books is not None:
            self._books.commit(kind, key, written, entry)
        self._writes[kind][key] = written
        if entry is not None:
            self._entries.append(entry)
        return Outcome(record, replayed=False)

    def _entry(
        self, kind: EffectKind, key: str, guest_id: str, amount_cents: int, currency: str | None, ref: str
    ) -> LedgerEntry:
        return LedgerEntry(kind, key, guest_id, amount_cents, currency, ref, _iso(self._writing_at))

    def _booking(self, booking_id: str, account: str) -> Booking:
        """The booking, if it is the account's: another account's is not found from here."""
        booking = self._bookings.get(booking_id)
        if booking is None or booking.account != account:
            raise NotFound(
                ErrorCode.BOOKING_NOT_FOUND,
                f"No booking {booking_id!r}; use a booking_id returned by POST /bookings.",
                booking_id=booking_id,
            )
        return booking

    def _held_booking(self, booking_id: str, account: str) -> Booking:
        booking = self._booking(booking_id, account)
        if booking.status != "held":
            raise StateConflict(
                ErrorCode.BOOKING_RELEASED,
                f"Booking {booking_id} was released; make a new booking instead.",
                booking_id=booking_id,
            )
        return booking

    @staticmethod
    def _check_guest(guest_id: str, booking: Booking) -> None:
        if guest_id != booking.guest_id:
            raise InvalidRequest(
                ErrorCode.GUEST_MISMATCH,
                f"Booking {booking.booking_id} belongs to another guest; act only on the guest's own bookings.",
                booking_id=booking.booking_id,
            )
