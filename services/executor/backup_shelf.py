"""The backup directory of one tool family's partition stores (`<dir>/<ns>/<family>/p<n>/`): put a backup there,
list what is there, put one back as a partition's store, and keep only the newest few. File work runs in a thread."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from crashsafe.domain.backup_rules import BackupName, beyond_kept, parse
from crashsafe.domain.partition_ownership import Holding
from crashsafe.services.executor import store_snapshots

# A temporary file this old is a backup whose writer died before its rename (a pod killed at a release): removed.
UNFINISHED_S = 3_600.0


def _forget_unfinished(folder: Path, before: float) -> None:
    for left in folder.glob(".*.tmp"):
        if left.stat().st_mtime < before:
            left.unlink(missing_ok=True)


class BackupShelf:
    def __init__(self, root: Path, namespace: str, family: str, keep: int) -> None:
        self.root = root / namespace / family
        self.keep = keep

    def folder(self, partition: int) -> Path:
        return self.root / f"p{partition}"

    async def put(self, store_path: Path, partition: int, holding: Holding, store_id: str) -> BackupName:
        """Back up the store at `store_path`, named by the holder's place in the fencing order; then delete the
        partition's backups beyond the newest `keep`."""
        name = BackupName(holding.epoch, holding.token, store_id)
        folder = self.folder(partition)
        await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(store_snapshots.copy, store_path, folder / name.file)
        for old in beyond_kept(await self.names(partition), self.keep):
            await asyncio.to_thread((folder / old.file).unlink, missing_ok=True)
        await asyncio.to_thread(_forget_unfinished, folder, time.time() - UNFINISHED_S)
        return name

    async def names(self, partition: int) -> list[BackupName]:
        folder = self.folder(partition)

        def listed() -> list[BackupName]:
            if not folder.is_dir():
                return []
            return [n for f in folder.iterdir() if (n := parse(f.name)) is not None]

        return await asyncio.to_thread(listed)

    async def whole(self, partition: int, name: BackupName) -> bool:
        return await asyncio.to_thread(store_snapshots.check, self.folder(partition) / name.file)

    async def restore(self, partition: int, name: BackupName, store_path: Path) -> str:
        """Put the backup in place as the partition's store at `store_path`; returns the restored store's new id."""
        await asyncio.to_thread(store_path.parent.mkdir, parents=True, exist_ok=True)
        return await asyncio.to_thread(
            store_snapshots.restore, self.folder(partition) / name.file, store_path
        )
