"""Which backup a new holder restores, which are kept, and when key facts may expire (domain/backup_rules.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from crashsafe.contracts.heartbeats import VersionBeat
from crashsafe.domain.backup_rules import (
    BackupName,
    beyond_kept,
    facts_expiry_blocked,
    parse,
    replaces_local,
    restorable,
)
from crashsafe.domain.partition_ownership import Holding

OLD = BackupName(epoch=100, token=7, store="a1")
NEWER = BackupName(epoch=100, token=9, store="a1")  # the same tenure, a later renewal
NEXT = BackupName(epoch=200, token=3, store="b2")  # a later acquisition: its token restarts lower


def test_a_backup_name_reads_back_and_other_files_are_not_backups() -> None:
    assert parse(NEXT.file) == NEXT
    for other in (".1-2-ab.sqlite3.x.tmp", "1-2.sqlite3", "x-2-ab.sqlite3", "1-2-ab.json", ".1-2-ab.sqlite3"):
        assert parse(other) is None, other


def test_the_newest_backup_below_the_new_holder_is_restored_never_one_above_it() -> None:
    """The fencing order, not the clock or the token alone: epoch first."""
    assert restorable([OLD, NEXT, NEWER], Holding(300, 1)) == [NEXT, NEWER, OLD]
    # A holder at epoch 150 sits between: the epoch-200 backup is from above it (a later holder, or a stray file).
    assert restorable([OLD, NEXT, NEWER], Holding(150, 1)) == [NEWER, OLD]
    assert restorable([OLD], Holding(100, 7)) == []  # its own place is not below it


def test_the_backups_beyond_the_newest_few_in_the_fencing_order_go() -> None:
    late_zombie = BackupName(epoch=100, token=11, store="a1")  # written after NEXT, by a holder that lost
    assert beyond_kept([NEXT, OLD, late_zombie, NEWER], 2) == [NEWER, OLD]


def test_a_backup_replaces_this_hosts_file_only_if_it_is_of_a_later_acquisition() -> None:
    assert replaces_local(NEXT, None) and replaces_local(NEXT, 100)
    assert not replaces_local(NEXT, 200) and not replaces_local(OLD, 100)


def _beat(version: str) -> VersionBeat:
    now = datetime.now(UTC)
    return VersionBeat(
        version=version,
        runs_beside_since="0.1.0",
        service="executor-payment",
        worker="w",
        pid=1,
        started_at=now,
        beat_at=now,
    )


def test_facts_expire_only_once_contracted_to_0_3_0_with_no_older_process_alive() -> None:
    assert facts_expiry_blocked("0.3.0", [_beat("0.3.0")]) is None
    assert facts_expiry_blocked("0.4.0", []) is None
    assert "0.2.0" in (facts_expiry_blocked("0.3.0", [_beat("0.3.0"), _beat("0.2.0")]) or "")
    assert "infra contract" in (facts_expiry_blocked(None, [_beat("0.3.0")]) or "")
    assert "infra contract" in (facts_expiry_blocked("0.2.0", []) or "")
    assert facts_expiry_blocked("0.3.0", [_beat("garbage")]) is not None
