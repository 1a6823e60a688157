"""Backups of each partition's action store, as a deployment configures them: where they go, how often, how many are
kept, and the shortest key-facts retention they allow (the settings, the executor and the docs agree here)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# The backups of one partition kept in the directory: the newest, and a few before it in case it is damaged.
KEEP = 3
# Added to a backup round and a lease in the key facts' floor: a round that runs long, the hosts' clock skew, a
# takeover's restore.
KEY_FACTS_MARGIN_S = 120
# The first release that backs stores up and restores them: facts may expire only once every process is of it.
FACTS_EXPIRE_SINCE = "0.3.0"


@dataclass(frozen=True, slots=True)
class BackupSchedule:
    """Where each executor backs up the stores of the partitions it holds (None: no backups, as 0.2.0), every how
    many seconds, and how many backups of a partition it keeps."""

    dir: Path | None = None
    every_s: float = 300.0
    keep: int = KEEP

    @property
    def on(self) -> bool:
        return self.dir is not None


def key_facts_floor(every_s: float, lease_s: int) -> int:
    """The shortest TTL a key's facts may have: longer than a backup round, a lease and the margin, so a fact
    outlives the next round after the one that sealed it (docs/decisions.md, "A partition's store follows it")."""
    return math.ceil(every_s) + lease_s + KEY_FACTS_MARGIN_S
