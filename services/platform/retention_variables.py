"""The retention settings read from the environment: a variable per kind of record that grows with every run, each
checked against the shortest value its late readers allow (contracts/retention.py's floors)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from crashsafe.contracts.errors import InvalidSetting
from crashsafe.contracts.retention import FLOORS, RecordRetention

# Variable -> the RecordRetention field it sets.
RETENTION_VARIABLES = {
    "CRASHSAFE_RETENTION_SESSIONS_S": "sessions_s",
    "CRASHSAFE_RETENTION_ACTIVE_S": "active_s",
    "CRASHSAFE_RETENTION_APPROVALS_S": "approvals_s",
    "CRASHSAFE_RETENTION_DEAD_MARKS_S": "dead_marks_s",
    "CRASHSAFE_RETENTION_RECEIPTS_S": "receipts_s",
    "CRASHSAFE_RETENTION_STEP_ROWS_S": "step_rows_s",
    "CRASHSAFE_RETENTION_BUSINESS_ROWS_S": "business_rows_s",
    "CRASHSAFE_RETENTION_JOURNALS_S": "journals_s",
}


def read_retention(get: Callable[[str], str | None]) -> RecordRetention:
    """The deployment's retention: each variable a whole number of seconds, 0 (forever) or at least its floor;
    the pruning schedule a positive number of seconds and rows. InvalidSetting names the first that is not."""
    values: dict[str, Any] = {}
    for variable, name in RETENTION_VARIABLES.items():
        raw = get(variable)
        if raw is None:
            continue
        floor = FLOORS[name]
        expected = f"0 (kept forever) or whole seconds >= {floor}"
        try:
            value = int(raw)
        except ValueError:
            raise InvalidSetting(variable=variable, value=raw, expected=expected) from None
        if value < 0 or 0 < value < floor:
            raise InvalidSetting(variable=variable, value=raw, expected=expected)
        values[name] = value
    every = get("CRASHSAFE_PRUNE_EVERY_S")
    if every is not None:
        try:
            values["prune_every_s"] = float(every)
        except ValueError:
            values["prune_every_s"] = -1.0
        if not values["prune_every_s"] > 0:
            raise InvalidSetting(
                variable="CRASHSAFE_PRUNE_EVERY_S", value=every, expected="seconds, a number > 0"
            )
    batch = get("CRASHSAFE_PRUNE_BATCH")
    if batch is not None:
        if not batch.isdigit() or int(batch) < 1:
            raise InvalidSetting(
                variable="CRASHSAFE_PRUNE_BATCH", value=batch, expected="a whole number >= 1"
            )
        values["prune_batch"] = int(batch)
    archive_every = get("CRASHSAFE_ARCHIVE_EVERY_S")
    if archive_every is not None:
        try:
            values["archive_every_s"] = float(archive_every)
        except ValueError:
            values["archive_every_s"] = -1.0
        if not values["archive_every_s"] > 0:
            raise InvalidSetting(
                variable="CRASHSAFE_ARCHIVE_EVERY_S", value=archive_every, expected="seconds, a number > 0"
            )
    kept = dataclasses.replace(RecordRetention(), **values)
    # A run is archived only once its projection receipts say every projection settled: receipts that expire
    # first would keep every journal forever, silently.
    if kept.journals_s and kept.receipts_s and kept.journals_s >= kept.receipts_s:
        raise InvalidSetting(
            variable="CRASHSAFE_RETENTION_JOURNALS_S",
            value=str(kept.journals_s),
            expected=f"0 or whole seconds shorter than CRASHSAFE_RETENTION_RECEIPTS_S ({kept.receipts_s})",
        )
    return kept
