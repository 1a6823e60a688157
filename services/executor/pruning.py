"""Keeps an executor's stores bounded: on a schedule, each held partition's settled rows past their retention are
deleted in short batches (step keys after the step window, business keys after the business window)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time

from crashsafe.contracts.retention import RecordRetention
from crashsafe.services.executor.store import BUSINESS_KEYS, STEP_KEYS, ActionStore
from crashsafe.services.platform.logs import log


class Pruner:
    """Every `prune_every_s`, every store this replica holds now (the executor's own map, which changes as leases
    move): its settled step rows older than `step_rows_s`, then its settled business rows older than
    `business_rows_s` (0: kept forever). A store closed under a pass (its partition moved) ends that pass."""

    def __init__(
        self, stores: dict[int, ActionStore], retention: RecordRetention, logger: logging.Logger
    ) -> None:
        self.stores = stores
        self.retention = retention
        self.logger = logger
        self.deleted = 0  # rows this replica has deleted, for the tests and the log
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.retention.step_rows_s or self.retention.business_rows_s:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.retention.prune_every_s)
            await self.prune_all()

    async def prune_all(self, now: float | None = None) -> int:
        """One pass over the stores held now; returns the rows deleted."""
        now = time.time() if now is None else now
        deleted = 0
        for partition, store in list(self.stores.items()):
            for keys, kept_s in (
                (STEP_KEYS, self.retention.step_rows_s),
                (BUSINESS_KEYS, self.retention.business_rows_s),
            ):
                if not kept_s or self.stores.get(partition) is not store:
                    continue
                try:
                    deleted += await store.prune(keys, now - kept_s, self.retention.prune_batch)
                except (sqlite3.Error, ValueError) as exc:
                    # A store closed under the pass (its partition moved: sqlite3's ProgrammingError, aiosqlite's
                    # ValueError), or a busy file: the next pass tries again; nothing was half done.
                    log(
                        self.logger,
                        logging.WARNING,
                        "prune pass stopped",
                        partition=partition,
                        error=str(exc),
                    )
        self.deleted += deleted
        if deleted:
            log(self.logger, logging.INFO, "settled rows pruned", rows=deleted)
        return deleted
