"""How the action store talks to SQLite: on the event loop where a commit never waits on the disk, in aiosqlite's
thread where it does.

With WAL and `synchronous=NORMAL` (the default) a commit appends to the WAL in the page cache and returns; the
disk is synced only at checkpoints. A statement then costs tens of microseconds, less than aiosqlite's hop to its
thread and back (a future, a wake-up of the loop through its self-pipe), which was about 29 % of the executor's
samples on steps5. With `synchronous=FULL` every commit waits for an fsync, which must not stop the loop (its
deliveries' heartbeats, its lease renewals): that store keeps the thread. Measured in docs/benchmarks.md."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import aiosqlite


class Rows(Protocol):
    @property
    def rowcount(self) -> int: ...


class StoreConnection(Protocol):
    """What the action store uses of a SQLite connection (aiosqlite's surface)."""

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> Rows: ...

    async def execute_fetchall(
        self, sql: str, parameters: Iterable[Any] | None = None
    ) -> Iterable[sqlite3.Row]: ...

    async def executescript(self, sql_script: str) -> Any: ...

    async def close(self) -> None: ...


class OnTheLoop:
    """sqlite3 called where the store is awaited: for a file whose commits never wait on the disk."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> Rows:
        return self._connection.execute(sql, tuple(parameters or ()))

    async def execute_fetchall(
        self, sql: str, parameters: Iterable[Any] | None = None
    ) -> Iterable[sqlite3.Row]:
        return self._connection.execute(sql, tuple(parameters or ())).fetchall()

    async def executescript(self, sql_script: str) -> None:
        self._connection.executescript(sql_script)

    async def close(self) -> None:
        self._connection.close()


async def connect(path: Path, synchronous: str) -> StoreConnection:
    """An autocommit connection to the store's file: on the loop for `NORMAL`, in a thread for `FULL`."""
    if synchronous == "NORMAL":
        return OnTheLoop(sqlite3.connect(path, isolation_level=None))
    return await aiosqlite.connect(path, isolation_level=None)
