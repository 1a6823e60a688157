"""Replay of driven runs: folding and deciding a journal again gives the same decisions (the recorded journals,
from real stacks, are replayed in tests/unit/test_replay_corpus.py)."""

from __future__ import annotations

import msgspec
import pytest

from crashsafe.contracts.run_events import ActionRequested
from crashsafe.domain.fold import replay
from tests.support.journals import decision_steps
from tests.support.runs import assert_replays, booking_model, drive, started

# Driven runs --------------------------------------------------------------------------------------------------


def test_a_driven_booking_replays_to_the_same_decisions() -> None:
    run = drive(started(), booking_model, lambda request: "succeeded")
    assert run.state.status == "completed" and run.state.final_reply == "Booked and paid."
    assert decision_steps(run.events) == list(
        range(1, 8)
    )  # search, hold, pay: three asks, three steps, the reply
    assert_replays(run.events)
    assert replay(run.events) == run.state
    # A journal that lost its last decisions (a crash before they were appended) decides them again identically.
    for cut in range(1, len(run.events)):
        assert_replays(run.events[:cut])


def test_a_driven_steps5_run_replays() -> None:
    run = drive(started(agent="steps5"), booking_model, lambda request: "succeeded")
    assert run.state.status == "completed" and decision_steps(run.events) == [1, 2, 3, 4, 5]
    assert_replays(run.events)


def test_replay_catches_a_journal_that_the_code_would_not_have_written() -> None:
    run = drive(started(), booking_model, lambda request: "succeeded")
    payment = next(
        i for i, e in enumerate(run.events) if isinstance(e, ActionRequested) and e.tool == "create_payment"
    )
    forged = msgspec.structs.replace(
        run.events[payment], args={**run.events[payment].args, "amount_cents": 1}
    )  # type: ignore[union-attr]
    with pytest.raises(AssertionError, match="differs on replay"):
        assert_replays([*run.events[:payment], forged, *run.events[payment + 1 :]])
