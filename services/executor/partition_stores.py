"""A partition's store follows the partition: each executor backs up the stores it holds (every round and at a clean
release), and a replica taking a partition over from another store restores the newest backup first, so a
moved partition meets its own history instead of an empty file (docs/decisions.md, "A partition's store follows
it"). Once two backups hold a key's settled state, its facts get their TTL (fact_seals.py)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from crashsafe.contracts.backup_schedule import BackupSchedule
from crashsafe.contracts.errors import CrashsafeError, StoreBackupUnavailable
from crashsafe.domain.backup_rules import BackupName, replaces_local, restorable
from crashsafe.domain.partition_ownership import Holder, Holding
from crashsafe.services.executor import store_snapshots
from crashsafe.services.executor.backup_shelf import BackupShelf
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.fact_seals import FactSeals
from crashsafe.services.executor.partitions import PartitionKeeper
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.logs import log
from crashsafe.services.platform.settings import Settings

# How many of a partition's newest backups a takeover may try: a fact is sealed only once two backups hold its key
# (fact_seals.py), so the one before a damaged newest still holds every key whose facts may have expired.
FALLBACKS = 2
# A partition's holder record (which store held it last), and where this replica stands in its fencing order.
Previous = Callable[[int], Awaitable[Holder | None]]
Held = Callable[[int], Holding]


class PartitionStores:
    def __init__(
        self,
        schedule: BackupSchedule,
        namespace: str,
        family: str,
        stores: dict[int, ActionStore],
        holding: Held,
        seals: FactSeals,
        logger: logging.Logger,
    ) -> None:
        self.schedule = schedule
        self.shelf = BackupShelf(schedule.dir, namespace, family, schedule.keep) if schedule.dir else None
        # The executor's own map of held partitions to their stores (the same dict: it changes as leases move).
        self.stores = stores
        self.holding = holding  # where this replica stands in a partition's fencing order ((0, 0): not held)
        self.seals = seals
        self.logger = logger
        self.written: list[BackupName] = []  # this replica's backups, newest last (tests, logs)
        self.restored: dict[int, BackupName] = {}  # partition: the backup its store was restored from
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(
        cls,
        settings: Settings,
        family: str,
        stores: dict[int, ActionStore],
        holding: Held,
        facts: FactBook,
        logger: logging.Logger,
    ) -> PartitionStores:
        seals = FactSeals(facts, settings.retention.key_facts_s, logger)
        return cls(settings.store_backups, settings.namespace.name, family, stores, holding, seals, logger)

    async def take_up(
        self, partition: int, token: int, path: Path, keeper: PartitionKeeper, settings: Settings
    ) -> ActionStore:
        """The store of a partition just acquired under lease `token`: opened (restored first where it must be)
        and held, its writes fenced by the lease."""
        store = await self.open(partition, path, settings.sqlite_sync, keeper.previous)
        try:
            store.clock_skew_s = settings.clock_skew_s
            holder, taken = await keeper.hold(store, partition, token, restored=partition in self.restored)
        except BaseException:
            await store.close()
            raise
        if taken:
            log(
                self.logger,
                logging.WARNING,
                "partition taken over from another store; keys it never saw are looked up first",
                partition=partition,
                previous_store=holder.store if holder else None,
            )
        return store

    async def put_down(self, partition: int, store: ActionStore | None) -> None:
        """A partition let go, its keys finished: a clean release backs its store up first (a lost partition's is
        not: its successor restored what it could), then the store closes."""
        if store is None:
            return
        try:
            await self.back_up(partition, store)
        except (CrashsafeError, sqlite3.Error, ValueError) as exc:
            log(
                self.logger,
                logging.WARNING,
                "release backup not written",
                partition=partition,
                error=str(exc),
            )
        finally:
            await store.close()

    async def open(self, partition: int, path: Path, synchronous: str, previous: Previous) -> ActionStore:
        """The partition's store, just acquired: the file here if the holder record names it; otherwise the newest
        backup, if it is of a later acquisition than this file, restored under a store id of its own (so the
        acquisition is a takeover: keys asked before it and found nowhere are looked up first, as without
        backups). No holder record (a leases bucket made again) is no proof this file is the latest: the epochs,
        kept beside the facts, decide. A backup from a holder the fencing order puts above this one is never
        restored."""
        self.restored.pop(partition, None)
        if self.shelf is not None:
            holder = await previous(partition)
            local = await asyncio.to_thread(store_snapshots.identity, path)
            if holder is None or local is None or local[0] != holder.store:
                await self._restore(partition, path, local[1] if local else None)
        return await ActionStore.open(path, synchronous)

    async def _restore(self, partition: int, path: Path, local_epoch: int | None) -> None:
        assert self.shelf is not None
        holding = self.holding(partition)
        try:
            names = restorable(await self.shelf.names(partition), holding)
            for tried, name in enumerate(names):
                if not replaces_local(name, local_epoch):
                    return  # this host's own file is as new as any backup a predecessor left
                if tried == FALLBACKS:
                    raise StoreBackupUnavailable(
                        f"the newest {FALLBACKS} backups of partition {partition} are damaged; an older one may"
                        " miss keys whose facts expired: restore one by hand, or check the volume",
                        partition=partition,
                        backup=names[0].file,
                    )
                if not await self.shelf.whole(partition, name):
                    log(self.logger, logging.ERROR, "a damaged store backup passed over", backup=name.file)
                    continue
                store_id = await self.shelf.restore(partition, name, path)
                self.restored[partition] = name
                log(
                    self.logger,
                    logging.WARNING,
                    "partition store restored from its backup; keys since are learnt from their facts",
                    partition=partition,
                    backup=name.file,
                    store=store_id,
                )
                return
        except (OSError, sqlite3.Error) as exc:
            raise StoreBackupUnavailable(
                f"the backups of partition {partition} could not be read or restored: {exc}",
                partition=partition,
            ) from exc

    async def back_up(self, partition: int, store: ActionStore) -> BackupName | None:
        """Back up one held store, then seal the facts its previous backup held. None: not held, nothing written."""
        holding = self.holding(partition)
        if self.shelf is None or holding == Holding(0, 0):
            return None  # a lost partition's store is its successor's to back up, from what it restored
        # The time first: a row written before it was queued before the rowid's read, so the backup holds it.
        started_at = time.time()
        last_rowid = await store.last_rowid()
        try:
            name = await self.shelf.put(store.path, partition, holding, store.store_id)
        except (OSError, sqlite3.Error) as exc:
            raise StoreBackupUnavailable(
                f"partition {partition}'s store could not be backed up: {exc}", partition=partition
            ) from exc
        self.written.append(name)
        if await self.seals.blocked() is None:
            await self.seals.seal(store, partition, holding)
        await self.seals.note_backup(store, last_rowid, started_at)
        return name

    async def round(self) -> int:
        """One backup of every store held now; a store that moved or closed under the round is skipped."""
        done = 0
        for partition, store in list(self.stores.items()):
            if self.stores.get(partition) is not store:
                continue
            try:
                done += await self.back_up(partition, store) is not None
            except (CrashsafeError, sqlite3.Error, ValueError) as exc:
                # A store closed under the round (its partition moved), the volume away: the next round tries again.
                log(
                    self.logger,
                    logging.WARNING,
                    "store backup not written",
                    partition=partition,
                    error=str(exc),
                )
        return done

    def start(self) -> None:
        if self.shelf is not None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.schedule.every_s)
            await self.round()
