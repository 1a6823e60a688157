"""Whether an unknown outcome is final (domain/unknown_finality.py): told to the run at once when no later ask
can change it, left to the redeliveries whenever waiting might still bring an answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crashsafe.contracts.keys import input_hash
from crashsafe.contracts.tool_messages import ActionRequest, Answer
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.execution import CallAgain, after_lookup
from crashsafe.domain.registry import ProviderAnswer
from crashsafe.domain.unknown_finality import StillUnknown, final_unknown, without_lookup

AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
NOOP = ToolContract(
    name="noop", family="noop", effect=Effect.WRITE, timeout_s=5.0, retry=RetryRule.KEYED, max_attempts=1
)
PAYMENT = ToolContract(
    name="create_payment",
    family="payment",
    effect=Effect.MONEY,
    timeout_s=10.0,
    retry=RetryRule.NEVER_BLIND,
    max_attempts=2,
    key_rule=KeyRule.BUSINESS,
)


def request_of(contract: ToolContract) -> ActionRequest:
    return ActionRequest(
        run_id="run_0123456789abcdef01234567",
        step_no=3,
        tool=contract.name,
        family=contract.family,
        args={},
        key="run_0123456789abcdef01234567:3",
        input_hash=input_hash({"tool": contract.name, "args": {}}),
        timeout_s=contract.timeout_s,
        deadline_at=AT + timedelta(seconds=10),
        requested_at=AT,
    )


def final(
    *,
    looks_up: bool = True,
    informative: bool = True,
    lookup: str | None = Answer.ABSENT,
    attempts: int = 2,
    max_attempts: int = 2,
    retry_after: bool = False,
) -> bool:
    return final_unknown(
        looks_up=looks_up,
        lookup_informative=informative,
        lookup=lookup,
        attempts=attempts,
        max_attempts=max_attempts,
        retry_after=retry_after,
    )


# Final: nothing a later delivery could ask would answer otherwise ------------------------------------------------


def test_a_tool_with_no_lookup_is_final_whatever_was_asked_before() -> None:
    for lookup in (None, Answer.UNKNOWN, Answer.ABSENT):
        assert final(looks_up=False, informative=False, lookup=lookup, attempts=1)


def test_a_lookup_that_only_ever_says_absent_with_the_attempts_spent_is_final() -> None:
    assert final(informative=False, lookup=Answer.ABSENT, attempts=1, max_attempts=1)
    assert final(informative=False, lookup=Answer.ABSENT, attempts=3, max_attempts=2)


# Not final: a later ask may still tell --------------------------------------------------------------------------


def test_an_absent_from_a_real_providers_lookup_is_never_final() -> None:
    """An earlier call of ours may still commit (the in-flight window): absent may become found."""
    assert not final(informative=True, lookup=Answer.ABSENT, attempts=2, max_attempts=2)


@pytest.mark.parametrize("informative", [True, False])
def test_a_lookup_that_gave_no_answer_is_never_final(informative: bool) -> None:
    """A provider that is down now may answer later."""
    assert not final(informative=informative, lookup=Answer.UNKNOWN)


def test_a_local_absent_with_attempts_left_is_not_final() -> None:
    assert not final(informative=False, lookup=Answer.ABSENT, attempts=1, max_attempts=2)


@pytest.mark.parametrize("looks_up", [True, False])
def test_a_provider_that_asked_for_time_is_never_final(looks_up: bool) -> None:
    assert not final(looks_up=looks_up, informative=False, retry_after=True, attempts=1, max_attempts=1)


# The same decision where the executor meets it -------------------------------------------------------------------


def test_without_a_lookup_the_unknown_is_final_unless_the_provider_asked_for_time() -> None:
    assert without_lookup("send_note", 0.0).final
    assert not without_lookup("send_note", 3.0).final
    assert "send_note has no lookup" in without_lookup("send_note", 0.0).detail


def test_after_lookup_a_local_absent_with_the_attempts_spent_is_final_and_says_why() -> None:
    step = after_lookup(
        request_of(NOOP), NOOP, ProviderAnswer(Answer.ABSENT, {}), 1, 1, lookup_informative=False
    )
    assert isinstance(step, StillUnknown) and step.final
    assert "not a failure" in step.detail and "noop" in step.detail


def test_after_lookup_a_local_absent_with_attempts_left_calls_again() -> None:
    contract = ToolContract(
        name="noop", family="noop", effect=Effect.WRITE, timeout_s=5.0, retry=RetryRule.KEYED, max_attempts=2
    )
    step = after_lookup(
        request_of(contract), contract, ProviderAnswer(Answer.ABSENT, {}), 1, 1, lookup_informative=False
    )
    assert step == CallAgain(delay_s=0.05)


@pytest.mark.parametrize(
    "lookup",
    [
        ProviderAnswer(Answer.ABSENT, {}),
        ProviderAnswer(Answer.UNKNOWN, {}, detail="HTTP 503"),
        ProviderAnswer(Answer.UNKNOWN, {}, detail="provider answered 429", retry_after_s=2.0),
    ],
    ids=["absent", "no-answer", "retry-after"],
)
def test_after_lookup_a_real_providers_unknown_stays_for_the_redeliveries(lookup: ProviderAnswer) -> None:
    step = after_lookup(request_of(PAYMENT), PAYMENT, lookup, attempts=2, deliveries=1)
    assert isinstance(step, StillUnknown) and not step.final


def test_after_lookup_a_local_lookup_that_gave_no_answer_is_not_final() -> None:
    lookup = ProviderAnswer(Answer.UNKNOWN, {}, detail="cannot read")
    step = after_lookup(request_of(NOOP), NOOP, lookup, 1, 1, lookup_informative=False)
    assert step == StillUnknown(detail="cannot read", final=False)
