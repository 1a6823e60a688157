"""The sandbox's durable books: every write and ledger entry in SQLite, so a killed provider remembers every key."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import msgspec

from crashsafe.sandbox.audit_trail import HeldRecord
from crashsafe.sandbox.ledger import Snapshot, Stored
from crashsafe.sandbox.records import (
    AuditRecordIn,
    Booking,
    CrmUpdate,
    EffectKind,
    Email,
    LedgerEntry,
    Payment,
    Record,
    Refund,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS writes (
    kind         TEXT NOT NULL,
    key          TEXT NOT NULL,
    fingerprint  BLOB NOT NULL,
    ref          TEXT NOT NULL,
    record       BLOB NOT NULL,
    committed_at TEXT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS resources (
    ref    TEXT PRIMARY KEY,
    type   TEXT NOT NULL,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_records (
    event_id    TEXT PRIMARY KEY,
    position    INTEGER NOT NULL,
    fingerprint BLOB NOT NULL,
    record      BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    entry BLOB NOT NULL
);
"""

# What each write kind answers with, and each stored resource's type: the JSON is decoded back into these.
_RECORD_OF_KIND: dict[EffectKind, type[Record]] = {
    EffectKind.BOOKING: Booking,
    EffectKind.BOOKING_RELEASE: Booking,
    EffectKind.CHARGE: Payment,
    EffectKind.REFUND: Refund,
    EffectKind.EMAIL: Email,
    EffectKind.CRM_UPDATE: CrmUpdate,
}
_TYPES: dict[str, type[Record]] = {t.__name__: t for t in (Booking, Payment, Refund, Email, CrmUpdate)}
_encode = msgspec.json.Encoder().encode


class SqliteBooks:
    """One SQLite file. Each write commits in one transaction before the ledger answers; WAL with
    synchronous=NORMAL survives any kill of the process (power loss is not what the sandbox models)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def in_dir(cls, data_dir: Path) -> SqliteBooks:
        return cls(data_dir / "sandbox.sqlite3")

    def close(self) -> None:
        self._db.close()

    def load(self) -> Snapshot:
        writes: dict[EffectKind, dict[str, Stored]] = {kind: {} for kind in EffectKind}
        for kind, key, fingerprint, ref, record, committed_at in self._db.execute(
            "SELECT kind, key, fingerprint, ref, record, committed_at FROM writes"
        ):
            effect = EffectKind(kind)
            decoded = msgspec.json.decode(record, type=_RECORD_OF_KIND[effect])
            writes[effect][key] = Stored(fingerprint, ref, decoded, datetime.fromisoformat(committed_at))
        resources = [
            msgspec.json.decode(record, type=_TYPES[type_name])
            for type_name, record in self._db.execute("SELECT type, record FROM resources")
        ]
        entries = [
            msgspec.json.decode(entry, type=LedgerEntry)
            for (entry,) in self._db.execute("SELECT entry FROM entries ORDER BY seq")
        ]
        return Snapshot(writes, resources, entries)

    def commit(self, kind: EffectKind, key: str, stored: Stored, entry: LedgerEntry | None) -> None:
        record = _encode(stored.record)
        with self._db:  # one transaction: the key, the resource's new state and the entry, or nothing
            self._db.execute("BEGIN")
            self._db.execute(
                "INSERT OR REPLACE INTO writes (kind, key, fingerprint, ref, record, committed_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (kind.value, key, stored.fingerprint, stored.ref, record, stored.committed_at.isoformat()),
            )
            self._db.execute(
                "INSERT OR REPLACE INTO resources (ref, type, record) VALUES (?, ?, ?)",
                (stored.ref, type(stored.record).__name__, record),
            )
            if entry is not None:
                self._db.execute("INSERT INTO entries (entry) VALUES (?)", (_encode(entry),))

    def load_audit(self) -> list[HeldRecord]:
        return [
            HeldRecord(msgspec.json.decode(record, type=AuditRecordIn), fingerprint, position)
            for record, fingerprint, position in self._db.execute(
                "SELECT record, fingerprint, position FROM audit_records"
            )
        ]

    def commit_audit(self, records: Iterable[HeldRecord]) -> None:
        with self._db:  # one transaction: the whole batch's new records, or none of them
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR IGNORE INTO audit_records (event_id, position, fingerprint, record) VALUES (?, ?, ?, ?)",
                [(h.record.event_id, h.position, h.fingerprint, _encode(h.record)) for h in records],
            )

    def clear(self) -> None:
        with self._db:
            self._db.execute("BEGIN")
            for table in ("writes", "resources", "entries", "audit_records"):
                self._db.execute(f"DELETE FROM {table}")  # noqa: S608 (fixed table names)
