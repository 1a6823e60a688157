"""`crashsafe.testing`: StayHub's booking agent played through the real fold and decisions against a script, the way
an adopter's tests play theirs; each test asserts the events the runtime would journal."""

from __future__ import annotations

import time
from typing import Any

import pytest

from crashsafe.contracts.memory import GuestProfile
from crashsafe.contracts.run_events import (
    ActionCompleted,
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    ModelAnswered,
    PolicyDenied,
    RunCompleted,
    RunHandedOff,
    RunStarted,
    ToolRejected,
)
from crashsafe.domain.fold import replay
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.testing import Conversation, Failed, Played, Unknown, ask, play, reply

BOOKING = BookingAgent()
STAY = {"check_in": "2030-02-01", "check_out": "2030-02-03"}


def hotels(args: dict[str, Any]) -> dict[str, Any]:
    return {"hotels": [{"hotel_id": "lis-1", "city": args["city"], "available": True}]}


def held(total_cents: int) -> dict[str, Any]:
    return {"booking_id": "bk_1", "total_cents": total_cents, "currency": "EUR", "status": "held"}


MODEL = [
    ask("search_hotels", city="Lisbon", **STAY),
    ask("create_booking", hotel_id="lis-1", **STAY),
    ask("create_payment", booking_id="bk_1"),
    reply("Booked and paid: bk_1."),
]


def answers(payment: Any, total_cents: int = 24_000) -> dict[str, Any]:
    return {
        "search_hotels": hotels,
        "create_booking": held(total_cents),
        "create_payment": payment,
        "release_booking": {"booking_id": "bk_1", "status": "released"},
    }


PAID = {"payment_id": "pay_1", "status": "captured"}


def kinds(played: Played) -> list[str]:
    return [str(type(e).__struct_config__.tag) for e in played.events]


def test_the_happy_path_journals_search_hold_and_charge_with_server_computed_arguments() -> None:
    played = play(BOOKING, "Book Lisbon 1-3 Feb", model=MODEL, tools=answers(PAID))
    assert played.status == "completed" and played.reply == "Booked and paid: bk_1."
    assert kinds(played) == [
        "run.started",
        *["run.model_answered", "run.action_requested", "run.action_completed"] * 3,
        "run.model_answered",
        "run.completed",
    ]
    (_, search), (_, hold), (_, charge) = played.requested
    assert search == {"city": "Lisbon", **STAY}
    assert hold == {"hotel_id": "lis-1", **STAY, "guest_id": "guest_1"}
    # The agent's `prepare` put in what only the server may decide: the amount and currency of the hold.
    assert charge == {"booking_id": "bk_1", "guest_id": "guest_1", "amount_cents": 24_000, "currency": "EUR"}
    keys = [e.key for e in played.of(ActionRequested)]
    assert keys[0].endswith(":2") and keys[1].startswith("hold:") and keys[2].startswith("charge:")
    # The model saw each tool's output: the payment's result is in the transcript it was asked with last.
    assert any('"pay_1"' in str(item.get("output", "")) for item in played.state.transcript)
    assert replay(list(played.events)) == played.state


def test_a_declined_charge_releases_the_hold_and_the_model_explains() -> None:
    declined = Failed("card_declined", "the card was declined")
    model = [*MODEL[:3], reply("Your card was declined; nothing was charged.")]
    played = play(BOOKING, "Book Lisbon 1-3 Feb", model=model, tools=answers(declined))
    assert played.status == "completed"
    assert [tool for tool, _ in played.requested] == [
        "search_hotels",
        "create_booking",
        "create_payment",
        "release_booking",
    ]
    hold, charge, release = played.of(ActionRequested)[1:]
    assert release.origin == "compensation" and release.key == f"{hold.key}:release"
    assert release.args == {"booking_id": "bk_1"}
    failed = next(e for e in played.of(ActionCompleted) if e.step_no == charge.step_no)
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "card_declined"
    assert played.of(RunCompleted)[0].reply == "Your card was declined; nothing was charged."


def test_a_model_naming_the_amount_is_denied_by_policy_and_nothing_is_charged() -> None:
    model = [
        *MODEL[:2],
        ask("create_payment", booking_id="bk_1", amount_cents=100),
        reply("I cannot set the price."),
    ]
    played = play(BOOKING, "Book it and charge me 1 EUR", model=model, tools=answers(PAID))
    (denied,) = played.of(PolicyDenied)
    assert (denied.tool, denied.rule) == ("create_payment", "server_computed_amount")
    assert "create_payment" not in [tool for tool, _ in played.requested]
    # The hold was never paid, so the run's end releases it.
    assert [tool for tool, _ in played.requested][-1] == "release_booking"
    assert played.status == "completed"


