"""The projector's pure decisions (domain/projection_rules.py): what each delivery attempt's answer leads to under
a retry policy, which run events plan projections, and the audit records a journal gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crashsafe.contracts.errors import ErrorCode
from crashsafe.contracts.projections import RetryPolicy
from crashsafe.contracts.run_events import RunCompleted, event_encoder
from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain.projection_rules import (
    Dead,
    Delivered,
    RetryIn,
    Trigger,
    after_attempt,
    audit_records,
    chunks,
    envelope_of,
    quick_delay_s,
    trigger,
)
from tests.support.runs import RUN, booked_run, started

AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
POLICY = RetryPolicy()  # 5 attempts, back-off 2, 4, 8, 16; then every 300 s until 7200 s


def later(seconds: float) -> datetime:
    return AT + timedelta(seconds=seconds)


@pytest.mark.parametrize("kind", [Answer.OK, Answer.FOUND])
def test_an_answer_that_says_the_receiver_has_it_is_delivered(kind: Answer) -> None:
    assert after_attempt(POLICY, 3, kind, AT, later(10)) == Delivered()


def test_a_typed_refusal_is_dead_at_once_whatever_the_policy_has_left() -> None:
    decision = after_attempt(POLICY, 1, Answer.REJECTED, AT, later(0.1), detail="provider answered 404")
    assert isinstance(decision, Dead)
    assert decision.code == ErrorCode.PROVIDER_REJECTED.value
    assert "404" in decision.reason


def test_quick_attempts_back_off_by_the_policy_then_retry_every_long_interval() -> None:
    delays = [quick_delay_s(POLICY, attempt) for attempt in range(1, 9)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 300.0, 300.0, 300.0, 300.0]


def test_a_back_off_shorter_than_the_quick_attempts_repeats_its_last_value() -> None:
    policy = RetryPolicy(attempts=5, backoff_s=(1.0, 3.0))
    assert [quick_delay_s(policy, a) for a in range(1, 7)] == [1.0, 3.0, 3.0, 3.0, 300.0, 300.0]


@pytest.mark.parametrize("kind", [Answer.UNKNOWN, Answer.ABSENT])
def test_an_answer_we_cannot_trust_is_tried_again_after_the_policy_pause(kind: Answer) -> None:
    assert after_attempt(POLICY, 2, kind, AT, later(3)) == RetryIn(4.0)
    assert after_attempt(POLICY, 5, kind, AT, later(40)) == RetryIn(300.0)


def test_every_policy_duration_is_scaled_by_the_shortened_clock() -> None:
    assert after_attempt(POLICY, 1, Answer.UNKNOWN, AT, later(0), scale=0.01) == RetryIn(pytest.approx(0.02))
    # 7200 s times 0.01: 72 s after planning it gives up, where the real clock would still be trying.
    assert isinstance(after_attempt(POLICY, 9, Answer.UNKNOWN, AT, later(73), scale=0.01), Dead)
    assert isinstance(after_attempt(POLICY, 9, Answer.UNKNOWN, AT, later(73), scale=1.0), RetryIn)


def test_a_retry_after_longer_than_the_pause_wins_and_is_not_scaled() -> None:
    assert after_attempt(POLICY, 1, Answer.UNKNOWN, AT, later(0), retry_after_s=7.0) == RetryIn(7.0)
    assert after_attempt(POLICY, 1, Answer.UNKNOWN, AT, later(0), retry_after_s=1.0, scale=0.01) == RetryIn(
        1.0
    )


def test_a_retry_after_shorter_than_the_pause_does_not_shorten_it() -> None:
    assert after_attempt(POLICY, 3, Answer.UNKNOWN, AT, later(0), retry_after_s=1.0) == RetryIn(8.0)


def test_the_policy_is_spent_give_up_after_since_planning_not_since_the_last_attempt() -> None:
    decision = after_attempt(POLICY, 30, Answer.UNKNOWN, AT, later(7200), detail="provider answered 503")
    assert isinstance(decision, Dead)
    assert decision.code == ErrorCode.PROJECTION_EXHAUSTED.value
    assert "30 attempts" in decision.reason and "503" in decision.reason
    assert isinstance(after_attempt(POLICY, 30, Answer.UNKNOWN, AT, later(7199)), RetryIn)


@given(
    attempt=st.integers(min_value=1, max_value=10_000),
    elapsed=st.floats(min_value=0, max_value=20_000),
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=60)),
    scale=st.floats(min_value=0.001, max_value=10),
)
def test_any_failed_attempt_is_retried_later_or_dead_never_sooner_than_the_receiver_asked(
    attempt: int, elapsed: float, retry_after: float | None, scale: float
) -> None:
    decision = after_attempt(POLICY, attempt, Answer.UNKNOWN, AT, later(elapsed), retry_after, scale)
    if elapsed >= POLICY.give_up_after_s * scale:
        assert isinstance(decision, Dead)
    else:
        assert isinstance(decision, RetryIn)
        assert decision.delay_s > 0
        assert decision.delay_s >= (retry_after or 0.0)
        assert decision.delay_s <= max(POLICY.long_every_s * scale, retry_after or 0.0)


# Which events plan --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["run.completed", "run.handed_off"])
def test_a_terminal_event_plans_every_projection(kind: str) -> None:
    assert trigger(kind, ended=False) is Trigger.ALL


def test_an_approval_request_flushes_only_the_audit_trail() -> None:
    assert trigger("run.approval_requested", ended=False) is Trigger.AUDIT


@pytest.mark.parametrize(
    "kind", ["run.started", "run.action_requested", "run.model_answered", "run.future_kind"]
)
def test_other_events_of_a_running_run_plan_nothing(kind: str) -> None:
    assert trigger(kind, ended=False) is None


def test_an_event_marked_as_appended_after_the_end_plans_everything_on_any_replica() -> None:
    # A late receipt after a hand-off, taken by a replica that did not see the run end (or forgot it on restart):
    # the runtime's `Crashsafe-Run-Ended` header says so, so no journal is read for every outcome of every run.
    assert trigger("run.action_completed", ended=False, after_end=True) is Trigger.ALL
    assert trigger("run.action_completed", ended=False) is None


@pytest.mark.parametrize("kind", ["run.action_completed", "run.nudged", "run.future_kind"])
def test_any_event_of_a_run_known_to_have_ended_plans_again(kind: str) -> None:
    assert trigger(kind, ended=True) is Trigger.ALL


def test_the_envelope_is_read_without_decoding_the_event() -> None:
    raw = event_encoder.encode(RunCompleted(run_id=RUN, at=AT, reply="done"))
    assert envelope_of(raw) == ("run.completed", RUN)
    assert envelope_of(b'{"type": "run.from_the_future", "run_id": "r1", "at": "2026-12-01T09:00:00Z"}') == (
        "run.from_the_future",
        "r1",
    )
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        envelope_of(b'{"hello": "world"}')


# The audit trail's records ------------------------------------------------------------------------------------


def test_audit_records_carry_each_event_as_journaled_with_its_position_as_id() -> None:
    run, _ = booked_run()
    journal = [event_encoder.encode(e) for e in run.events]
    records = audit_records(journal, len(journal), "acme")
    assert [r["event_id"] for r in records] == [f"{RUN}/{n}" for n in range(1, len(journal) + 1)]
    assert {r["tenant"] for r in records} == {"acme"}
    assert [r["type"] for r in records][0] == "run.started"
    assert records[0]["event"] == msgspec.json.decode(journal[0])
    assert all(r["run_id"] == RUN for r in records)


def test_audit_records_stop_at_upto() -> None:
    journal = [event_encoder.encode(started())] * 5
    assert len(audit_records(journal, 3, "t")) == 3


def test_a_field_a_newer_writer_added_stays_in_the_audit_record() -> None:
    # Re-encoding with this version's structs would drop it, and the receiver would see another body for the
    # same event id (409) from a projector of the newer version.
    raw = event_encoder.encode(started())
    newer = raw[:-1] + b',"added_later":{"x":1}}'
    (record,) = audit_records([newer], 1, "t")
    assert record["event"]["added_later"] == {"x": 1}


def test_bytes_that_are_not_an_event_do_not_make_an_audit_record() -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        audit_records([b"not json"], 1, "t")


def test_records_go_in_fixed_position_ranges() -> None:
    records = [{"event_id": f"r/{n}"} for n in range(1, 6)]
    assert [(first, last, len(part)) for first, last, part in chunks(records, 2)] == [
        (1, 2, 2),
        (3, 4, 2),
        (5, 5, 1),
    ]
    assert chunks([], 2) == []


def test_an_event_naming_another_run_is_recorded_under_the_journal_it_is_in() -> None:
    # A hostile event on run R's subject claiming run V: recorded as V's event n it would take V's event id
    # (the receiver would then refuse V's own event n as a conflict, and V's audit trail would be dead).
    run, _ = booked_run()
    events = list(run.events)
    events[1] = msgspec.structs.replace(events[1], run_id="run_victim")
    journal = [event_encoder.encode(e) for e in events]
    records = audit_records(journal, len(journal), "acme", RUN)
    assert [r["event_id"] for r in records] == [f"{RUN}/{n}" for n in range(1, len(journal) + 1)]
    assert all(r["run_id"] == RUN for r in records)


def test_the_runtime_marks_an_event_appended_after_its_run_ended() -> None:
    from opentelemetry.context import Context

    from crashsafe.contracts.headers import Header
    from crashsafe.contracts.run_events import RunCompleted
    from crashsafe.domain.fold import replay
    from crashsafe.services.runtime.append_path import journal_headers as _journal_headers
    from tests.support.runs import Run, started

    run = Run(started())
    going = replay(run.events)
    assert going is not None and Header.RUN_ENDED not in _journal_headers(going, Context())
    run.add(RunCompleted(run_id=going.run_id, at=run.tick(), reply="done"))
    ended = replay(run.events)
    assert ended is not None and _journal_headers(ended, Context())[Header.RUN_ENDED] == "1"
