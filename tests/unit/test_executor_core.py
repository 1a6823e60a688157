"""The executor's pure decisions (domain/execution.py): what to do with a request given what the store
holds for its key, and what each provider answer means for a keyed write and for a read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.keys import input_hash
from crashsafe.contracts.tool_messages import ActionOutcome, ActionRequest, OutcomeStatus, RecordStatus
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.execution import (
    CallAgain,
    Conflict,
    Done,
    Execute,
    LookUp,
    ProviderAnswer,
    Record,
    Replay,
    Resolve,
    after_call,
    after_lookup,
    classify,
    refused,
)
from crashsafe.domain.unknown_finality import StillUnknown, unknown_outcome
from crashsafe.services.agents import stayhub

AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUN = "run_0123456789abcdef01234567"
TOOL_CONTRACTS = stayhub().contracts
PAYMENT = TOOL_CONTRACTS["create_payment"]  # money, keyed, 2 attempts
SEARCH = TOOL_CONTRACTS["search_hotels"]  # a read, not keyed, 3 attempts
PAY_ARGS = {"booking_id": "bk_1", "guest_id": "g1", "amount_cents": 24000, "currency": "EUR"}
SEARCH_ARGS = {"city": "Lisbon", "check_in": "2031-12-01", "check_out": "2031-12-03"}


def request_of(tool: str, args: dict[str, Any], step_no: int = 6) -> ActionRequest:
    return ActionRequest(
        run_id=RUN,
        step_no=step_no,
        tool=tool,
        family=TOOL_CONTRACTS[tool].family,
        args=args,
        key=f"{RUN}:{step_no}",
        input_hash=input_hash({"tool": tool, "args": args}),
        timeout_s=TOOL_CONTRACTS[tool].timeout_s,
        deadline_at=AT + timedelta(seconds=10),
        requested_at=AT,
    )


PAY = request_of("create_payment", PAY_ARGS)
FIND = request_of("search_hotels", SEARCH_ARGS, step_no=2)


def receipt(
    status: OutcomeStatus = OutcomeStatus.SUCCEEDED, via: str = "call", **fields: Any
) -> ActionOutcome:
    return ActionOutcome(
        run_id=RUN,
        step_no=PAY.step_no,
        tool=PAY.tool,
        key=PAY.key,
        status=status,
        result=fields.pop("result", {"payment_id": "pay_1", "amount_cents": 24000}),
        provider_ref=fields.pop("provider_ref", "pay_1"),
        via=via,
        attempts=fields.pop("attempts", 2),
        deliveries=fields.pop("deliveries", 1),
        **fields,
    )


def record(
    status: str, outcome: ActionOutcome | None = None, attempts: int = 1, hash_: str | None = None
) -> Record:
    return Record(
        key=PAY.key,
        input_hash=hash_ or PAY.input_hash,
        status=RecordStatus(status),
        attempts=attempts,
        outcome=outcome,
    )


# classify: Execute, Replay, Conflict, Resolve -----------------------------------------------------------------


def test_a_key_never_seen_is_executed() -> None:
    assert classify(None, PAY, deliveries=1) == Execute()


@pytest.mark.parametrize("stored", ["started", "unknown", "succeeded"])
def test_a_key_used_with_other_input_is_a_conflict_whatever_the_store_holds(stored: str) -> None:
    plan = classify(
        record(stored, receipt() if stored == "succeeded" else None, hash_="f" * 64), PAY, deliveries=3
    )

    assert isinstance(plan, Conflict)
    outcome = plan.outcome
    assert (outcome.run_id, outcome.step_no, outcome.tool, outcome.key) == (RUN, 6, "create_payment", PAY.key)
    assert (outcome.status, outcome.via, outcome.attempts, outcome.deliveries) == (
        OutcomeStatus.CONFLICT,
        "conflict",
        0,
        3,
    )
    assert (outcome.result, outcome.provider_ref) == ({}, None)
    assert outcome.error is not None and outcome.error.code == "idempotency_conflict"
    assert outcome.error.details == {
        "key": PAY.key,
        "stored_input_hash": "f" * 64,
        "input_hash": PAY.input_hash,
    }
    assert PAY.key in outcome.error.message and "nothing was sent" in outcome.error.message


@pytest.mark.parametrize(
    ("status", "via", "replayed_via"),
    [
        (OutcomeStatus.SUCCEEDED, "call", "replay"),
        (OutcomeStatus.SUCCEEDED, "provider_lookup", "provider_lookup"),
        (OutcomeStatus.FAILED, "call", "replay"),
    ],
)
def test_a_stored_receipt_is_replayed_as_it_was(status: OutcomeStatus, via: str, replayed_via: str) -> None:
    error = None if status == OutcomeStatus.SUCCEEDED else ErrorInfo(code="amount_mismatch", message="no")
    stored = receipt(status, via, error=error, attempts=2, deliveries=1)

    plan = classify(record(str(status), stored, attempts=2), PAY, deliveries=4)

    assert isinstance(plan, Replay)
    replayed = plan.outcome
    assert (replayed.run_id, replayed.step_no, replayed.tool, replayed.key) == (
        RUN,
        6,
        "create_payment",
        PAY.key,
    )
    assert (replayed.status, replayed.result, replayed.error, replayed.provider_ref) == (
        stored.status,
        stored.result,
        stored.error,
        stored.provider_ref,
    )
    assert (replayed.via, replayed.attempts, replayed.deliveries) == (replayed_via, 2, 4)


@pytest.mark.parametrize(("stored", "attempts"), [("started", 1), ("unknown", 2), ("succeeded", 3)])
def test_an_intent_without_a_receipt_is_resolved_by_key_first(stored: str, attempts: int) -> None:
    """`started` (a previous life died) and `unknown` (no answer) hold no receipt; nor does a row whose receipt
    was never written. The attempts already spent carry over."""
    assert classify(record(stored, None, attempts=attempts), PAY, deliveries=2) == Resolve(attempts=attempts)


# after_call: what a call's answer means -----------------------------------------------------------------------


def test_an_ok_answer_is_a_success_with_the_providers_body_and_reference() -> None:
    answer = ProviderAnswer("ok", {"payment_id": "pay_9", "amount_cents": 24000}, ref="pay_9")

    step = after_call(PAY, PAYMENT, answer, attempts=2, deliveries=3)

    assert isinstance(step, Done)
    outcome = step.outcome
    assert (outcome.status, outcome.result, outcome.provider_ref, outcome.error) == (
        OutcomeStatus.SUCCEEDED,
        {"payment_id": "pay_9", "amount_cents": 24000},
        "pay_9",
        None,
    )
    assert (outcome.via, outcome.attempts, outcome.deliveries, outcome.key) == ("call", 2, 3, PAY.key)
    relabelled = after_call(PAY, PAYMENT, answer, attempts=1, deliveries=1, via="provider_lookup")
    assert isinstance(relabelled, Done) and relabelled.outcome.via == "provider_lookup"


def test_a_rejection_is_a_definitive_failure_carrying_the_providers_error() -> None:
    body = {"code": "amount_mismatch", "message": "charge exactly 24000"}

    step = after_call(
        PAY, PAYMENT, ProviderAnswer("rejected", body, detail="HTTP 422"), attempts=1, deliveries=1
    )

    assert isinstance(step, Done)
    outcome = step.outcome
    assert (outcome.status, outcome.via, outcome.attempts, outcome.result, outcome.provider_ref) == (
        OutcomeStatus.FAILED,
        "call",
        1,
        {},
        None,
    )
    assert outcome.error == ErrorInfo(
        code="amount_mismatch", message="charge exactly 24000", details={"provider": body}
    )


def test_a_rejection_without_a_typed_body_is_provider_rejected_with_the_detail() -> None:
    step = after_call(
        FIND, SEARCH, ProviderAnswer("rejected", {}, detail="HTTP 400"), attempts=1, deliveries=1
    )

    assert isinstance(step, Done) and step.outcome.status == OutcomeStatus.FAILED
    assert step.outcome.error == ErrorInfo(
        code="provider_rejected", message="HTTP 400", details={"provider": {}}
    )


@pytest.mark.parametrize("attempts", [1, 2, 5])
def test_an_unknown_answer_to_a_keyed_write_is_looked_up_by_key_never_called_again(attempts: int) -> None:
    """Whatever the attempts, a timed-out or garbled write may have taken effect: ask before anything else."""
    for contract in (PAYMENT, TOOL_CONTRACTS["create_booking"], TOOL_CONTRACTS["send_confirmation_email"]):
        assert contract.keyed
        step = after_call(PAY, contract, ProviderAnswer("unknown", {}, detail="ReadTimeout"), attempts, 1)
        assert step == LookUp()


def test_an_unknown_answer_to_a_read_is_retried_with_a_growing_pause_then_fails() -> None:
    """A read has no effect to look up: it is simply called again while the contract allows (3 for a search)."""
    unknown = ProviderAnswer("unknown", {}, detail="ReadTimeout")
    assert not SEARCH.keyed and SEARCH.max_attempts == 3

    assert after_call(FIND, SEARCH, unknown, attempts=1, deliveries=1) == CallAgain(delay_s=0.05)
    assert after_call(FIND, SEARCH, unknown, attempts=2, deliveries=1) == CallAgain(delay_s=0.1)
    spent = after_call(FIND, SEARCH, unknown, attempts=3, deliveries=2)

    assert isinstance(spent, Done)
    outcome = spent.outcome
    assert (outcome.status, outcome.via, outcome.attempts, outcome.deliveries) == (
        OutcomeStatus.FAILED,
        "call",
        3,
        2,
    )
    assert outcome.error is not None and outcome.error.code == "provider_unavailable"
    assert outcome.error.details == {"key": FIND.key}
    assert "after 3 attempt(s)" in outcome.error.message and "ReadTimeout" in outcome.error.message
    assert "a read leaves no effect" in outcome.error.message


def test_the_pause_between_attempts_doubles_up_to_one_second() -> None:
    patient = ToolContract(
        name="search_hotels",
        family="booking",
        effect=Effect.READ,
        timeout_s=2.0,
        retry=RetryRule.RETRY,
        max_attempts=20,
        key_rule=KeyRule.NONE,
    )
    unknown = ProviderAnswer("unknown", {})
    pauses = [after_call(FIND, patient, unknown, attempts=n, deliveries=1) for n in range(1, 9)]
    assert pauses == [CallAgain(delay_s=d) for d in (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0)]


# after_lookup: what the answer to "did you see this key?" means -----------------------------------------------


def test_a_key_found_by_lookup_is_a_success_via_the_lookup() -> None:
    found = ProviderAnswer("found", {"payment_id": "pay_1", "status": "captured"}, ref="pay_1")

    step = after_lookup(PAY, PAYMENT, found, attempts=1, deliveries=2)

    assert isinstance(step, Done)
    outcome = step.outcome
    assert (outcome.status, outcome.via, outcome.result, outcome.provider_ref) == (
        OutcomeStatus.SUCCEEDED,
        "provider_lookup",
        {"payment_id": "pay_1", "status": "captured"},
        "pay_1",
    )
    assert (outcome.attempts, outcome.deliveries, outcome.error) == (1, 2, None)


def test_a_key_the_provider_never_saw_is_called_again_while_attempts_remain() -> None:
    absent = ProviderAnswer("absent", {})
    assert PAYMENT.max_attempts == 2
    assert after_lookup(PAY, PAYMENT, absent, attempts=1, deliveries=1) == CallAgain(delay_s=0.05)


def test_absent_with_the_attempts_spent_is_still_unknown_never_a_failure() -> None:
    """Every lookup follows a call whose answer was unknown (or a previous life's): that call may still commit,
    so "no record of the key" never proves that no effect exists. Nothing is failed, nothing compensated."""
    step = after_lookup(PAY, PAYMENT, ProviderAnswer("absent", {}), attempts=2, deliveries=1)

    assert isinstance(step, StillUnknown)
    assert "not a failure" in step.detail and "2 attempt(s)" in step.detail


def test_absent_inside_the_in_flight_window_waits_it_out_before_calling_again() -> None:
    """Right after a timeout the provider may still be processing the call: the key is called again only once
    that call's in-flight window (twice the timeout unless the contract says) has passed."""
    absent = ProviderAnswer("absent", {})
    assert PAYMENT.in_flight_window_s == 2 * PAYMENT.timeout_s == 20.0

    assert after_lookup(PAY, PAYMENT, absent, 1, 1, in_flight_left_s=12.5) == CallAgain(delay_s=12.5)
    assert after_lookup(PAY, PAYMENT, absent, 1, 1, in_flight_left_s=0.0) == CallAgain(delay_s=0.05)
    assert after_lookup(PAY, PAYMENT, absent, 2, 1, in_flight_left_s=12.5) == after_lookup(
        PAY, PAYMENT, absent, 2, 1
    )


def test_the_in_flight_window_is_the_contracts_or_twice_its_timeout() -> None:
    assert TOOL_CONTRACTS["send_confirmation_email"].in_flight_window_s == 6.0
    patient = ToolContract(
        name="x", family="f", effect=Effect.MONEY, timeout_s=1.0, retry=RetryRule.NEVER_BLIND, in_flight_s=7.0
    )
    assert patient.in_flight_window_s == 7.0


def test_a_record_the_provider_holds_as_refused_is_a_failure_via_the_lookup() -> None:
    """A declined charge exists, but moved no money: the lookup reads it by its status, as a refusal."""
    declined = {"code": "declined", "message": "the provider holds this record as declined", "record": {}}

    step = after_lookup(
        PAY, PAYMENT, ProviderAnswer("rejected", declined, ref="pay_1"), attempts=1, deliveries=2
    )

    assert isinstance(step, Done)
    outcome = step.outcome
    assert (outcome.status, outcome.via, outcome.attempts, outcome.deliveries) == (
        OutcomeStatus.FAILED,
        "provider_lookup",
        1,
        2,
    )
    assert outcome.error == ErrorInfo(
        code="declined", message="the provider holds this record as declined", details={"provider": declined}
    )


def test_retry_after_is_the_pause_before_asking_again() -> None:
    """A 429 (or a key in use) says when to ask again: the lookup of a write waits that long, and so does the
    next attempt of a read when it is longer than the backoff."""
    throttled = ProviderAnswer("unknown", {}, detail="provider answered 429", retry_after_s=3.0)

    assert after_call(PAY, PAYMENT, throttled, attempts=1, deliveries=1) == LookUp(delay_s=3.0)
    assert after_call(FIND, SEARCH, throttled, attempts=1, deliveries=1) == CallAgain(delay_s=3.0)
    short = ProviderAnswer("unknown", {}, retry_after_s=0.01)
    assert after_call(FIND, SEARCH, short, attempts=2, deliveries=1) == CallAgain(delay_s=0.1)


@pytest.mark.parametrize(
    ("detail", "said"), [("HTTP 503", "HTTP 503"), ("", "provider lookup gave no answer")]
)
def test_a_lookup_without_an_answer_leaves_the_outcome_unknown(detail: str, said: str) -> None:
    """Neither the call nor the lookup could tell: keep the intent open, never call again blind."""
    step = after_lookup(PAY, PAYMENT, ProviderAnswer("unknown", {}, detail=detail), attempts=1, deliveries=1)
    assert step == StillUnknown(detail=said)


# Outcomes the executor states itself --------------------------------------------------------------------------


def test_an_unknown_outcome_is_reported_as_unknown_with_a_reconcile_by_key_error() -> None:
    outcome = unknown_outcome(PAY, "provider and lookup unavailable", attempts=2, deliveries=11)

    assert (outcome.run_id, outcome.step_no, outcome.tool, outcome.key) == (RUN, 6, "create_payment", PAY.key)
    assert (outcome.status, outcome.via, outcome.attempts, outcome.deliveries) == (
        OutcomeStatus.UNKNOWN,
        "unresolved",
        2,
        11,
    )
    assert (outcome.result, outcome.provider_ref) == ({}, None)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retry, outcome.error.details) == (
        "outcome_unknown",
        "unknown_outcome",
        {"key": PAY.key},
    )
    assert "create_payment" in outcome.error.message and PAY.key in outcome.error.message
    assert (
        "provider and lookup unavailable" in outcome.error.message
        and "reconcile by key" in outcome.error.message
    )


def test_a_refused_request_is_a_failure_with_no_attempt() -> None:
    error = ErrorInfo(code="invalid_tool_arguments", message="create_payment needs booking_id")

    outcome = refused(PAY, error, deliveries=1)

    assert (outcome.status, outcome.via, outcome.attempts, outcome.deliveries, outcome.error) == (
        OutcomeStatus.FAILED,
        "refused",
        0,
        1,
        error,
    )
    assert (outcome.key, outcome.result, outcome.provider_ref) == (PAY.key, {}, None)