def test_an_amount_over_the_limit_waits_for_the_guests_yes_then_pays() -> None:
    conversation = Conversation(BOOKING, model=MODEL, tools=answers(PAID, total_cents=180_000))
    waiting = conversation.say("Book Lisbon 1-3 Feb")
    assert waiting.status == "running" and waiting.reply is None
    (asked,) = waiting.of(ApprovalRequested)
    assert (asked.tool, asked.amount_cents, asked.approver) == ("create_payment", 180_000, "guest")
    done = conversation.say("yes")
    (decided,) = done.of(ApprovalDecided)
    assert decided.decision == "approved" and decided.decided_by == "guest:guest_1"
    assert done.requested[-1][0] == "create_payment" and done.status == "completed"


def test_an_unknown_outcome_hands_the_run_off_to_be_reconciled_by_key() -> None:
    played = play(BOOKING, "Book Lisbon 1-3 Feb", model=MODEL, tools=answers(Unknown()))
    (handed,) = played.of(RunHandedOff)
    assert handed.reason == "outcome_unknown" and played.of(ActionRequested)[2].key in handed.detail
    assert len(played.of(ModelAnswered)) == 3  # the model is not asked after the unknown charge


def test_a_tool_the_script_does_not_answer_fails_the_test_naming_it() -> None:
    with pytest.raises(AssertionError, match="no answer for create_booking"):
        play(BOOKING, "Book", model=MODEL, tools={"search_hotels": hotels})


def test_a_script_that_runs_out_fails_the_test() -> None:
    with pytest.raises(AssertionError, match="the script has 1 answers"):
        play(BOOKING, "Book", model=MODEL[:1], tools=answers(PAID))


def test_the_same_script_gives_the_same_journal() -> None:
    first = play(BOOKING, "Book Lisbon 1-3 Feb", model=MODEL, tools=answers(PAID))
    again = play(BOOKING, "Book Lisbon 1-3 Feb", model=MODEL, tools=answers(PAID))
    assert first.events == again.events
    started = first.events[0]
    assert isinstance(started, RunStarted) and first.state.turn_at == started.at


def test_a_bad_argument_from_the_model_is_a_typed_rejection() -> None:
    model = [ask("search_hotels", city="Lisbon", check_in="soon", check_out="later"), reply("Which dates?")]
    played = play(BOOKING, "Book Lisbon", model=model, tools={})
    (rejected,) = played.of(ToolRejected)
    assert rejected.error.code == "invalid_tool_arguments" and played.requested == []


def test_an_approval_that_runs_out_releases_the_hold() -> None:
    conversation = Conversation(BOOKING, model=MODEL, tools=answers(PAID, total_cents=180_000))
    conversation.say("Book Lisbon 1-3 Feb")
    played = conversation.expire()
    (decided,) = played.of(ApprovalDecided)
    assert (decided.decision, decided.decided_by) == ("expired", "timer")
    assert [tool for tool, _ in played.requested][-1] == "release_booking"
    assert "create_payment" not in [tool for tool, _ in played.requested]
    assert played.status == "completed" and played.reply


def test_a_manager_decides_a_corporate_guests_charge() -> None:
    corporate = GuestProfile(guest_id="guest_1", corporate=True, manager="mgr_1")
    asked: list[ApprovalRequested] = []

    def manager(approval: ApprovalRequested) -> bool:
        asked.append(approval)
        return False

    model = [*MODEL[:3], reply("Your manager did not approve it.")]
    played = play(BOOKING, "Book", model=model, tools=answers(PAID), approve=manager, profile=corporate)
    assert [a.approver for a in asked] == ["manager"]
    (decided,) = played.of(ApprovalDecided)
    assert (decided.decision, decided.decided_by) == ("rejected", "manager:test")
    assert [tool for tool, _ in played.requested][-1] == "release_booking"


def test_an_agent_that_decides_otherwise_on_a_replay_fails_the_test() -> None:
    class Stamped(BookingAgent):
        """Puts the wall clock into a hold: every replay would journal another hold."""

        def prepare(self, state: Any, tool: Any, args: dict[str, Any]) -> Any:
            prepared = super().prepare(state, tool, args)
            return {**prepared, "at": time.perf_counter_ns()} if isinstance(prepared, dict) else prepared

    with pytest.raises(AssertionError, match="must be pure"):
        play(Stamped(), "Book Lisbon 1-3 Feb", model=MODEL, tools=answers(PAID))


def test_a_message_after_the_end_is_not_a_turn_of_the_ended_run() -> None:
    conversation = Conversation(BOOKING, model=MODEL, tools=answers(PAID))
    assert conversation.say("Book Lisbon 1-3 Feb").status == "completed"
    with pytest.raises(AssertionError, match="starts a run of its own"):
        conversation.say("and another")
