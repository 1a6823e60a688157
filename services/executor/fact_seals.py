"""Gives a key's facts their TTL once two backups of its store hold the key's settled state: a fact written with no
backup behind it is kept (a takeover that restores an older backup learns the key from it), and no fact expires
while a release that cannot restore a store may still take a partition over."""

from __future__ import annotations

import logging
import time

from crashsafe.contracts.errors import CrashsafeError
from crashsafe.contracts.keys import undone_by
from crashsafe.domain.backup_rules import facts_expiry_blocked
from crashsafe.domain.key_facts import shared
from crashsafe.domain.partition_ownership import Holding
from crashsafe.services.executor.fact_book import FactBook
from crashsafe.services.executor.store import ActionStore
from crashsafe.services.platform.logs import log
from crashsafe.services.records.rollout_facts import read_rollout

# The rows a seal found not yet settled in the backup are looked at again by the next seals, for a day at most and
# at most this many per store: past either, a key's facts, once it settles, simply keep no TTL (safe, and rare).
GIVE_UP_S = 86_400.0
WAITING_KEPT = 1_000
# How much earlier than a backup's start a row must have been written to be counted in it. A write noted before
# the start was queued on the store's connection before the backup read its last rowid, so it is in; the margin
# is for the wall clock stepping back.
IN_BACKUP_MARGIN_S = 1.0
# At most this many rows a seal reads per store and round: after a long time blocked (facts kept while 0.2.0 ran)
# the backlog is sealed over many rounds, so no round holds up the backups of the other partitions for long.
SEAL_ROWS = 5_000
# How long one read of the versions bucket answers for (a round asks once per partition it backs up).
CENSUS_FRESH_S = 5.0
# Store notes: the last backup of this store (`<last rowid> <started at>`), the rowid the seal has reached, and
# the rows it waits on.
LAST_BACKUP = "last_backup"
SEALED_THROUGH = "sealed_through"
SEAL_WAITING = "seal_waiting"


class FactSeals:
    def __init__(self, facts: FactBook, ttl_s: int, logger: logging.Logger) -> None:
        self.facts = facts
        self.ttl_s = ttl_s  # 0: facts kept forever, nothing sealed
        self.logger = logger
        self.sealed = 0  # facts given their TTL by this replica (tests, logs)
        self._said: str | None = None
        self._fresh_until = 0.0

    async def blocked(self) -> str | None:
        """Why no fact may be given a TTL now (None: they may), from the versions bucket (read once a while: a
        round asks for every partition it backs up)."""
        if not self.ttl_s:
            return "CRASHSAFE_RETENTION_KEY_FACTS_S is 0"
        if time.monotonic() < self._fresh_until:
            return self._said
        self._fresh_until = time.monotonic() + CENSUS_FRESH_S
        facts = await read_rollout(self.facts.broker, self.facts.ns)
        if facts.unreadable:
            return facts.unreadable
        why = facts_expiry_blocked(facts.contracted, facts.beats)
        if why != self._said:
            self._said = why
            log(
                self.logger,
                logging.WARNING if why else logging.INFO,
                "key facts kept without a TTL"
                if why
                else "key facts get their TTL once two backups hold them",
                why=why,
            )
        return why

    async def note_backup(self, store: ActionStore, last_rowid: int, started_at: float) -> None:
        await store.note(LAST_BACKUP, f"{last_rowid} {started_at!r}")

    async def seal(self, store: ActionStore, partition: int, holding: Holding) -> int:
        """Give their TTL to the facts of the keys the store's previous backup held settled (called after a newer
        backup is written, so two hold them). Returns how many; stops at the first fact a newer holder wrote."""
        previous = await store.progress(LAST_BACKUP)
        if previous is None:
            return 0
        backed_up, started_at = int(previous.split()[0]), float(previous.split()[1])
        after = int(await store.progress(SEALED_THROUGH) or 0)
        through = max(after, min(backed_up, after + SEAL_ROWS))
        waiting = [int(r) for r in (await store.progress(SEAL_WAITING) or "").split()]
        rows, still = await store.settled_between(
            after, through, started_at - IN_BACKUP_MARGIN_S, started_at - GIVE_UP_S, waiting
        )
        keys: dict[str, None] = {}
        for key, attempts in rows:
            if shared(key) or attempts > 1:  # the keys that have facts (key_records.py)
                keys[key] = None
            # Its 'undone' mark on the key it undid, written with the compensation's receipt.
            if (base := undone_by(key)) is not None and shared(base):
                keys[base] = None
        sealed = 0
        try:
            for key in keys:
                sealed += await self.facts.seal(key, self.ttl_s, holding, store.fence, partition)
        except CrashsafeError as exc:
            log(self.logger, logging.WARNING, "seal stopped", partition=partition, error=exc.message)
            return sealed
        await store.note(SEALED_THROUGH, str(through))
        await store.note(SEAL_WAITING, " ".join(str(r) for r in still[:WAITING_KEPT]))
        self.sealed += sealed
        return sealed
