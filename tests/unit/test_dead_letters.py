"""What replaying a dead letter may send (services/operations/dead_letter_tasks.py `replay_plan`), and the open unknowns
the reconciliation page lists (services/operations/unknowns.py): pure readings of a letter and of journals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.dead_letters import DeadLetter
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.projections import ProjectionTask, task_encoder
from crashsafe.contracts.run_events import ActionCompleted, ActionRequested, RunHandedOff, event_encoder
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    OutcomeStatus,
    RunWake,
    tool_encoder,
)
from crashsafe.services.operations.dead_letter_tasks import (
    PAYLOAD_LIMIT,
    Refusal,
    Replan,
    Republish,
    WakeKeys,
    replay_plan,
    run_of,
)
from crashsafe.services.operations.unknowns import open_unknowns
from tests.support.runs import RUN, T0, booked_run

NS = Namespace("prod")
NOW = datetime(2031, 1, 1, tzinfo=UTC)


def _letter(subject: str, payload: bytes | str) -> DeadLetter:
    text = payload.decode() if isinstance(payload, bytes) else payload
    return DeadLetter(
        service="x", subject=subject, stream_seq=1, deliveries=20, reason="r", code="c", payload=text, at=NOW
    )


def _request() -> ActionRequest:
    return ActionRequest(
        run_id=RUN,
        step_no=2,
        tool="create_booking",
        family="booking",
        args={},
        key="k1",
        input_hash="h",
        timeout_s=5,
        deadline_at=NOW,
        requested_at=NOW,
    )


def test_an_action_or_an_outcome_is_never_sent_again_but_its_run_is_woken_naming_the_key() -> None:
    action = _letter(NS.actions("booking", 3), tool_encoder.encode(_request()))
    assert replay_plan(NS, action, NOW) == WakeKeys(RUN, ["k1"])
    outcome = ActionOutcome(
        run_id=RUN, step_no=2, tool="create_booking", key="k1", status=OutcomeStatus.UNKNOWN
    )
    assert replay_plan(
        NS, _letter(NS.outcomes("booking", RUN), tool_encoder.encode(outcome)), NOW
    ) == WakeKeys(RUN, ["k1"])


def test_an_intent_or_a_receipt_from_the_journal_wakes_its_run_naming_the_key_never_appends_again() -> None:
    """The journal as the bus (issue 33): an executor dead-letters an intent it pulled, the runtime a receipt."""
    run, _ = booked_run()
    intent = next(e for e in run.events if isinstance(e, ActionRequested))
    receipt = next(e for e in run.events if isinstance(e, ActionCompleted))
    for subject, event in (
        (NS.run_intent(intent.run_id, intent.family, 0), intent),
        (NS.run_receipt(receipt.run_id, "booking"), receipt),
    ):
        plan = replay_plan(NS, _letter(subject, event_encoder.encode(event)), NOW)
        assert plan == WakeKeys(event.run_id, [event.key]), plan
    # A payload naming another run than its journal subject: whose it is cannot be told.
    foreign = replay_plan(
        NS, _letter(NS.run_intent("run_other", "booking", 0), event_encoder.encode(intent)), NOW
    )
    assert isinstance(foreign, Refusal)
    started = replay_plan(
        NS, _letter(NS.run_intent(intent.run_id, "booking", 0), event_encoder.encode(run.events[0])), NOW
    )
    assert isinstance(started, Refusal) and "no intent or receipt" in started.why


def test_a_wake_and_a_fired_timer_are_sent_as_a_wake_of_their_run() -> None:
    wake = tool_encoder.encode(RunWake(run_id=RUN, reason="r", at=NOW))
    for subject in (NS.wakes(RUN), NS.timer_fired(RUN)):
        plan = replay_plan(NS, _letter(subject, wake), NOW)
        assert plan == Republish(NS.wakes(RUN), wake, RUN)


def test_a_dead_projection_is_planned_again_from_its_journal_never_sent_as_it_was() -> None:
    task = ProjectionTask(
        tool="send_email",
        key="email:1",
        run_id=RUN,
        tenant="acme",
        agent="booking",
        planned_at=NOW - timedelta(1),
    )
    plan = replay_plan(NS, _letter(NS.projection("send_email", RUN), task_encoder.encode(task)), NOW)
    assert plan == Replan(task)


def test_what_cannot_be_replayed_safely_is_refused_with_what_to_do() -> None:
    inbound = replay_plan(NS, _letter(NS.inbound(RUN), "{}"), NOW)
    assert isinstance(inbound, Refusal) and "reconcile the run" in inbound.why
    truncated = replay_plan(NS, _letter(NS.actions("booking", 0), "x" * PAYLOAD_LIMIT), NOW)
    assert isinstance(truncated, Refusal) and "8192" in truncated.why
    garbage = replay_plan(NS, _letter(NS.actions("booking", 0), "<script>"), NOW)
    assert isinstance(garbage, Refusal) and "discard it" in garbage.why
    other_ns = replay_plan(NS, _letter("other.action.booking.0", tool_encoder.encode(_request())), NOW)
    assert isinstance(other_ns, Refusal)
    assert isinstance(replay_plan(NS, _letter(f"{NS.name}.support.t.{RUN}", "{}"), NOW), Refusal)


def test_the_run_of_a_letter_is_read_from_its_payload() -> None:
    assert run_of(NS, _letter(NS.actions("booking", 0), tool_encoder.encode(_request()))) == RUN
    assert run_of(NS, _letter(NS.inbound(RUN), '{"run_id": "%s"}' % RUN)) == RUN
    assert run_of(NS, _letter(NS.inbound(RUN), "not json")) is None


def test_an_unknown_is_open_until_a_later_receipt_resolves_it_and_only_for_whoever_sees_the_run() -> None:
    run, _ = booked_run()
    events = list(run.events)
    requested, done = run.state.completed[-1]
    unknown = msgspec.structs.replace(
        done, status=OutcomeStatus.UNKNOWN, error=ErrorInfo(code="timeout", message="no answer"), result={}
    )
    at = T0 + timedelta(seconds=1)
    handed = RunHandedOff(run_id=RUN, at=at, reason="outcome_unknown")
    cut = events.index(done)
    journal = [*events[:cut], unknown, handed]
    (open_one,) = open_unknowns({RUN: journal}, lambda tenant: True)
    assert (open_one.request.key, open_one.detail, open_one.run_status) == (
        requested.key,
        "no answer",
        "handed_off",
    )
    assert open_unknowns({RUN: journal}, lambda tenant: False) == []
    late = ActionCompleted(
        run_id=RUN,
        at=at,
        step_no=done.step_no,
        key=done.key,
        status=OutcomeStatus.SUCCEEDED,
        result=done.result,
    )
    assert open_unknowns({RUN: [*journal, late]}, lambda tenant: True) == []


def test_a_letter_whose_payload_names_another_run_than_its_subject_is_no_runs_and_never_replayed() -> None:
    # What the runtime dead-letters as `wrong_subject` (an outcome on another run's subject, a wake posing for
    # another run): whose run it is cannot be told, so no tenant is shown it (an admin's to see) and a replay
    # would act on the run the payload names, not the one it was sent for.
    other = "run_" + "f" * 24
    outcome = ActionOutcome(
        run_id=RUN, step_no=2, tool="create_booking", key="k1", status=OutcomeStatus.UNKNOWN
    )
    wake = tool_encoder.encode(RunWake(run_id=RUN, reason="r", at=NOW))
    for letter in (
        _letter(NS.outcomes("booking", other), tool_encoder.encode(outcome)),
        _letter(NS.wakes(other), wake),
        _letter(NS.timer_fired(other), wake),
    ):
        assert isinstance(replay_plan(NS, letter, NOW), Refusal), letter.subject
        assert run_of(NS, letter) is None, letter.subject
