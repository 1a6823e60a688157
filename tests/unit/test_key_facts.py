"""The executor's key facts (domain/key_facts.py) and the decisions over them (issue 17): a store that
never saw a key decides from its facts exactly as from its own record, stale writers are refused, the in-flight
window and the attempt count survive a move, and a provider's replay is never "this run made it"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from crashsafe.contracts.keys import business_key, input_hash
from crashsafe.contracts.tool_messages import (
    ActionOutcome,
    ActionRequest,
    Answer,
    Evidence,
    OutcomeStatus,
    first_made_by,
)
from crashsafe.domain.execution import (
    Conflict,
    Replay,
    Resolve,
    classify,
    credited,
    made_by_another,
    receipt_of,
)
from crashsafe.domain.key_facts import (
    KeyFacts,
    as_record,
    attempted,
    facts_decoder,
    facts_encoder,
    first_asked,
    in_flight_left,
    settled,
    shared,
    stale,
    undoes,
    undone,
    undone_record,
)
from crashsafe.domain.partition_ownership import Holding
from crashsafe.domain.registry import ProviderAnswer

AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
HOLD_ARGS = {"hotel_id": "lis-1", "guest_id": "g1", "check_in": "2031-12-01", "check_out": "2031-12-03"}
KEY = business_key("hold", "t1", HOLD_ARGS)
FIRST, LATER = "run_" + "a" * 24, "run_" + "b" * 24


def ask(run_id: str, step_no: int, args: dict[str, str] = HOLD_ARGS) -> ActionRequest:
    return ActionRequest(
        run_id=run_id,
        step_no=step_no,
        tool="create_booking",
        family="booking",
        args=args,
        key=KEY,
        input_hash=input_hash({"tool": "create_booking", "args": args}),
        timeout_s=5.0,
        deadline_at=AT + timedelta(seconds=60),
        requested_at=AT,
    )


def held(run_id: str = FIRST, step_no: int = 2) -> ActionOutcome:
    return ActionOutcome(
        run_id=run_id,
        step_no=step_no,
        tool="create_booking",
        key=KEY,
        status=OutcomeStatus.SUCCEEDED,
        result={"booking_id": "bk_1"},
        provider_ref="bk_1",
        via="call",
        attempts=1,
        evidence=[Evidence(asked="provider.call", key=KEY, answer="ok", at=AT)],
    )


def test_business_keys_and_their_compensations_are_shared_step_keys_are_not() -> None:
    assert shared(KEY) and shared(f"{KEY}:release")
    assert not shared(f"{FIRST}:3") and not shared(f"{FIRST}:3:release")


def test_a_key_paid_by_an_earlier_run_is_replayed_to_a_later_one_naming_the_first_from_its_facts() -> None:
    facts = settled(
        first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "store-a"), held(), Holding(1, 7), "store-a"
    )
    facts = facts_decoder.decode(facts_encoder.encode(facts))  # as the bucket hands them back
    plan = classify(as_record(facts), ask(LATER, 1), deliveries=1, undone=undone_record(facts))
    assert isinstance(plan, Replay)
    assert plan.outcome.run_id == LATER and plan.outcome.via == "replay"
    assert first_made_by(plan.outcome.evidence) == FIRST


def test_a_key_undone_by_its_compensation_is_undone_for_a_later_run_from_its_facts() -> None:
    facts = settled(first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "a"), held(), Holding(1, 7), "a")
    facts = undone(facts, f"{KEY}:release", Holding(1, 8), "a")
    plan = classify(as_record(facts), ask(LATER, 1), deliveries=1, undone=undone_record(facts))
    assert isinstance(plan, Replay) and plan.outcome.error is not None
    assert plan.outcome.error.code == "action_undone"


def test_other_input_under_a_known_key_is_a_conflict_from_its_facts() -> None:
    facts = first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "a")
    other = ask(LATER, 1, {**HOLD_ARGS, "check_out": "2031-12-04"})
    assert isinstance(classify(as_record(facts), other, deliveries=1), Conflict)


def test_an_open_key_is_resolved_with_its_attempts_and_last_call_time_from_its_facts() -> None:
    facts = attempted(first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "a"), 2, 130.0, Holding(1, 7), "a")
    assert classify(as_record(facts), ask(FIRST, 2), deliveries=3) == Resolve(attempts=2, sent_at=130.0)


def test_the_first_settled_receipt_is_kept_and_a_compensation_names_the_key_it_undid() -> None:
    facts = settled(first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "a"), held(), Holding(1, 7), "a")
    later = msgspec.structs.replace(held(LATER, 1), result={"booking_id": "bk_2"})
    assert settled(facts, later, Holding(1, 9), "b").outcome == held()
    release = msgspec.structs.replace(held(), key=f"{KEY}:release", tool="release_booking")
    assert undoes(release) == KEY
    assert undoes(msgspec.structs.replace(release, status=OutcomeStatus.FAILED)) is None
    assert undoes(msgspec.structs.replace(release, key=f"{FIRST}:3:release")) is None


def test_a_writer_with_an_older_lease_token_of_the_same_epoch_is_stale() -> None:
    facts = first_asked(ask(FIRST, 2), 100.0, Holding(1, 9), "b")
    assert (
        stale(facts, Holding(1, 7)) and not stale(facts, Holding(1, 9)) and not stale(facts, Holding(1, 12))
    )
    assert not stale(None, Holding(1, 1)) and stale(facts, Holding(0, 0))  # (0, 0): holds nothing


def test_the_epoch_orders_writers_before_the_token_so_a_recreated_leases_bucket_changes_nothing() -> None:
    """A leases bucket made again numbers its revisions from 1: the old bucket's holder carries the higher token,
    the new one's the higher epoch, and the epoch decides both ways."""
    old = first_asked(ask(FIRST, 2), 100.0, Holding(4, 90_000), "old")
    assert not stale(old, Holding(5, 3))  # the new bucket's holder writes
    new = attempted(old, 2, 130.0, Holding(5, 3), "new")
    assert (new.epoch, new.token) == (5, 3)
    assert stale(
        new, Holding(4, 90_000)
    )  # the old bucket's holder, alive and believing its lease, is refused
    kept = settled(settled(new, held(), Holding(5, 4), "new"), held(), Holding(4, 90_001), "old")
    assert (kept.epoch, kept.token) == (5, 4)  # a settled receipt keeps the highest writer, not the last


