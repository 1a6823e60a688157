"""The journals' archive, pure (issue 31, months of runs): a run's journal leaves the stream only when no message can
still come for it, and no journal leaves while a release that reads no archive may be running; the directory
archive writes whole objects or none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from crashsafe.contracts.archive import ArchivedEvent, ArchivedJournal, archive_decoder, archive_encoder
from crashsafe.contracts.errors import ArchiveUnavailable
from crashsafe.contracts.heartbeats import VersionBeat
from crashsafe.contracts.projections import ProjectionRecord, ProjectionStatus, ProjectionTask
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    RunCompleted,
    RunEvent,
    RunHandedOff,
)
from crashsafe.domain.fold import replay
from crashsafe.domain.journal_archive import Due, Keep, Kept, archive_verdict, archiving_blocked, unsettled
from crashsafe.services.platform.run_archive import FileArchive
from tests.support.runs import RUN, T0, call, receipt, started

DAY = 86_400.0
END = T0 + timedelta(minutes=5)


def _request(step: int = 1) -> ActionRequested:
    return ActionRequested(
        run_id=RUN,
        at=T0,
        step_no=step,
        call_id=f"c{step}",
        tool="search_hotels",
        family="booking",
        args={"city": "Lisbon"},
        key=f"{RUN}:{step}",
        input_hash="0" * 64,
        timeout_s=10.0,
        deadline_at=T0 + timedelta(seconds=10),
    )


def _approval(approval_id: str = "apr_1", expires_in: timedelta = timedelta(days=2)) -> ApprovalRequested:
    return ApprovalRequested(
        run_id=RUN,
        at=T0,
        step_no=2,
        approval_id=approval_id,
        call=call("create_payment", {"amount_cents": 100}),
        tool="create_payment",
        args={"amount_cents": 100},
        input_hash="1" * 64,
        approver="manager",
        rule="approval_above",
        reason="large",
        expires_at=T0 + expires_in,
    )


def _verdict(events: list[RunEvent], now: datetime, window_s: float = 3 * DAY) -> Keep | Due:
    return archive_verdict(replay([started(), *events]), events[-1].at if events else T0, now, window_s)


def test_an_ended_settled_run_is_due_a_hot_window_after_its_journal_last_moved() -> None:
    done = [RunCompleted(run_id=RUN, at=END, reply="booked")]
    assert _verdict(done, END + timedelta(days=3) - timedelta(seconds=1)) == Keep(
        Kept.HOT, END + timedelta(days=3)
    )
    assert _verdict(done, END + timedelta(days=3)) == Due()


def test_a_run_is_kept_while_a_message_can_still_come_for_it() -> None:
    later = END + timedelta(days=365)
    request = _request()
    assert _verdict([request], later) == Keep(Kept.RUNNING)
    # Handed off with an action in flight (a deadline): its receipt may still land.
    handed_off = RunHandedOff(run_id=RUN, at=END, reason="deadline")
    assert _verdict([request, handed_off], later) == Keep(Kept.ACTION_PENDING)
    # An unknown outcome: the reconciler asks by key until it settles; settled, the run may go.
    unknown = receipt(request, T0, status="unknown")
    assert _verdict([request, unknown, handed_off], later) == Keep(Kept.OUTCOME_UNKNOWN)
    settled = receipt(request, END + timedelta(hours=1))
    assert _verdict([request, unknown, handed_off, settled], later) == Due()
    assert archive_verdict(None, T0, later, 3 * DAY) == Keep(Kept.UNREADABLE)


def test_an_undecided_approval_keeps_its_run_a_hot_window_past_its_expiry() -> None:
    asked = _approval(expires_in=timedelta(days=7))
    handed_off = RunHandedOff(run_id=RUN, at=END, reason="deadline")
    expiry = asked.expires_at + timedelta(days=3)
    assert _verdict([asked, handed_off], END + timedelta(days=9)) == Keep(Kept.APPROVAL_OPEN, expiry)
    assert _verdict([asked, handed_off], expiry) == Due()
    decided = ApprovalDecided(
        run_id=RUN, at=END, approval_id="apr_1", decision="rejected", decided_by="m", input_hash="1" * 64
    )
    assert _verdict([asked, decided, handed_off], END + timedelta(days=3)) == Due()


def test_a_run_with_a_projection_not_settled_is_kept() -> None:
    now = END + timedelta(days=3)
    tasks = [
        ProjectionTask(tool=t, key=f"{t}:k", run_id=RUN, tenant="", agent="booking", planned_at=END)
        for t in ("send_email", "update_crm", "audit_trail", "other")
    ]

    def record(task: ProjectionTask, status: ProjectionStatus) -> ProjectionRecord:
        return ProjectionRecord(
            tool=task.tool, key=task.key, run_id=RUN, status=status, planned_at=END, updated_at=now
        )

    records = {
        ("send_email", "send_email:k"): record(tasks[0], ProjectionStatus.DELIVERED),
        ("update_crm", "update_crm:k"): record(tasks[1], ProjectionStatus.DEAD),
        ("audit_trail", "audit_trail:k"): record(tasks[2], ProjectionStatus.PENDING),
    }
    assert unsettled(tasks, records, now, 600.0) == ["audit_trail:k", "other:k"]
    assert unsettled(tasks[:2], records, now, 600.0) == []


def _beat(version: str) -> VersionBeat:
    return VersionBeat(
        version=version,
        runs_beside_since="0.2.0",
        service="gateway",
        worker="w1",
        pid=1,
        started_at=T0,
        beat_at=T0,
    )


def test_nothing_is_purged_before_the_contract_or_beside_a_release_that_reads_no_archive() -> None:
    assert archiving_blocked("0.3.0", [_beat("0.3.0"), _beat("0.4.0")]) is None
    assert "infra contract" in (archiving_blocked(None, []) or "")
    assert "infra contract" in (archiving_blocked("0.2.0", []) or "")
    assert "gateway w1 0.2.0" in (archiving_blocked("0.3.0", [_beat("0.3.0"), _beat("0.2.0")]) or "")
    assert archiving_blocked("0.3.0", [_beat("not-a-release")]) is not None


def _journal(run_id: str) -> bytes:
    event = ArchivedEvent(seq=7, subject=f"ns.run.{run_id}.milestone", event=msgspec.Raw(b'{"type":"x"}'))
    return archive_encoder.encode(
        ArchivedJournal(
            run_id=run_id, namespace="ns", archived_at=datetime.now(UTC), archived_by="t", events=[event]
        )
    )


async def test_the_directory_archive_writes_whole_objects_under_the_run_ids_name(tmp_path: Path) -> None:
    archive = FileArchive(tmp_path, "ns")
    assert await archive.get(RUN) is None and not await archive.exists(RUN)
    # A put that died before its rename left a temporary file: swept by the next put, never read as the object.
    (tmp_path / "ns" / "runs").mkdir(parents=True)
    (tmp_path / "ns" / "runs" / f".{RUN}.json.dead.tmp").write_bytes(b"half")
    data = _journal(RUN)
    await archive.put(RUN, data)
    assert await archive.exists(RUN) and await archive.get(RUN) == data
    assert sorted(p.name for p in (tmp_path / "ns" / "runs").iterdir()) == [f"{RUN}.json"]
    assert archive.name(RUN) == f"ns/runs/{RUN}.json" and await archive.runs() == [RUN]
    assert bytes(archive_decoder.decode(await archive.get(RUN) or b"").events[0].event) == b'{"type":"x"}'
    await archive.put(RUN, data + b" ")  # written again (a crash before the purge): replaced whole
    assert await archive.get(RUN) == data + b" "
    # Never a path out of the namespace's folder.
    assert await archive.get("../../etc/passwd") is None and not await archive.exists("a/b")
    with pytest.raises(ArchiveUnavailable):
        await archive.put("../x", data)
