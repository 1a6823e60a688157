"""The action-idempotency store: one SQLite file per owned partition; intent before effect, receipt before ack."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec

from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, RecordStatus, tool_encoder
from crashsafe.domain.execution import Record
from crashsafe.domain.partition_ownership import inherited
from crashsafe.services.executor import store_connection
from crashsafe.services.executor.store_connection import StoreConnection

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
    updated_at  REAL NOT NULL,
    sent_at     REAL
);
CREATE INDEX IF NOT EXISTS actions_open ON actions(status) WHERE status IN {_OPEN};
-- The store's own identity: a partition's lease holder record names it, so a new owner knows whose store it is.
CREATE TABLE IF NOT EXISTS meta (
    name        TEXT PRIMARY KEY,
    value       TEXT NOT NULL
);
-- Every lease this store's partition was held under, and whether it was taken over from another store.
CREATE TABLE IF NOT EXISTS tenures (
    token           INTEGER NOT NULL,
    owner           TEXT NOT NULL,
    previous_store  TEXT,
    takeover        INTEGER NOT NULL,
    acquired_at     REAL NOT NULL
);
"""

# Rows a full-table read takes between two turns of the event loop (about 9 ms of SQLite here).
SCAN_ROWS = 20_000
# Which rows each retention covers: step keys (`run_…:n` and their compensations), and every other (business) key.
STEP_KEYS = "substr(key, 1, 4) = 'run_'"
BUSINESS_KEYS = "substr(key, 1, 4) != 'run_'"

_outcome_decoder = msgspec.json.Decoder(ActionOutcome)
_request_decoder = msgspec.json.Decoder(ActionRequest)


