"""Copies of a partition's SQLite file made and put back with SQLite's online backup API, each written whole or not
at all (a temporary file, fsync, rename, fsync of the folder). Blocking: the executor runs them in a worker thread,
each on a connection of its own (the store's own connection may live on the event loop, store_connection.py)."""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path


def identity(path: Path) -> tuple[str, int] | None:
    """A store file's id and the epoch it was last held under (0: before epochs were noted); None if there is no
    file, or it holds no store."""
    if not path.exists():
        return None
    connection = sqlite3.connect(path)
    try:
        rows = dict(
            connection.execute("SELECT name, value FROM meta WHERE name IN ('store_id', 'held_epoch')")
        )
    except sqlite3.DatabaseError:
        return None
    finally:
        connection.close()
    if "store_id" not in rows:
        return None
    return str(rows["store_id"]), int(rows.get("held_epoch", 0))


def copy(source: Path, target: Path) -> None:
    """Write a consistent copy of the store at `source` to `target`, replacing any file there only once the copy is
    on disk. The copy keeps no write-ahead log beside it: one self-contained file."""
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    _copy_into(source, temporary)
    _install(temporary, target)


def restore(backup: Path, target: Path) -> str:
    """Put a backup in place as the store at `target` under an id of its own (returned): it is not the store it
    copies, which went on after the backup. The id is changed before the copy takes the store's name, so a crash
    at any point leaves either the old file or a restored one that no holder record names."""
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    _copy_into(backup, temporary)
    store_id = uuid.uuid4().hex
    connection = sqlite3.connect(temporary, isolation_level=None)
    try:
        connection.execute("UPDATE meta SET value = ? WHERE name = 'store_id'", (store_id,))
        connection.execute(
            "INSERT OR REPLACE INTO meta (name, value) VALUES ('restored_from', ?)", (backup.name,)
        )
    finally:
        connection.close()
    # The old file's write-ahead log must go first: SQLite would apply it to whatever file has the name next.
    for leftover in (target.with_name(target.name + "-wal"), target.with_name(target.name + "-shm")):
        leftover.unlink(missing_ok=True)
    _install(temporary, target)
    return store_id


def check(path: Path) -> bool:
    """Whether a backup file is whole (SQLite's quick check): a damaged one is passed over, never restored."""
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        return [row[0] for row in connection.execute("PRAGMA quick_check")] == ["ok"]
    except sqlite3.DatabaseError:
        return False
    finally:
        connection.close()


def _copy_into(source: Path, temporary: Path) -> None:
    reader = sqlite3.connect(source)
    try:
        writer = sqlite3.connect(temporary, isolation_level=None)
        try:
            reader.backup(writer)  # one step: a single read transaction, so one consistent snapshot
            writer.execute("PRAGMA journal_mode=DELETE")
        finally:
            writer.close()
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        reader.close()


def _install(temporary: Path, target: Path) -> None:
    with open(temporary, "rb") as written:
        os.fsync(written.fileno())
    os.replace(temporary, target)
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
