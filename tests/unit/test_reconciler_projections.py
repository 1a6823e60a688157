"""The reconciler's projection decisions (domain/missing_projections.py): which ended runs are due, which
planned tasks are lost (no receipt, or a pending receipt nobody is trying), how a run is checked again, and what
an operator's retry plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crashsafe.contracts.audit import FindingKind, ProviderEffect
from crashsafe.contracts.keys import action_key, input_hash
from crashsafe.contracts.projections import (
    PlannedProjection,
    ProjectionPlan,
    ProjectionRecord,
    ProjectionStatus,
    ProjectionTask,
)
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    Budget,
    RunCompleted,
    RunEvent,
    RunStarted,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.domain.effect_audit import audit
from crashsafe.domain.missing_projections import (
    EndedRuns,
    Verdict,
    audit_upto,
    checked,
    due_runs,
    ended,
    judged_plan,
    moved,
    plan_current,
    projected_keys,
    replanned,
    republish_id,
    retried_record,
    to_republish,
    verdict,
)
from crashsafe.domain.registry import load

pytestmark = pytest.mark.unit
STAYHUB = load("crashsafe.services.agents:stayhub")

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
GRACE, STALE, RECHECK, MAX_GAP = 60.0, 600.0, 60.0, 1800.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def task(key: str, tool: str = "send_confirmation_email", upto: int = 0) -> ProjectionTask:
    return ProjectionTask(
        tool=tool, key=key, run_id="run_1", tenant="t", agent="booking", planned_at=at(100), upto=upto
    )


def record(
    key: str,
    status: ProjectionStatus,
    *,
    next_attempt: float | None = None,
    updated: float = 0.0,
    planned: float = 0.0,
) -> ProjectionRecord:
    return ProjectionRecord(
        tool="send_confirmation_email",
        key=key,
        run_id="run_1",
        status=status,
        attempts=3,
        planned_at=at(planned),
        updated_at=at(updated),
        next_attempt_at=at(next_attempt) if next_attempt is not None else None,
        detail="503 from the receiver",
    )


def test_an_ended_run_is_due_after_the_grace_since_its_last_event() -> None:
    work = EndedRuns()
    ended(work, "run_1", at(0), GRACE)
    assert due_runs(work, at(59), 10) == []
    # The journal moved after the end (a late outcome): the projector plans again, so the grace restarts.
    moved(work, "run_1", at(30), GRACE)
    assert due_runs(work, at(61), 10) == []
    assert due_runs(work, at(90), 10) == ["run_1"]


def test_tracking_is_bounded_and_lets_the_longest_tracked_go() -> None:
    work = EndedRuns()
    for i in range(5):
        ended(work, f"run_{i}", at(i), GRACE, max_tracked=3)
    assert list(work.runs) == ["run_2", "run_3", "run_4"] and work.let_go == 2


def test_events_of_runs_that_did_not_end_are_not_tracked() -> None:
    work = EndedRuns()
    moved(work, "run_open", at(0), GRACE)
    assert work.runs == {}


def test_due_runs_are_bounded_and_the_longest_waiting_come_first() -> None:
    work = EndedRuns()
    for i in range(30):
        ended(work, f"run_{i:02}", at(30 - i), GRACE)
    due = due_runs(work, at(1000), 5)
    assert due == ["run_29", "run_28", "run_27", "run_26", "run_25"]


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (None, Verdict.MISSING),
        (record("k", ProjectionStatus.DELIVERED), Verdict.SETTLED),
        (record("k", ProjectionStatus.DEAD), Verdict.SETTLED),
        (record("k", ProjectionStatus.PENDING, next_attempt=500), Verdict.PENDING),
        (record("k", ProjectionStatus.PENDING, next_attempt=500 - STALE - 1), Verdict.STALE),
        # No next attempt named: the worker's last write is its last sign of life.
        (record("k", ProjectionStatus.PENDING, updated=0), Verdict.STALE),
        (record("k", ProjectionStatus.PENDING, updated=400), Verdict.PENDING),
    ],
)
def test_verdict_of_a_receipt(stored: ProjectionRecord | None, expected: Verdict) -> None:
    assert verdict(stored, at(700), STALE) is expected


def test_only_lost_tasks_are_published_again() -> None:
    tasks = [task("missing"), task("delivered"), task("dead"), task("trying"), task("stale")]
    email = "send_confirmation_email"
    records = {
        (email, "delivered"): record("delivered", ProjectionStatus.DELIVERED),
        (email, "dead"): record("dead", ProjectionStatus.DEAD),
        (email, "trying"): record("trying", ProjectionStatus.PENDING, next_attempt=690),
        (email, "stale"): record("stale", ProjectionStatus.PENDING, next_attempt=10, planned=5),
        # Another tool's receipt under a key of this plan's is not its receipt.
        ("update_crm", "missing"): record("missing", ProjectionStatus.DELIVERED),
    }
    again, counts = to_republish(tasks, records, at(700), STALE)
    assert [t.key for t in again] == ["missing", "stale"]
    assert counts == {Verdict.MISSING: 1, Verdict.STALE: 1, Verdict.PENDING: 1, Verdict.SETTLED: 2}
    # A stale task keeps its first planning time: its give-up clock is never reset by the reconciler.
    assert again[1].planned_at == at(5)
    assert again[0].planned_at == at(100)


def test_a_task_put_back_is_waited_for_before_it_is_put_back_again() -> None:
    tasks = [task("sent_recently"), task("sent_long_ago"), task("never_sent")]
    sent = {"sent_recently": at(700 - STALE + 1), "sent_long_ago": at(700 - STALE - 1)}
    again, counts = to_republish(tasks, {}, at(700), STALE, sent)
    assert [t.key for t in again] == ["sent_long_ago", "never_sent"]
    assert counts[Verdict.PENDING] == 1 and counts[Verdict.MISSING] == 2


def plan_of(*keys: str, last_seq: int = 40, run_id: str = "run_1") -> ProjectionPlan:
    return ProjectionPlan(
        run_id=run_id,
        events=4,
        last_seq=last_seq,
        planned_at=at(1),
        tasks=tuple(PlannedProjection(tool="send_confirmation_email", key=k) for k in keys),
    )


def test_a_plan_stands_for_the_run_only_if_no_older_than_any_milestone_seen() -> None:
    work = EndedRuns()
    ended(work, "run_1", at(0), GRACE, seq=40)
    run = work.runs["run_1"]
    assert plan_current(plan_of(last_seq=40), "run_1", run)
    assert plan_current(plan_of(last_seq=41), "run_1", run)  # planned after a later event not seen here yet
    assert not plan_current(plan_of(last_seq=40, run_id="run_2"), "run_1", run)  # not this run's
    assert not plan_current(plan_of(last_seq=39), "run_1", run)  # planned before the end seen here
    # A late event after the end: a plan from before it is not the run's plan any more, whatever the times say.
    moved(work, "run_1", at(-30), GRACE, 57)
    assert not plan_current(plan_of(last_seq=40), "run_1", run)
    assert plan_current(plan_of(last_seq=57), "run_1", run)
    ended(work, "run_2", at(0), GRACE)  # no sequence known (a caller that had none): never trusted
    assert not plan_current(plan_of(last_seq=40, run_id="run_2"), "run_2", work.runs["run_2"])


def test_a_run_whose_plan_did_not_settle_it_has_its_plan_read_again_once_its_journal_moves() -> None:
    work = EndedRuns()
    ended(work, "run_1", at(0), GRACE, seq=38)
    run = work.runs["run_1"]
    run.needs_read = True  # (the shell's mark: its next check reads the journal, not the plan)
    moved(work, "run_1", at(30), GRACE, 45)  # the projector plans it again: that plan may settle it
    assert not run.needs_read


def test_a_plan_settles_a_run_from_receipts_alone_unless_a_task_must_be_put_back() -> None:
    email = "send_confirmation_email"
    settled = {
        (email, "a"): record("a", ProjectionStatus.DELIVERED),
        (email, "b"): record("b", ProjectionStatus.DEAD),
    }
    assert judged_plan(plan_of("a", "b"), settled, at(700), STALE) == {
        Verdict.MISSING: 0,
        Verdict.STALE: 0,
        Verdict.PENDING: 0,
        Verdict.SETTLED: 2,
    }
    trying = {**settled, (email, "c"): record("c", ProjectionStatus.PENDING, next_attempt=690)}
    assert judged_plan(plan_of("a", "b", "c"), trying, at(700), STALE) == {
        Verdict.MISSING: 0,
        Verdict.STALE: 0,
        Verdict.PENDING: 1,
        Verdict.SETTLED: 2,
    }
    # Missing or stale: only the journal holds the task to publish again.
    assert judged_plan(plan_of("a", "d"), settled, at(700), STALE) is None
    stale = {**settled, (email, "c"): record("c", ProjectionStatus.PENDING, next_attempt=10)}
    # A receipt of another tool under the same key is not this task's.
    assert (
        judged_plan(
            plan_of("e"), {("update_crm", "e"): record("e", ProjectionStatus.DELIVERED)}, at(700), STALE
        )
        is None
    )
    assert judged_plan(plan_of("a", "c"), stale, at(700), STALE) is None
    # One this reconciler put back a moment ago, with no receipt yet, is waited for.
    counts = judged_plan(plan_of("a", "d"), settled, at(700), STALE, {"d": at(650)})
    assert counts is not None and counts[Verdict.PENDING] == 1
    assert judged_plan(plan_of(), {}, at(700), STALE) == dict.fromkeys(Verdict, 0)


def test_a_settled_run_is_forgotten_and_an_open_one_checked_again_later_and_later() -> None:
    work = EndedRuns()
    ended(work, "run_1", at(0), GRACE)
    ended(work, "run_2", at(0), GRACE)
    checked(work, "run_1", {Verdict.SETTLED: 3}, 0, at(60), RECHECK, MAX_GAP)
    assert "run_1" not in work.runs
    gaps = []
    now = at(60)
    for _ in range(8):
        checked(work, "run_2", {Verdict.PENDING: 1, Verdict.SETTLED: 2}, 1, now, RECHECK, MAX_GAP)
        gaps.append((work.runs["run_2"].due_at - now).total_seconds())
        now = work.runs["run_2"].due_at
    assert gaps == [60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert work.runs["run_2"].republished == 8


def test_republish_ids_are_fresh_and_never_the_planners_own() -> None:
    first = republish_id("email:abc", 1, at(0))
    again = republish_id("email:abc", 1, at(1))
    assert first != "email:abc" and first.startswith("email:abc:r1:")
    assert first != again  # a restarted reconciler (counting from 1 again) still publishes a fresh id


def test_an_operator_retry_plans_the_same_task_now() -> None:
    tasks = [task("email:abc"), task("audit:run_1:12", tool="record_audit", upto=12)]
    retried = replanned(tasks, "email:abc", "run_1", at(5000))
    assert retried is not None and retried.key == "email:abc" and retried.planned_at == at(5000)
    # An audit flush planned at an earlier length of the journal (an approval's wait) is that flush again.
    flush = replanned(tasks, "audit:run_1:7", "run_1", at(5000))
    assert flush is not None and (flush.key, flush.upto, flush.tool) == ("audit:run_1:7", 7, "record_audit")
    assert replanned(tasks, "audit:run_1:13", "run_1", at(5000)) is None  # past the journal's end
    assert replanned(tasks, "crm:nothing", "run_1", at(5000)) is None


def test_audit_keys_are_parsed_strictly() -> None:
    assert audit_upto("audit:run_1:12", "run_1") == 12
    assert audit_upto("audit:run_1:0", "run_1") is None
    assert audit_upto("audit:run_1:x", "run_1") is None
    assert audit_upto("audit:run_2:12", "run_1") is None


def test_a_retried_record_is_pending_now_and_keeps_its_attempts() -> None:
    dead = record("email:abc", ProjectionStatus.DEAD, updated=100)
    again = retried_record(dead, at(9000))
    assert again.status is ProjectionStatus.PENDING
    assert (again.planned_at, again.next_attempt_at, again.attempts) == (at(9000), at(9000), 3)
    assert "503 from the receiver" in again.detail


def _paid_booking(run_id: str, *, ended: bool = True, booking: str = "bk_1") -> list[RunEvent]:
    started = RunStarted(
        run_id=run_id,
        at=T0,
        agent="booking",
        session_id="s",
        guest_id="g1",
        event_id=run_id,
        idempotency_key=run_id,
        input_hash="0" * 64,
        text="Book Lisbon",
        budget=Budget(),
        deadline_at=at(600),
    )
    args = {"booking_id": booking, "guest_id": "g1", "amount_cents": 100, "currency": "EUR"}
    intent = ActionRequested(
        run_id=run_id,
        at=T0,
        step_no=1,
        call_id="c1",
        tool="create_payment",
        family="payment",
        args=args,
        key=action_key(run_id, 1),
        input_hash=input_hash({"tool": "create_payment", "args": args}),
        timeout_s=10.0,
        deadline_at=at(10),
    )
    paid = ActionCompleted(
        run_id=run_id, at=T0, step_no=1, key=intent.key, status=OutcomeStatus.SUCCEEDED, provider_ref="pay_1"
    )
    events: list[RunEvent] = [started, intent, paid]
    return events + [RunCompleted(run_id=run_id, at=T0, reply="Booked.")] if ended else events


def test_the_audit_finds_a_projections_intent_in_the_ended_runs_journal() -> None:
    """An email or CRM record under a key an ended run's journal plans is no `effect_without_intent`; one under
    any other key, or a run still going, is."""
    journals = {"run_1": _paid_booking("run_1"), "run_2": _paid_booking("run_2", ended=False, booking="bk_2")}
    projected = projected_keys(journals, STAYHUB.agents, STAYHUB.tools, at(700))
    assert set(projected.values()) == {"run_1"}
    email = next(k for k in projected if k.startswith("email:"))
    crm = next(k for k in projected if k.startswith("crm:"))
    effects = [
        ProviderEffect(kind="email", key=email, ref="em_1"),
        ProviderEffect(kind="crm_update", key=crm, ref="crm_1"),
        ProviderEffect(kind="email", key="email:nobody-asked", ref="em_2"),
    ]
    findings = audit(journals, effects, {}, STAYHUB.tools, STAYHUB.audit_rules, projected)
    assert [(f.kind, f.key) for f in findings] == [(FindingKind.EFFECT_WITHOUT_INTENT, "email:nobody-asked")]
    # Two effects under one projection key are still a duplicate, named with the run that planned it.
    doubled = audit(journals, effects + effects[:1], {}, STAYHUB.tools, STAYHUB.audit_rules, projected)
    assert [(f.kind, f.run_id) for f in doubled if f.kind is FindingKind.DUPLICATE_EFFECT] == [
        (FindingKind.DUPLICATE_EFFECT, "run_1")
    ]


def test_a_run_that_ended_before_the_projection_history_is_not_tracked() -> None:
    # A reconciler (re)started on a deployment follows a day of journals; a run that ended hours ago, its email
    # sent as a step before the projector existed, republished now could reach the receiver after it forgot the
    # key (a day): a second email. Only runs that ended within the history are checked.
    work = EndedRuns()
    ended(work, "run_old", at(0), GRACE, oldest=at(1))
    ended(work, "run_new", at(2), GRACE, oldest=at(1))
    assert list(work.runs) == ["run_new"]