class ActionStore:
    """Key -> (input hash, status, receipt). Written only by the executor that owns the key's partition."""

    def __init__(
        self,
        db: StoreConnection,
        path: Path,
        store_id: str,
        takeover_at: float | None,
        pruned_through: float | None = None,
    ) -> None:
        self._db = db
        self.path = path
        self.store_id = store_id
        # The latest time this store took its partition over from another store (None: it never did).
        self.takeover_at = takeover_at
        # Every settled row this store deleted was last written before this time (None: it never deleted one).
        self.pruned_through = pruned_through
        self.clock_skew_s = 2.0
        # Raises PartitionNotOwned unless this replica still holds the partition's lease: checked by every write
        # of an intent, an attempt and a receipt. The executor sets it when it acquires the partition.
        self.fence: Callable[[], None] = _unfenced

    @classmethod
    async def open(cls, path: Path, synchronous: str = "NORMAL") -> ActionStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await store_connection.connect(path, synchronous)
        # WAL + NORMAL survives any process kill (what we test); FULL also survives power loss, at an fsync a commit.
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute(f"PRAGMA synchronous={synchronous}")
        await db.executescript(_SCHEMA)
        columns = {row[1] for row in await db.execute_fetchall("PRAGMA table_info(actions)")}
        if (
            "sent_at" not in columns
        ):  # a file from before issue 17: its open keys' last call time is not known
            await db.execute("ALTER TABLE actions ADD COLUMN sent_at REAL")
        await db.execute(
            "INSERT OR IGNORE INTO meta (name, value) VALUES ('store_id', ?)", (uuid.uuid4().hex,)
        )
        rows = list(await db.execute_fetchall("SELECT value FROM meta WHERE name = 'store_id'"))
        taken = list(await db.execute_fetchall("SELECT MAX(acquired_at) FROM tenures WHERE takeover = 1"))
        takeover_at = taken[0][0] if taken and taken[0][0] is not None else None
        pruned = list(await db.execute_fetchall("SELECT value FROM meta WHERE name = 'pruned_through'"))
        return cls(db, path, str(rows[0][0]), takeover_at, float(pruned[0][0]) if pruned else None)

    async def record_tenure(
        self, token: int, owner: str, previous_store: str | None, takeover: bool, epoch: int = 0
    ) -> None:
        """Note a lease acquired for this store's partition; a takeover makes older unknown keys look up first.
        The epoch is kept too: a backup of a later acquisition is newer than this file (partition_stores.py)."""
        now = time.time()
        await self._db.execute(
            "INSERT INTO tenures (token, owner, previous_store, takeover, acquired_at) VALUES (?, ?, ?, ?, ?)",
            (token, owner, previous_store, int(takeover), now),
        )
        await self._db.execute(
            "INSERT OR REPLACE INTO meta (name, value) VALUES ('held_epoch', ?)", (str(epoch),)
        )
        if takeover:
            self.takeover_at = now

    def inherits(self, request: ActionRequest) -> bool:
        """A key this store has no row of, asked before it took the partition over (another store may know it) or
        before rows it pruned were last written (it may have known it itself): look it up before calling."""
        at = request.requested_at.timestamp()
        return any(inherited(at, t, self.clock_skew_s) for t in (self.takeover_at, self.pruned_through))

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> None:
        """Readiness: the file is open and SQLite answers (raises otherwise)."""
        await self._db.execute_fetchall("SELECT 1")

    async def get(self, key: str) -> Record | None:
        rows = await self._db.execute_fetchall(
            "SELECT key, input_hash, status, attempts, outcome, sent_at, run_id, step_no FROM actions WHERE key = ?",
            (key,),
        )
        row = next(iter(rows), None)
        if row is None:
            return None
        outcome = _outcome_decoder.decode(row[4]) if row[4] else None
        return Record(
            key=row[0],
            input_hash=row[1],
            status=RecordStatus(row[2]),
            attempts=row[3],
            outcome=outcome,
            sent_at=row[5],
            run_id=row[6],
            step_no=row[7],
        )

    async def begin(self, request: ActionRequest, stream_seq: int) -> bool:
        """Commit the intent. False if the key already has a row (another delivery got there first)."""
        self.fence()
        now = time.time()
        cur = await self._db.execute(
            "INSERT OR IGNORE INTO actions (key, input_hash, run_id, step_no, tool, request, status, attempts, stream_seq, created_at, updated_at, sent_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)",
            (
                request.key,
                request.input_hash,
                request.run_id,
                request.step_no,
                request.tool,
                # The capability was checked once, on delivery; it is not kept (nor needed to settle the intent).
                tool_encoder.encode(msgspec.structs.replace(request, capability=None)),
                RecordStatus.STARTED.value,
                stream_seq,
                now,
                now,
                now,  # the first call is sent right after the intent commits
            ),
        )
        return cur.rowcount == 1

    async def adopt(self, record: Record) -> None:
        """A key this store had just begun is known beside it (its facts): take the first asker, input hash,
        attempts, last call time and any receipt from there, so the store answers it from now on."""
        self.fence()
        await self._db.execute(
            "UPDATE actions SET input_hash = ?, run_id = ?, step_no = ?, status = ?, outcome = ?, attempts = ?,"
            " sent_at = ?, updated_at = ? WHERE key = ?",
            (
                record.input_hash,
                record.run_id,
                record.step_no,
                record.status.value,
                tool_encoder.encode(record.outcome) if record.outcome is not None else None,
                record.attempts,
                record.sent_at,
                time.time(),
                record.key,
            ),
        )

    async def attempt(self, key: str, attempts: int, sent_at: float) -> None:
        # Fenced: an attempt is recorded right before calling the provider again, so a lost lease stops the call.
        self.fence()
        await self._db.execute(
            "UPDATE actions SET attempts = ?, sent_at = ?, updated_at = ? WHERE key = ?",
            (attempts, sent_at, time.time(), key),
        )

    async def mark_unknown(self, key: str) -> bool:
        """True if this marked it: the key was started, and is unknown now (False: it was marked before)."""
        self.fence()
        cur = await self._db.execute(
            "UPDATE actions SET status = ?, updated_at = ? WHERE key = ? AND status = ?",
            (RecordStatus.UNKNOWN.value, time.time(), key, RecordStatus.STARTED.value),
        )
        return cur.rowcount == 1

    async def finish(self, outcome: ActionOutcome, stream_seq: int | None) -> None:
        """Commit the receipt, with the stream sequence it answers, before the request is acknowledged."""
        self.fence()
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

    async def open_intents(self) -> list[tuple[ActionRequest, int, float]]:
        """Intents with no receipt: what a previous life of this executor left behind, with the attempts spent
        and when the last call was sent (a row from before `sent_at` was kept: its last write, no earlier)."""
        rows = await self._db.execute_fetchall(
            f"SELECT request, attempts, COALESCE(sent_at, updated_at) FROM actions WHERE status IN {_OPEN}"
            " ORDER BY created_at"
        )
        return [(_request_decoder.decode(row[0]), int(row[1]), float(row[2])) for row in rows]

    async def recent_receipts(self, since_s: float, rows_a_turn: int = SCAN_ROWS) -> list[ActionOutcome]:
        """Receipts written in the last `since_s`: a previous life may have died before publishing them.

        Read `rows_a_turn` rows of the table at a time, giving the event loop a turn between: the store may run on
        the loop (store_connection.py), rows are never deleted, and one scan of a store of a million rows held
        the loop about 0.4 s (more on a bigger store), its deliveries' heartbeats and lease renewals waiting, just
        as a partition is taken over. (An index on `updated_at` would cost every intent and receipt its upkeep:
        6–12 µs a step.)"""
        since = time.time() - since_s
        last = next(iter(await self._db.execute_fetchall("SELECT MAX(rowid) FROM actions")))[0] or 0
        out: list[ActionOutcome] = []
        for start in range(0, last, rows_a_turn):
            rows = await self._db.execute_fetchall(
                "SELECT outcome FROM actions WHERE rowid > ? AND rowid <= ? AND"
                f" status IN {_SETTLED} AND outcome IS NOT NULL AND updated_at >= ?",
                (start, start + rows_a_turn, since),
            )
            out.extend(_outcome_decoder.decode(row[0]) for row in rows)
            await asyncio.sleep(0)
        return out

    async def prune(self, keys: str, cutoff: float, batch: int) -> int:
        """Delete the settled rows of `keys` (STEP_KEYS or BUSINESS_KEYS) last written before `cutoff`, never an
        intent with no receipt (`started`, `unknown`). Walks the table in rowid windows of `batch` rows from where
        the last pass of this kind left rows it could not delete yet, one short delete per window and a turn of
        the event loop between, so the store's writer is never held long; stops at rows created after `cutoff`
        (rowids grow with creation, and a row is written no earlier than it was created). Returns rows deleted."""
        cursor_name = f"prune_cursor:{keys}"
        found = list(await self._db.execute_fetchall("SELECT value FROM meta WHERE name = ?", (cursor_name,)))
        start = int(found[0][0]) if found else 0
        last = next(iter(await self._db.execute_fetchall("SELECT MAX(rowid) FROM actions")))[0] or 0
        if start < last and cutoff > (self.pruned_through or 0.0):
            # Before any row goes: a key asked before `cutoff` and found nowhere is looked up by key first
            # (`inherits`), so a request asked again after its row was deleted never calls blind.
            await self._db.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('pruned_through', ?)", (repr(cutoff),)
            )
            self.pruned_through = cutoff
        deleted, kept_from = 0, None
        while start < last:
            end = start + batch
            # Never the newest row (`last`): SQLite, with no AUTOINCREMENT, gives a new row the largest rowid + 1,
            # so deleting the largest would hand rowids out again below this kind's cursor, never to be pruned.
            cur = await self._db.execute(
                f"DELETE FROM actions WHERE rowid > ? AND rowid <= ? AND rowid < ? AND {keys}"
                f" AND status IN {_SETTLED} AND updated_at < ?",
                (start, end, last, cutoff),
            )
            deleted += max(cur.rowcount, 0)
            left = next(
                iter(
                    await self._db.execute_fetchall(
                        f"SELECT MIN(rowid), MAX(created_at) FROM actions WHERE rowid > ? AND rowid <= ? AND {keys}",
                        (start, end),
                    )
                )
            )
            if left[0] is not None and kept_from is None:
                kept_from = int(left[0]) - 1  # the next pass starts here: a row it may delete later
            if left[1] is not None and left[1] >= cutoff:
                break
            start = end
            await asyncio.sleep(0)
        cursor = kept_from if kept_from is not None else start
        await self._db.execute(
            "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (cursor_name, str(cursor))
        )
        return deleted

    async def last_rowid(self) -> int:
        return int(next(iter(await self._db.execute_fetchall("SELECT MAX(rowid) FROM actions")))[0] or 0)

    async def progress(self, name: str) -> str | None:
        """A note the store keeps about itself in `meta`: a backup's and a seal's progress (fact_seals.py)."""
        found = list(await self._db.execute_fetchall("SELECT value FROM meta WHERE name = ?", (name,)))
        return str(found[0][0]) if found else None

    async def note(self, name: str, value: str) -> None:
        await self._db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    async def settled_between(
        self, after: int, through: int, settled_before: float, given_up_before: float, waiting: list[int]
    ) -> tuple[list[tuple[str, int]], list[int]]:
        """The rows settled before `settled_before` (key, attempts) among rowid window (`after`, `through`] and the
        rows `waiting` from an earlier call; and the rowids of the others created since `given_up_before`, to
        wait for: a backup taken at `settled_before` may not hold their settled state yet."""
        found: list[tuple[str, int]] = []
        others: list[int] = []
        query = f"SELECT rowid, key, attempts, status IN {_SETTLED} AND updated_at < ?, created_at >= ? FROM actions"
        windows: list[tuple[str, tuple[int, ...]]] = [
            (f"{query} WHERE rowid > ? AND rowid <= ?", (start, min(start + SCAN_ROWS, through)))
            for start in range(after, through, SCAN_ROWS)
        ]
        if waiting:
            windows.append((f"{query} WHERE rowid IN ({','.join('?' * len(waiting))})", tuple(waiting)))
        for sql, bounds in windows:
            rows = await self._db.execute_fetchall(sql, (settled_before, given_up_before, *bounds))
            for rowid, key, attempts, sealable, recent in rows:
                if sealable:
                    found.append((str(key), int(attempts)))
                elif recent:
                    others.append(int(rowid))
            await asyncio.sleep(0)
        return found, others

    async def count(self) -> int:
        rows = await self._db.execute_fetchall("SELECT COUNT(*) FROM actions")
        return int(next(iter(rows))[0])


def _unfenced() -> None:
    """A store opened outside an executor (tools and tests): nothing to check."""
