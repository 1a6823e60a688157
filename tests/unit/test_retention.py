"""Retention, pure: a record's TTL never ends while a reader still needs it, and the floors the settings enforce are
the bounds they stand for (issue 31, months of runs)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from crashsafe.contracts.active import ActiveRuns
from crashsafe.contracts.approvals import ApprovalRecord, ApprovalStatus
from crashsafe.contracts.retention import (
    DEAD_LETTERS_KEPT_S,
    FLOORS,
    LONGEST_RUN_S,
    RecordRetention,
)
from crashsafe.contracts.streams import INBOUND_KEPT_S, stream_specs
from crashsafe.contracts.subjects import Namespace, StreamKind
from crashsafe.domain.catalog_check import MAX_APPROVAL_TTL_S, MAX_DEADLINE_S
from crashsafe.domain.record_ttls import active_ttl, approval_ttl, kept_ttl
from crashsafe.services.platform.retention_variables import RETENTION_VARIABLES

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def test_the_floors_stand_for_the_bounds_they_mirror() -> None:
    """The mirrors in contracts/retention.py equal the bounds declared where they live, and each floor clears them."""
    dead_letters = next(
        s for s in stream_specs(Namespace()) if s.name.endswith(StreamKind.DEAD_LETTERS.upper())
    )
    assert dead_letters.max_age_s == DEAD_LETTERS_KEPT_S
    assert LONGEST_RUN_S == MAX_DEADLINE_S >= MAX_APPROVAL_TTL_S
    assert FLOORS["sessions_s"] > max(MAX_DEADLINE_S, MAX_APPROVAL_TTL_S, INBOUND_KEPT_S)
    assert FLOORS["dead_marks_s"] > DEAD_LETTERS_KEPT_S
    assert set(FLOORS) == set(RETENTION_VARIABLES.values())
    default = RecordRetention()
    for name, floor in FLOORS.items():
        assert getattr(default, name) >= floor, name  # every default is safe


def test_an_active_record_outlives_the_latest_deadline_it_holds() -> None:
    record = ActiveRuns(
        runs={"run_a": NOW + timedelta(seconds=120), "run_b": NOW + timedelta(seconds=3600.2)}
    )
    assert active_ttl(record, NOW, 86_400) == 3601 + 86_400
    assert active_ttl(ActiveRuns(), NOW, 60) == 60  # emptied: gone a retention after its last write
    # A record whose entries all passed their deadlines counts nothing: a retention from now.
    assert active_ttl(ActiveRuns(runs={"run_a": NOW - timedelta(days=1)}), NOW, 60) == 60
    assert active_ttl(record, NOW, 0) is None  # 0: kept forever, as 0.2.0 did


def _approval(status: ApprovalStatus, expires_in_s: float) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id="apr_1",
        run_id="run_1",
        tenant="acme",
        guest_id="g",
        session_id="s",
        tool="charge_card",
        args={},
        input_hash="h",
        approver="manager",
        rule="approval_above",
        reason="",
        requested_at=NOW,
        expires_at=NOW + timedelta(seconds=expires_in_s),
        status=status.value,
    )


@pytest.mark.parametrize(
    ("status", "expires_in_s", "ttl"),
    [
        (ApprovalStatus.PENDING, 7 * 86_400, 7 * 86_400 + 600),  # waits for its person, then its retention
        (ApprovalStatus.PENDING, -5, 600),  # past its expiry, not yet moved: a retention from now
        (ApprovalStatus.APPROVED, 7 * 86_400, 600),  # decided: a retention after the decision
        (ApprovalStatus.EXPIRED, -1, 600),
    ],
)
def test_an_approval_is_kept_past_its_expiry_while_pending_and_past_its_decision(
    status: ApprovalStatus, expires_in_s: float, ttl: int
) -> None:
    assert approval_ttl(_approval(status, expires_in_s), NOW, 600) == ttl


def test_zero_keeps_a_record_forever() -> None:
    assert kept_ttl(0) is None and kept_ttl(5) == 5
    assert approval_ttl(_approval(ApprovalStatus.PENDING, 10), NOW, 0) is None


def test_tests_may_shorten_retention_below_the_floors() -> None:
    short = dataclasses.replace(RecordRetention(), sessions_s=2, step_rows_s=1)
    assert (short.sessions_s, short.step_rows_s) == (2, 1)
