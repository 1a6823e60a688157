"""The sandbox's audit log: journaled run events kept once each, deduplicated by event id, no I/O."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import NamedTuple, Protocol

import msgspec

from crashsafe.sandbox.errors import ErrorCode, EventIdConflict, InvalidRequest
from crashsafe.sandbox.records import AuditAccepted, AuditBatch, AuditEntry, AuditRecordIn

RUN_STARTED = "run.started"  # the one event that names the run's guest (for the ledger view's guest filter)


class HeldRecord(NamedTuple):
    """An audit record as the trail holds it: the record, its fingerprint, its position in the run's journal."""

    record: AuditRecordIn
    fingerprint: bytes
    position: int


class AuditBooks(Protocol):
    """Where the trail's records are made durable (sandbox/books.py: SQLite, with the rest of the books)."""

    def load_audit(self) -> list[HeldRecord]: ...

    def commit_audit(self, records: Iterable[HeldRecord]) -> None: ...


def fingerprint(record: AuditRecordIn) -> bytes:
    # Deterministic order: the same event re-encoded with its keys in another order is the same event.
    return hashlib.sha256(msgspec.json.encode(record, order="deterministic")).digest()


def position_of(record: AuditRecordIn) -> int:
    """The journal position an event id names (`<run_id>/<n>`, n from 1); anything else is refused."""
    prefix, _, n = record.event_id.rpartition("/")
    if prefix != record.run_id or not n.isdigit() or int(n) < 1:
        raise InvalidRequest(
            ErrorCode.INVALID_REQUEST,
            f"event_id must be '<run_id>/<n>' with n >= 1 (the event's position in run {record.run_id}'s "
            f"journal), got {record.event_id!r}.",
            event_id=record.event_id,
        )
    return int(n)


class AuditTrail:
    """Every record once by event id. A batch is taken whole or not at all: a record that clashes with a held
    one (same id, another body) refuses the batch, so a sender with a numbering bug never half-writes a run."""

    def __init__(self, books: AuditBooks | None = None) -> None:
        self._books = books
        self.clear()
        if books is not None:
            for held in books.load_audit():
                self._hold(held)

    def clear(self) -> None:
        self._held: dict[str, HeldRecord] = {}
        self._by_run: dict[str, dict[int, str]] = {}
        self._guest_of_run: dict[str, str] = {}
        self.duplicates = 0

    def record(self, batch: AuditBatch) -> AuditAccepted:
        new: dict[str, HeldRecord] = {}
        duplicates = 0
        for record in batch.records:
            held = HeldRecord(record, fingerprint(record), position_of(record))
            known = self._held.get(record.event_id) or new.get(record.event_id)
            if known is not None:
                if known.fingerprint != held.fingerprint:
                    raise EventIdConflict(record.event_id)
                duplicates += 1
                continue
            new[record.event_id] = held
        if new and self._books is not None:
            self._books.commit_audit(new.values())  # durable before the answer
        for held in new.values():
            self._hold(held)
        self.duplicates += duplicates
        return AuditAccepted(accepted=len(new), duplicates=duplicates)

    def of_run(self, run_id: str) -> list[AuditRecordIn]:
        positions = self._by_run.get(run_id, {})
        return [self._held[positions[n]].record for n in sorted(positions)]

    def entries(self, guest_id: str | None = None) -> list[AuditEntry]:
        out = []
        for held in self._held.values():
            record = held.record
            guest = self._guest_of_run.get(record.run_id)
            if guest_id is not None and guest != guest_id:
                continue
            out.append(
                AuditEntry(record.event_id, record.run_id, record.tenant, record.type, record.at, guest)
            )
        return out

    def _hold(self, held: HeldRecord) -> None:
        record = held.record
        self._held[record.event_id] = held
        self._by_run.setdefault(record.run_id, {})[held.position] = record.event_id
        guest = record.event.get("guest_id") if record.type == RUN_STARTED else None
        if isinstance(guest, str):
            self._guest_of_run[record.run_id] = guest
