"""The action-idempotency store: one SQLite file per owned partition; intent before effect, receipt before ack."""

from __future__ import annotations

import time
from pathlib import Path

import aiosqlite
import msgspec

from contracts.tool_messages import ActionOutcome, ActionRequest, RecordStatus, tool_encoder
from services.executor.core import Record

# Rows with an intent and no settled receipt, and rows with one, as SQL literals: the partial index below and the
# queries that should use it must spell the same condition (SQLite proves the match on the text, not on bound
# parameters).
_OPEN = f"('{RecordStatus.STARTED}', '{RecordStatus.UNKNOWN}')"
_SETTLED = f"('{RecordStatus.SUCCEEDED}', '{RecordStatus.FAILED}')"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS actions (
    key         TEXT PRIMARY KEY,
    input_hash  TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    step_no     INTEGER NOT NULL,
    tool        TEXT NOT NULL,
    request     BLOB NOT NULL,
    status      TEXT NOT NULL,
    outcome     BLOB,
    attempts    INTEGER NOT NULL DEFAULT 0,
    stream_seq  INTEGER,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_open ON actions(status) WHERE status IN {_OPEN};
"""

_outcome_decoder = msgspec.json.Decoder(ActionOutcome)
_request_decoder = msgspec.json.Decoder(ActionRequest)


class ActionStore:
    """Key -> (input hash, status, receipt). Written only by the executor that owns the key's partition."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    @classmethod
    async def open(cls, path: Path, synchronous: str = "NORMAL") -> ActionStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        # WAL + NORMAL survives any process kill (what we test); FULL also survives power loss, at an fsync a commit.
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute(f"PRAGMA synchronous={synchronous}")
        await db.executescript(_SCHEMA)
        return cls(db, path)

    async def close(self) -> None:
        await self._db.close()

    async def get(self, key: str) -> Record | None:
        rows = await self._db.execute_fetchall(
            "SELECT key, input_hash, status, attempts, outcome FROM actions WHERE key = ?", (key,)
        )
        row = next(iter(rows), None)
        if row is None:
            return None
        outcome = _outcome_decoder.decode(row[4]) if row[4] else None
        return Record(
            key=row[0], input_hash=row[1], status=RecordStatus(row[2]), attempts=row[3], outcome=outcome
        )

    async def begin(self, request: ActionRequest, stream_seq: int) -> bool:
        """Commit the intent. False if the key already has a row (another delivery got there first)."""
        now = time.time()
        cur = await self._db.execute(
            "INSERT OR IGNORE INTO actions (key, input_hash, run_id, step_no, tool, request, status, attempts, stream_seq, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)",
            (
                request.key,
                request.input_hash,
                request.run_id,
                request.step_no,
                request.tool,
                tool_encoder.encode(request),
                RecordStatus.STARTED.value,
                stream_seq,
                now,
                now,
            ),
        )
        return cur.rowcount == 1

    async def attempt(self, key: str, attempts: int) -> None:
        await self._db.execute(
            "UPDATE actions SET attempts = ?, updated_at = ? WHERE key = ?", (attempts, time.time(), key)
        )

    async def mark_unknown(self, key: str) -> None:
        await self._db.execute(
            "UPDATE actions SET status = ?, updated_at = ? WHERE key = ? AND status = ?",
            (RecordStatus.UNKNOWN.value, time.time(), key, RecordStatus.STARTED.value),
        )

    async def finish(self, outcome: ActionOutcome, stream_seq: int | None) -> None:
        """Commit the receipt, with the stream sequence it answers, before the request is acknowledged."""
        await self._db.execute(
            "UPDATE actions SET status = ?, outcome = ?, attempts = ?, stream_seq = COALESCE(?, stream_seq), updated_at = ? WHERE key = ?",
            (
                RecordStatus.of(outcome.status).value,
                tool_encoder.encode(outcome),
                outcome.attempts,
                stream_seq,
                time.time(),
                outcome.key,
            ),
        )

    async def open_intents(self) -> list[tuple[ActionRequest, int]]:
        """Intents with no receipt: what a previous life of this executor left behind."""
        rows = await self._db.execute_fetchall(
            f"SELECT request, attempts FROM actions WHERE status IN {_OPEN} ORDER BY created_at"
        )
        return [(_request_decoder.decode(row[0]), int(row[1])) for row in rows]

    async def recent_receipts(self, since_s: float) -> list[ActionOutcome]:
        """Receipts written in the last `since_s`: a previous life may have died before publishing them."""
        rows = await self._db.execute_fetchall(
            f"SELECT outcome FROM actions WHERE status IN {_SETTLED} AND outcome IS NOT NULL AND updated_at >= ?",
            (time.time() - since_s,),
        )
        return [_outcome_decoder.decode(row[0]) for row in rows]

    async def count(self) -> int:
        rows = await self._db.execute_fetchall("SELECT COUNT(*) FROM actions")
        return int(next(iter(rows))[0])
