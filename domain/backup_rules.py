"""Which backup of a partition's store a new holder restores, which backups are kept, and whether key facts may
expire yet: pure decisions over backup names, the fencing order and the live releases."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from crashsafe.contracts.backup_schedule import FACTS_EXPIRE_SINCE
from crashsafe.contracts.heartbeats import VersionBeat
from crashsafe.domain.partition_ownership import Holding
from crashsafe.domain.release_window import past_the_rollout

SUFFIX = ".sqlite3"


@dataclass(frozen=True, slots=True)
class BackupName:
    """One backup file of a partition's store: the holder's place in the fencing order when it was taken (epoch,
    then lease token) and the id of the store it copies. Its folder names the namespace, family and partition."""

    epoch: int
    token: int
    store: str

    @property
    def holding(self) -> Holding:
        return Holding(self.epoch, self.token)

    @property
    def file(self) -> str:
        return f"{self.epoch}-{self.token}-{self.store}{SUFFIX}"


def parse(file: str) -> BackupName | None:
    """A backup's name from its file's (None: not a backup's, such as a temporary file being written)."""
    if not file.endswith(SUFFIX) or file.startswith("."):
        return None
    parts = file.removesuffix(SUFFIX).split("-")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2].isalnum():
        return None
    return BackupName(int(parts[0]), int(parts[1]), parts[2])


def restorable(names: Iterable[BackupName], holding: Holding) -> list[BackupName]:
    """The backups a holder at `holding` may restore, newest first: only those taken by a holder the fencing order
    puts below it. One from above (a later holder's, or a file that does not belong) is never taken: it may hold
    effects the partition's real history does not."""
    return sorted((n for n in names if n.holding < holding), key=lambda n: n.holding, reverse=True)


def beyond_kept(names: Iterable[BackupName], keep: int) -> list[BackupName]:
    """The backups to delete: all but the `keep` highest in the fencing order (a late backup of a holder that lost
    the partition sorts below its successor's, whenever it was written)."""
    ordered = sorted(names, key=lambda n: n.holding, reverse=True)
    return ordered[keep:]


def replaces_local(backup: BackupName, local_epoch: int | None) -> bool:
    """Whether a backup is newer than the store file this host already has for the partition (None: it has none):
    a backup of a later acquisition is; one of this file's own acquisition, or an earlier one, is not."""
    return local_epoch is None or backup.epoch > local_epoch


def facts_expiry_blocked(
    contracted: str | None, beats: Iterable[VersionBeat], since: str = FACTS_EXPIRE_SINCE
) -> str | None:
    """Why no key fact may be given a TTL now (None: they may). A release before `since` neither backs up nor
    restores a store: a partition it takes over meets only its own file and the facts, so a fact that expired
    would let it act again. Until `crashsafe infra contract` has recorded `since` or later, and while any live
    process runs an older release, facts are kept forever, as before."""
    return past_the_rollout(since, contracted, beats, "once every executor runs it")
