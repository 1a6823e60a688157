"""The store backup settings read from the environment, and the key facts' retention they allow: facts may expire
only where every partition's store is backed up, and never sooner than a backup round, a lease and a margin."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from crashsafe.contracts.backup_schedule import KEY_FACTS_MARGIN_S, BackupSchedule, key_facts_floor
from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.retention import RecordRetention


def read_store_backups(
    get: Callable[[str], str | None], retention: RecordRetention, lease_s: int
) -> tuple[BackupSchedule, RecordRetention]:
    """The backup schedule, and `retention` with the key facts' TTL; InvalidSetting names the first variable that
    is not usable."""
    folder = get("CRASHSAFE_STORE_BACKUP_DIR")
    schedule = BackupSchedule(dir=Path(folder) if folder else None)
    every = get("CRASHSAFE_STORE_BACKUP_EVERY_S")
    if every is not None:
        try:
            every_s = float(every)
        except ValueError:
            every_s = -1.0
        if not every_s > 0:
            raise InvalidSetting(
                variable="CRASHSAFE_STORE_BACKUP_EVERY_S", value=every, expected="seconds, a number > 0"
            )
        schedule = dataclasses.replace(schedule, every_s=every_s)
    raw = get("CRASHSAFE_RETENTION_KEY_FACTS_S")
    if raw is None:
        return schedule, retention
    floor = key_facts_floor(schedule.every_s, lease_s)
    expected = (
        f"0 (kept forever) or whole seconds >= {floor} (CRASHSAFE_STORE_BACKUP_EVERY_S {schedule.every_s:g} + the"
        f" lease {lease_s} + {KEY_FACTS_MARGIN_S}), and only with CRASHSAFE_STORE_BACKUP_DIR set"
    )
    try:
        value = int(raw)
    except ValueError:
        raise InvalidSetting(
            variable="CRASHSAFE_RETENTION_KEY_FACTS_S", value=raw, expected=expected
        ) from None
    if value < 0 or (value and (not schedule.on or value < floor)):
        # Without backups a partition that moves meets an empty store: its keys' facts are all it has.
        raise InvalidSetting(variable="CRASHSAFE_RETENTION_KEY_FACTS_S", value=raw, expected=expected)
    return schedule, dataclasses.replace(retention, key_facts_s=value)
