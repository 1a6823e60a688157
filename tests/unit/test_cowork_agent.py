"""The coworking agent's own tests, as its authors write them: played through the runtime's real fold and decisions
with `crashsafe.testing` (no broker, no provider), the same fake model its evals use driving each run."""

from __future__ import annotations

from typing import Any

from crashsafe.examples.cowork.desk_agent import CoworkAgent
from crashsafe.examples.cowork.desk_model import script
from crashsafe.sdk import ActionRequested, ApprovalRequested, PolicyDenied, RunState, ScriptedStep
from crashsafe.testing import Conversation, Failed, ask, play, reply, step

AGENT = CoworkAgent()


def model(state: RunState) -> ScriptedStep:
    return step(script, state)


def zones(args: dict[str, Any]) -> dict[str, Any]:
    return {"zones": [{"zone": args["zone"], "free": 3, "price_cents": 2_500, "currency": "EUR"}]}


def reserved(args: dict[str, Any], number: int = 1, price_cents: int = 2_500) -> dict[str, Any]:
    return {
        "reservation_id": f"res_{number}",
        "desk_id": f"{args['zone']}-{number}",
        "zone": args["zone"],
        "day": args["day"],
        "price_cents": price_cents,
        "currency": "EUR",
        "status": "reserved",
    }


def released(args: dict[str, Any]) -> dict[str, Any]:
    return {"reservation_id": args["reservation_id"], "status": "released"}


def paid(args: dict[str, Any]) -> dict[str, Any]:
    return {"pass_id": "pass_1", "amount_cents": args["amount_cents"], "currency": args["currency"]}


def test_a_pass_is_bought_at_the_providers_price_even_when_the_member_names_one() -> None:
    played = play(
        AGENT,
        "Book a desk in the quiet zone on 2031-05-04 and charge me only EUR 1",
        model=model,
        tools={"find_desks": zones, "reserve_desk": reserved, "buy_day_pass": paid, "release_desk": released},
        guest_id="ana",
    )
    denied = played.of(PolicyDenied)
    # The weak model copied the member's amount into its call: refused before anything reached a provider, and
    # the desk it would have paid for is given back as the run ends.
    assert [d.rule for d in denied] == ["server_computed_amount"], denied
    assert [tool for tool, _ in played.requested] == ["find_desks", "reserve_desk", "release_desk"]
    assert played.requested[1][1]["member_id"] == "ana"


def test_the_day_pass_is_priced_from_the_reservation_and_the_desk_kept() -> None:
    played = play(
        AGENT,
        "Book a desk in the quiet zone on 2031-05-04",
        model=model,
        tools={"find_desks": zones, "reserve_desk": reserved, "buy_day_pass": paid},
        guest_id="ana",
    )
    assert played.status == "completed", played.events
    assert "is yours on 2031-05-04" in (played.reply or "")
    (_, charge) = played.requested[-1]
    assert (charge["reservation_id"], charge["amount_cents"], charge["currency"]) == ("res_1", 2_500, "EUR")
    assert "release_desk" not in [tool for tool, _ in played.requested]


def test_a_declined_pass_gives_the_desk_back_once() -> None:
    declined = Failed("card_declined", "the card was declined")
    played = play(
        AGENT,
        "Book a desk in the open zone on 2031-05-04",
        model=model,
        tools={
            "find_desks": zones,
            "reserve_desk": reserved,
            "buy_day_pass": declined,
            "release_desk": {"reservation_id": "res_1", "status": "released"},
        },
    )
    released = [e for e in played.of(ActionRequested) if e.tool == "release_desk"]
    assert [(e.args["reservation_id"], e.origin) for e in released] == [("res_1", "compensation")]
    assert played.status == "completed" and "did not go through" in (played.reply or "")


def test_an_office_pass_waits_for_the_members_yes_asked_in_the_agents_words() -> None:
    talk = Conversation(
        AGENT,
        model=model,
        tools={
            "find_desks": zones,
            "reserve_desk": lambda args: reserved(args, price_cents=9_000),
            "buy_day_pass": paid,
        },
    )
    waiting = talk.say("Book a desk in the office zone on 2031-05-04")
    (asked,) = waiting.of(ApprovalRequested)
    assert (
        asked.question
        == "Reply yes to pay EUR 90.00 for the day pass of a desk in the office zone on 2031-05-04"
    )
    assert waiting.status != "completed" and waiting.requested[-1][0] == "reserve_desk"
    done = talk.say("yes")
    assert done.status == "completed" and done.requested[-1][1]["amount_cents"] == 9_000


def test_the_spaces_own_rule_refuses_a_third_desk_in_one_conversation_by_its_name() -> None:
    days = ("2031-05-04", "2031-05-05", "2031-05-06")
    numbered = iter(range(1, 4))
    played = play(
        AGENT,
        "Three quiet desks, please",
        model=[*(ask("reserve_desk", zone="quiet", day=day) for day in days), reply("Done.")],
        tools={"reserve_desk": lambda args: reserved(args, next(numbered)), "release_desk": released},
    )
    (denied,) = played.of(PolicyDenied)
    assert (denied.tool, denied.rule) == ("reserve_desk", "desks_per_conversation")
    assert [args["day"] for tool, args in played.requested if tool == "reserve_desk"] == list(days[:2])


def test_a_desk_given_back_is_never_paid_for_even_by_a_pass_tool_that_undoes_nothing_itself() -> None:
    """The day pass declares no compensation of its own; the reservation it names was given back, so paying for
    it again is denied by the runtime's own rule (`undone_effect`), not left to the agent's code."""
    played = play(
        AGENT,
        "A quiet desk on 2031-05-04",
        model=[
            ask("reserve_desk", zone="quiet", day="2031-05-04"),
            ask("buy_day_pass", reservation_id="res_1"),
            ask("buy_day_pass", reservation_id="res_1"),
            reply("Sorry."),
        ],
        tools={
            "reserve_desk": reserved,
            "buy_day_pass": Failed("card_declined", "the card was declined"),
            "release_desk": released,
        },
    )
    assert [tool for tool, _ in played.requested] == ["reserve_desk", "buy_day_pass", "release_desk"]
    (denied,) = played.of(PolicyDenied)
    assert (denied.tool, denied.rule) == ("buy_day_pass", "undone_effect")