def test_facts_written_without_an_epoch_stand_below_every_epoch() -> None:
    """0.2.0 writes no epoch (and drops it when it rewrites facts): such facts may carry a token of a leases
    bucket since made again, so they never refuse a holder that counts epochs."""
    written = msgspec.structs.asdict(first_asked(ask(FIRST, 2), 100.0, Holding(0, 90_000), "old"))
    del written["epoch"]  # as 0.2.0's KeyFacts encodes them
    by_old_release = facts_decoder.decode(facts_encoder.encode(written))
    assert by_old_release.epoch == 0 and by_old_release.token == 90_000
    assert not stale(by_old_release, Holding(1, 3))


def test_the_in_flight_window_counts_from_the_last_call_with_the_hosts_skew() -> None:
    assert in_flight_left(20.0, 100.0, 105.0, 2.0) == 17.0
    assert in_flight_left(20.0, 100.0, 130.0, 2.0) == 0.0
    assert in_flight_left(20.0, None, 105.0, 2.0) == 0.0


def test_an_outcome_for_a_key_another_run_asked_first_is_credited_to_that_run() -> None:
    facts = first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "a")
    found = msgspec.structs.replace(held(LATER, 1), via="provider_lookup")
    published = credited(found, as_record(facts))
    assert first_made_by(published.evidence) == FIRST
    assert (receipt_of(found, as_record(facts)).run_id, receipt_of(found, as_record(facts)).step_no) == (
        FIRST,
        2,
    )
    assert credited(held(), as_record(facts)) == held()  # the first asker's own outcome says nothing more


def test_a_providers_replay_of_our_first_call_with_a_shared_key_is_another_requests_effect() -> None:
    replayed = ProviderAnswer(Answer.OK, {"booking_id": "bk_1"}, replayed=True)
    detail = made_by_another(True, replayed, attempts=1)
    assert detail is not None
    line = Evidence(asked="provider.call", key=KEY, answer="ok", detail=detail, at=AT)
    assert first_made_by([line]) not in (None, LATER)
    assert made_by_another(True, replayed, attempts=2) is None  # maybe our own earlier call
    assert made_by_another(False, replayed, attempts=1) is None  # a step key is only its run's
    assert made_by_another(True, ProviderAnswer(Answer.OK, {}), attempts=1) is None


def test_facts_round_trip_as_json() -> None:
    facts = undone(
        settled(first_asked(ask(FIRST, 2), 100.0, Holding(1, 7), "a"), held(), Holding(1, 7), "a"),
        f"{KEY}:release",
        Holding(1, 8),
        "a",
    )
    assert facts_decoder.decode(facts_encoder.encode(facts)) == facts
    assert isinstance(facts, KeyFacts)
