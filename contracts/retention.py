"""How long the records that grow with every run are kept, as a deployment configures it: one place the settings,
the record writers, the executor's pruning and the docs agree on the defaults and on the shortest safe value.

A retention is in whole seconds (the server's per-message TTL is); 0 keeps the record forever, as 0.2.0 did. Each
floor is what the record's late readers need (docs/capacity.md, "What grows without bound today"): a setting below
it is refused at start, because it would expire a record still in use."""

from __future__ import annotations

from dataclasses import dataclass

HOUR_S = 3_600
DAY_S = 86_400
# Mirrors of bounds declared elsewhere (contracts may import no domain module); tests/unit/test_retention.py holds
# them equal to the originals: a run's longest deadline and an approval's longest expiry (domain/catalog_check.py),
# how long DEAD_LETTERS keeps a letter (contracts/streams.py), and how far back the reconciler looks (24 h).
LONGEST_RUN_S = 7 * DAY_S
DEAD_LETTERS_KEPT_S = 30 * DAY_S
RECONCILER_LOOKBACK_S = DAY_S


@dataclass(frozen=True, slots=True)
class RecordRetention:
    """Seconds each kind of record is kept after its last write (0: forever). The defaults are safe; tests shorten
    them with dataclasses.replace, below the floors, to watch them expire."""

    # `<ns>_sessions` lanes: refreshed on every write; must outlive the longest a run can own its session.
    sessions_s: int = 8 * DAY_S
    # `<ns>_active` records: kept this long past the latest deadline an entry holds (never while it counts a run).
    active_s: int = DAY_S
    # `<ns>_approvals` records: kept this long past their expiry (pending) or their decision.
    approvals_s: int = 7 * DAY_S
    # `<ns>_dead_marks`: a mark outlives its letter (DEAD_LETTERS keeps 30 days), or a letter could be replayed twice.
    dead_marks_s: int = 31 * DAY_S
    # `<ns>_projections` receipts: longer than a run can be planned again by the projector or the reconciler.
    receipts_s: int = 7 * DAY_S
    # Executor SQLite rows of step keys (`run_…:n`), once settled; a key asked again later is looked up by key first.
    step_rows_s: int = 7 * DAY_S
    # Executor SQLite rows of business keys (`charge:…`): the business's own window (refunds, disputes).
    business_rows_s: int = 180 * DAY_S
    # How often an executor prunes each partition's store, and at most how many rows one delete takes.
    prune_every_s: float = 300.0
    prune_batch: int = 500
    # `<ns>_RUNS` journals: the hot window. An ended run no late message can reach is archived (written to the
    # archive, read back) and its subjects purged once its journal has not moved for this long, and only where
    # an archive is configured (CRASHSAFE_ARCHIVE_DIR); 0 keeps every journal in the stream, as 0.2.0 did.
    journals_s: int = 3 * DAY_S
    # How often the reconciler's archiver looks for runs past the hot window, and at most how many it archives
    # in one pass (the rest on the next).
    archive_every_s: float = 60.0
    archive_batch: int = 200
    # `<ns>_key_facts`: a key's facts are given this TTL once two backups of its partition's store hold the key
    # settled (services/executor/fact_seals.py). 0 keeps them forever, as 0.2.0 did: the only choice without store
    # backups, whose floor it depends on (contracts/backup_schedule.py). Partition epochs never expire.
    key_facts_s: int = 0


# The shortest non-zero value each retention may be set to (the environment's check; tests may go below).
FLOORS: dict[str, int] = {
    "sessions_s": LONGEST_RUN_S + HOUR_S,
    "active_s": 1,
    "approvals_s": RECONCILER_LOOKBACK_S,
    "dead_marks_s": DEAD_LETTERS_KEPT_S + HOUR_S,
    "receipts_s": RECONCILER_LOOKBACK_S,
    "step_rows_s": DAY_S,
    "business_rows_s": 30 * DAY_S,
    # Past the reconciler's look-back (it re-reads 24 h of milestones on start) and the planner's (6 h).
    "journals_s": RECONCILER_LOOKBACK_S,
}
