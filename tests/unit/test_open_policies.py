"""Open policies: an agent's own rule types and approval wording, and the built-in rules in another vocabulary (a
coworking desk, not a hotel), all through the real decide path (`next_move` -> `plan_calls` -> `check_policy`)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.approvals import ApprovalStatus
from crashsafe.contracts.catalog import AgentConfig, Catalog
from crashsafe.contracts.keys import CompensationKind, KeyScheme, compensation_key
from crashsafe.contracts.policy import ApprovalAbove, DateWindow, OneActiveHold, rule_decoder
from crashsafe.contracts.run_events import (
    ActionRequested,
    ApprovalDecided,
    ApprovalRequested,
    HandOffReason,
    Origin,
    PolicyDenied,
    RunEvent,
    RunHandedOff,
    ToolCall,
)
from crashsafe.contracts.tool_messages import OutcomeStatus
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import AgentBase, Compensation, ProjectionCall, ScriptedStep
from crashsafe.domain.call_plan import plan_calls
from crashsafe.domain.catalog_check import validate_catalog
from crashsafe.domain.decide import Append, AskModel, next_move
from crashsafe.domain.fold import fold_run
from crashsafe.domain.model_calls import model_answered
from crashsafe.domain.policy_upgrade import upgraded
from crashsafe.domain.policy_verdicts import (
    Allow,
    Deny,
    Hold,
    PolicyRule,
    PreparedAction,
    Verdict,
    default_question,
    money,
)
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents.booking.booking_policy import DEFAULT_RULES
from crashsafe.testing import Conversation, ask, reply
from tests.support.runs import T0, receipt, reply_of, started

pytestmark = pytest.mark.unit


def _contract(name: str, effect: Effect, compensation: str | None = None) -> ToolContract:
    return ToolContract(
        name=name,
        family="desks",
        effect=effect,
        timeout_s=5.0,
        retry=RetryRule.KEYED if effect != Effect.READ else RetryRule.SAFE,
        compensation=compensation,
    )


RESERVE = _contract("reserve_desk", Effect.WRITE, compensation="release_desk")
CHARGE = _contract("charge_day_pass", Effect.MONEY, compensation="refund_day_pass")
RELEASE = _contract("release_desk", Effect.WRITE)
REFUND = _contract("refund_day_pass", Effect.MONEY)
DAY_PASS_CENTS = 2_500
# "At most 5 days ahead", as a built-in rule's parameters: no `prepare` refusal needed.
FIVE_DAYS_AHEAD = DateWindow(tools=["reserve_desk"], start_field="day", max_days_ahead=5)


class DeskAgent(AgentBase):
    """A coworking desk agent: reserve a desk for a day, charge a day pass, release the desk if the charge fails."""

    name = "desk"
    instructions = ""
    tools = {RESERVE.name: RESERVE, CHARGE.name: CHARGE}
    compensation_tools = {RELEASE.name: RELEASE, REFUND.name: REFUND}

    def __init__(self, *policies: PolicyRule, rules: tuple[Any, ...] = (FIVE_DAYS_AHEAD,)) -> None:
        self.policies: tuple[PolicyRule, ...] = policies
        self.config = AgentConfig(agent="desk", rules=list(rules))

    def prepare(self, state: RunState, tool: ToolContract, args: dict[str, Any]) -> dict[str, Any]:
        if tool.name == CHARGE.name:
            return {
                "reservation_id": args["reservation_id"],
                "amount_cents": DAY_PASS_CENTS,
                "currency": "EUR",
                "guest_id": state.guest_id,
            }
        return {**args, "guest_id": state.guest_id}

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        undo = []
        for req, done in state.completed:
            if req.tool != RESERVE.name or done.status != OutcomeStatus.SUCCEEDED:
                continue
            reservation = done.result["reservation_id"]
            charges = [
                d
                for r, d in state.completed
                if r.tool == CHARGE.name and r.args["reservation_id"] == reservation
            ]
            asked = (*state.pending, *(r for r, _ in state.completed))
            released = any(r.tool == RELEASE.name and r.args["reservation_id"] == reservation for r in asked)
            if any(d.status == OutcomeStatus.FAILED for d in charges) and not released:
                # The guest too, as a provider may want it: asked, not made by the provider, it names nothing undone.
                args = {"reservation_id": reservation, "guest_id": state.guest_id}
                undo.append(Compensation(RELEASE.name, args, req.key, CompensationKind.RELEASE))
        return tuple(undo)

    def script(self, state: RunState) -> ScriptedStep | None:
        return None

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        return ()

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        if tool.name == CHARGE.name and hold.amount_cents is not None:
            return f"Reply yes to buy a day pass for {money(hold.amount_cents, hold.currency)}"
        return default_question(state, tool, args, hold)


class DeskRun:
    """A desk run driven the way the runtime drives it: the model answers, `next_move` decides, receipts fold."""

    def __init__(self, agent: DeskAgent) -> None:
        self.agent = agent
        self.state = fold_run(None, started(agent="desk"))
        self.now = T0

    def add(self, *events: RunEvent) -> None:
        for event in events:
            self.state = fold_run(self.state, event)

    def ask(self, name: str, args: dict[str, Any]) -> RunEvent:
        """The model asks for one tool call; what the runtime journals for it."""
        self.now += timedelta(seconds=1)
        assert isinstance(next_move(self.state, self.agent, self.now), AskModel)
        call = ToolCall(call_id=f"call_{self.state.next_step}", name=name, arguments=json.dumps(args))
        self.add(model_answered(self.state, reply_of((call,)), self.now))
        (event,) = self.decide()
        return event

    def decide(self) -> tuple[RunEvent, ...]:
        self.now += timedelta(seconds=1)
        move = next_move(self.state, self.agent, self.now)
        assert isinstance(move, Append), move
        self.add(*move.events)
        return move.events

    def complete(self, request: RunEvent, status: str = "succeeded", **result: Any) -> None:
        assert isinstance(request, ActionRequested), request
        self.now += timedelta(seconds=1)
        self.add(receipt(request, self.now, status, result or None))

    def reserved(self, day: str, reservation_id: str = "rsv_1") -> str:
        request = self.ask(RESERVE.name, {"desk_id": "d-7", "day": day})
        self.complete(request, reservation_id=reservation_id, desk_id="d-7", guest_id="guest-1")
        return reservation_id


# An agent's own rule types ------------------------------------------------------------------------------------


def no_weekend_desks(action: PreparedAction, state: RunState) -> Verdict:
    if action.tool.name == RESERVE.name and action.args.get("day") == "2026-12-05":  # a Saturday
        return Deny("ignored: the registered name wins", "the space is closed on Saturdays")
    return Allow()


def test_an_agents_own_rule_denies_through_decide_and_is_journaled_with_its_name() -> None:
    run = DeskRun(DeskAgent(PolicyRule("no_weekends", no_weekend_desks)))
    denied = run.ask(RESERVE.name, {"desk_id": "d-7", "day": "2026-12-05"})
    assert isinstance(denied, PolicyDenied)
    assert (denied.rule, denied.reason, denied.tool) == (
        "no_weekends",
        "the space is closed on Saturdays",
        "reserve_desk",
    )
    assert isinstance(run.ask(RESERVE.name, {"desk_id": "d-7", "day": "2026-12-04"}), ActionRequested)


def test_an_agents_own_rule_sees_the_prepared_action_and_the_folded_run() -> None:
    seen: list[tuple[PreparedAction, int]] = []

    def watch(action: PreparedAction, state: RunState) -> Verdict:
        seen.append((action, len(state.completed)))
        return Allow()

    run = DeskRun(DeskAgent(PolicyRule("watch", watch)))
    request = run.ask(RESERVE.name, {"desk_id": "d-7", "day": "2026-12-02"})
    assert isinstance(request, ActionRequested)
    ((action, completed),) = seen
    assert action.args == {"desk_id": "d-7", "day": "2026-12-02", "guest_id": "guest-1"}  # prepared
    assert (action.input_hash, action.tool, action.origin, action.now) == (
        request.input_hash,
        RESERVE,
        "model",
        request.at,
    )
    assert completed == 0


def big_spender(action: PreparedAction, state: RunState) -> Verdict:
    if action.tool.name == CHARGE.name:
        return Hold(
            rule="",
            reason="every day pass needs the member's yes",
            approver="guest",
            ttl_s=600.0,
            amount_cents=action.args["amount_cents"],
            currency=action.args["currency"],
        )
    return Allow()


def test_an_agents_own_hold_asks_for_approval_worded_by_the_agent() -> None:
    run = DeskRun(DeskAgent(PolicyRule("member_says_yes", big_spender)))
    reservation = run.reserved("2026-12-02")
    held = run.ask(CHARGE.name, {"reservation_id": reservation})
    assert isinstance(held, ApprovalRequested)
    assert (held.rule, held.approver, held.amount_cents, held.currency) == (
        "member_says_yes",
        "guest",
        2_500,
        "EUR",
    )
    assert held.question == "Reply yes to buy a day pass for 25.00 EUR"
    assert held.expires_at == held.at + timedelta(seconds=600)
    assert run.state.pending == ()


def test_an_agents_own_hold_once_approved_lets_exactly_that_action_through_and_holds_the_next() -> None:
    """The engine, not the rule, knows an approval: bound to the action's input hash, so the approved pass is
    requested once (not asked about again for ever) and another reservation's pass is held again."""
    talk = Conversation(
        DeskAgent(PolicyRule("member_says_yes", big_spender)),
        model=[
            ask(RESERVE.name, desk_id="d-7", day="2030-01-08"),
            ask(CHARGE.name, reservation_id="rsv_1"),
            ask(RESERVE.name, desk_id="d-8", day="2030-01-09"),
            ask(CHARGE.name, reservation_id="rsv_2"),
            reply("Both paid."),
        ],
        tools={
            RESERVE.name: lambda args: {"reservation_id": f"rsv_{args['desk_id'][-1:] == '8' and 2 or 1}"},
            CHARGE.name: lambda args: {"pass_id": f"pass_{args['reservation_id']}"},
        },
    )
    first = talk.say("A desk tomorrow and the day after")
    assert [e.args["reservation_id"] for e in first.of(ApprovalRequested)] == ["rsv_1"]
    second = talk.say("yes")
    charged = [args["reservation_id"] for tool, args in second.requested if tool == CHARGE.name]
    assert charged == ["rsv_1"]
    assert [e.args["reservation_id"] for e in second.of(ApprovalRequested)] == ["rsv_1", "rsv_2"]
    done = talk.say("yes")
    assert done.status == "completed"
    assert [args["reservation_id"] for tool, args in done.requested if tool == CHARGE.name] == [
        "rsv_1",
        "rsv_2",
    ]


def test_a_hold_of_an_agent_that_words_nothing_gets_a_neutral_question() -> None:
    hold = Hold(
        rule="r", reason="above 10.00 EUR", approver="guest", ttl_s=60.0, amount_cents=2_500, currency="EUR"
    )
    state = fold_run(None, started(agent="desk"))
    assert (
        default_question(state, CHARGE, {}, hold)
        == "Reply yes to approve charge_day_pass for 25.00 EUR (above 10.00 EUR)"
    )

    assert "guest-1" in default_question(state, CHARGE, {}, replace(hold, approver="manager"))
    assert default_question(state, CHARGE, {}, replace(hold, question="Own words?")) == "Own words?"


def raises(action: PreparedAction, state: RunState) -> Verdict:
    raise KeyError("day")


def answers_a_string(action: PreparedAction, state: RunState) -> Any:
    return "deny"


def holds_forever(action: PreparedAction, state: RunState) -> Verdict:
    return Hold(rule="x", reason="r", approver="guest", ttl_s=float("inf"))


def holds_a_string_amount(action: PreparedAction, state: RunState) -> Verdict:
    return Hold(rule="x", reason="r", approver="guest", ttl_s=60.0, amount_cents="25.00")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("check", "problem"),
    [
        (raises, "raised KeyError"),
        (answers_a_string, "returned str, not Allow(), Deny(rule, reason) or Hold(...)"),
        (holds_forever, "returned Hold"),
        (holds_a_string_amount, "returned Hold"),
    ],
    ids=["raises", "not_a_verdict", "hold_forever", "hold_of_a_string_amount"],
)
def test_an_agents_rule_that_raises_or_misanswers_is_its_fault_and_the_run_hands_off(
    check: Any, problem: str
) -> None:
    run = DeskRun(DeskAgent(PolicyRule("broken", check)))
    handed = run.ask(RESERVE.name, {"desk_id": "d-7", "day": "2026-12-02"})
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.AGENT_FAULT
    assert "policy broken" in handed.detail and problem in handed.detail


def test_an_approval_question_that_raises_is_the_agents_fault() -> None:
    class Unworded(DeskAgent):
        def approval_question(
            self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold
        ) -> str:
            raise ValueError("no words")

    run = DeskRun(Unworded(PolicyRule("member_says_yes", big_spender)))
    reservation = run.reserved("2026-12-02")
    handed = run.ask(CHARGE.name, {"reservation_id": reservation})
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.AGENT_FAULT
    assert "approval_question" in handed.detail


def test_compensations_are_never_held_back_by_an_agents_rule() -> None:
    def deny_everything(action: PreparedAction, state: RunState) -> Verdict:
        return Deny("", "no")

    agent = DeskAgent()
    run = DeskRun(agent)
    reservation = run.reserved("2026-12-02")
    charge = run.ask(CHARGE.name, {"reservation_id": reservation})
    run.complete(charge, status="failed")
    agent.policies = (PolicyRule("deny_everything", deny_everything),)
    (release,) = run.decide()
    assert isinstance(release, ActionRequested) and release.origin == "compensation"


# The built-in rules, parameterised, in a desk's vocabulary ----------------------------------------------------


@pytest.mark.parametrize(
    ("day", "allowed"),
    [("2026-12-01", True), ("2026-12-06", True), ("2026-12-07", False), ("2026-11-30", False)],
    ids=["today", "five_days_ahead", "six_days_ahead", "yesterday"],
)
def test_at_most_five_days_ahead_is_a_built_in_rule(day: str, allowed: bool) -> None:
    event = DeskRun(DeskAgent()).ask(RESERVE.name, {"desk_id": "d-7", "day": day})
    if allowed:
        assert isinstance(event, ActionRequested)
    else:
        assert isinstance(event, PolicyDenied) and event.rule == "stay_window"
        assert (
            "6 days ahead, more than the 5 days" if day > "2026-12-01" else "is in the past"
        ) in event.reason


def test_paying_for_an_undone_effect_is_denied_in_any_vocabulary() -> None:
    """A day pass whose charge failed has its desk released (a compensation): paying for that reservation again,
    while the release is on its way and once it is done, is denied: derived from the contracts' `compensation`."""
    run = DeskRun(DeskAgent())
    reservation = run.reserved("2026-12-02")
    failed = run.ask(CHARGE.name, {"reservation_id": reservation})
    run.complete(failed, status="failed")
    (release,) = run.decide()
    assert isinstance(release, ActionRequested) and release.tool == "release_desk"
    # The model is not asked while a compensation is pending; a call planned now (as one of an earlier answer's
    # would be) is denied already.
    pay_again = ToolCall(
        call_id="call_again", name=CHARGE.name, arguments=json.dumps({"reservation_id": reservation})
    )
    (denied,) = plan_calls(run.state, run.agent, (pay_again,), run.now)
    assert isinstance(denied, PolicyDenied) and denied.rule == "undone_effect"
    assert "reservation_id rsv_1 was undone in this run (release_desk)" in denied.reason
    run.complete(release, reservation_id=reservation, status_text="released")
    again = run.ask(CHARGE.name, {"reservation_id": reservation})
    assert isinstance(again, PolicyDenied) and again.rule == "undone_effect"
    other = run.reserved("2026-12-03", reservation_id="rsv_2")
    assert isinstance(run.ask(CHARGE.name, {"reservation_id": other}), ActionRequested)


def test_one_active_hold_and_approval_above_name_their_own_fields() -> None:
    rules = (
        FIVE_DAYS_AHEAD,
        OneActiveHold(
            tool="reserve_desk", holder_fields=["guest_id"], same_fields=["desk_id"], start_field="day"
        ),
        ApprovalAbove(tool="charge_day_pass", limit_cents=4_000, for_field="reservation_id"),
    )
    run = DeskRun(DeskAgent(rules=rules))
    first = run.reserved("2026-12-02")
    same = run.ask(RESERVE.name, {"desk_id": "d-7", "day": "2026-12-02"})
    assert isinstance(same, ActionRequested)  # the same desk and day again: the same action
    run.complete(same, reservation_id=first, desk_id="d-7")
    clash = run.ask(RESERVE.name, {"desk_id": "d-9", "day": "2026-12-02"})
    assert isinstance(clash, PolicyDenied) and clash.rule == "one_active_hold" and "d-7" in clash.reason
    paid = run.ask(CHARGE.name, {"reservation_id": first})
    assert isinstance(paid, ActionRequested)
    run.complete(paid, payment_ref="p1")
    second = run.reserved("2026-12-03", reservation_id="rsv_2")
    held = run.ask(CHARGE.name, {"reservation_id": second})  # 25.00 + 25.00 above 40.00: counted together
    assert isinstance(held, ApprovalRequested) and held.rule == "approval_above"
    assert held.question == "Reply yes to buy a day pass for 25.00 EUR"


# Catalogs from before the parameters ------------------------------------------------------------------------


def test_a_rule_published_before_its_parameters_reads_them_from_the_agents_built_in_rule() -> None:
    old = rule_decoder.decode(
        b'{"type":"rule.stay_window","name":"","tools":["search_hotels","create_booking"],"max_nights":14,'
        b'"not_in_past":true}'
    )
    (window,) = upgraded([old], DEFAULT_RULES)
    assert isinstance(window, DateWindow)
    assert (window.start_field, window.end_field, window.start_label, window.max_nights) == (
        "check_in",
        "check_out",
        "check-in",
        14,
    )
    hold = rule_decoder.decode(b'{"type":"rule.one_active_hold","name":"","tool":"create_booking"}')
    assert upgraded([hold], DEFAULT_RULES) == [DEFAULT_RULES[3]]
    above = rule_decoder.decode(
        b'{"type":"rule.approval_above","name":"","tool":"create_payment","limit_cents":1,"approver":"guest",'
        b'"ttl_s":60.0,"corporate_only":false}'
    )
    (upgraded_above,) = upgraded([above], DEFAULT_RULES)
    assert isinstance(upgraded_above, ApprovalAbove) and upgraded_above.for_field == "booking_id"
    assert upgraded([above], ()) == [above]  # nothing to read them from: as written


def test_a_rule_that_names_no_fields_and_has_nothing_to_read_them_from_is_refused_at_publish() -> None:
    class Agents:
        agents = {"desk": DeskAgent(rules=())}

    catalog = Catalog(agents={"desk": AgentConfig(agent="desk", rules=[DateWindow(tools=["reserve_desk"])])})
    assert any("no tools or no start_field" in p for p in validate_catalog(catalog, Agents()))
    ok = Catalog(agents={"desk": AgentConfig(agent="desk", rules=[FIVE_DAYS_AHEAD])})
    assert validate_catalog(ok, Agents()) == []


def test_policies_that_are_not_a_tuple_of_rules_are_the_agents_fault() -> None:
    agent = DeskAgent()
    agent.policies = [no_weekend_desks]  # type: ignore[list-item,assignment]
    handed = DeskRun(agent).ask(RESERVE.name, {"desk_id": "d-7", "day": "2026-12-02"})
    assert isinstance(handed, RunHandedOff) and handed.reason == HandOffReason.AGENT_FAULT
    assert "policies" in handed.detail and "a tuple of PolicyRule" in handed.detail


def test_charges_split_under_the_limit_are_counted_together_when_the_rule_names_no_field() -> None:
    """Two day passes of 25.00 under a 30.00 limit: the second waits for a yes, as the two together pass it
    (each alone would not); the same pass asked again is not counted twice."""
    talk = Conversation(
        DeskAgent(rules=(ApprovalAbove(tool=CHARGE.name, limit_cents=3_000),)),
        model=[
            ask(RESERVE.name, desk_id="d-7", day="2030-01-08"),
            ask(CHARGE.name, reservation_id="rsv_1"),
            ask(RESERVE.name, desk_id="d-8", day="2030-01-09"),
            ask(CHARGE.name, reservation_id="rsv_2"),
            reply("Both paid."),
        ],
        tools={
            RESERVE.name: lambda args: {"reservation_id": "rsv_2" if args["desk_id"] == "d-8" else "rsv_1"},
            CHARGE.name: lambda args: {"pass_id": f"pass_{args['reservation_id']}"},
        },
    )
    first = talk.say("Two desks")
    (held,) = first.of(ApprovalRequested)
    assert (held.args["reservation_id"], held.amount_cents) == ("rsv_2", 2_500)
    assert [args["reservation_id"] for tool, args in first.requested if tool == CHARGE.name] == ["rsv_1"]


# An approval covers the attempt it was asked for ---------------------------------------------------------------

BUSINESS_CHARGE = msgspec.structs.replace(
    CHARGE, key_rule=KeyRule.BUSINESS, identity_kind="charge", identity=("reservation_id",)
)


class BusinessDeskAgent(DeskAgent):
    """The desk agent with its day pass keyed by what it pays for (`charge:<reservation>`, then `:a2`)."""

    tools = {RESERVE.name: RESERVE, CHARGE.name: BUSINESS_CHARGE}


def _paid_then_refunded(run: DeskRun) -> ActionRequested:
    """Reserve a desk, ask for its 25.00 pass (held above 20.00), approve it, pay it, then refund it."""
    run.reserved("2030-01-08")
    held = run.ask(CHARGE.name, {"reservation_id": "rsv_1"})
    assert isinstance(held, ApprovalRequested), held
    run.now += timedelta(seconds=1)
    run.add(
        ApprovalDecided(
            run_id=held.run_id,
            at=run.now,
            approval_id=held.approval_id,
            decision=ApprovalStatus.APPROVED.value,
            decided_by="guest:guest-1",
            input_hash=held.input_hash,
        )
    )
    (paid,) = run.decide()
    assert isinstance(paid, ActionRequested) and paid.input_hash == held.input_hash
    run.complete(paid, pass_id="pass_1")
    refund = ActionRequested(
        run_id=paid.run_id,
        at=run.now,
        step_no=run.state.next_step,
        call_id="",
        tool=REFUND.name,
        family=REFUND.family,
        args={"pass_id": "pass_1", "guest_id": "guest-1"},
        key=compensation_key(paid.key, CompensationKind.REFUND),
        input_hash="r" * 64,
        timeout_s=5.0,
        deadline_at=run.now + timedelta(seconds=5),
        origin=Origin.COMPENSATION.value,
    )
    run.add(refund)
    run.complete(refund)
    return paid


@pytest.mark.parametrize("scheme", [KeyScheme.BUSINESS, KeyScheme.STEP])
def test_an_approval_pays_once_not_again_after_a_refund(scheme: KeyScheme) -> None:
    """The guest's yes to a 25.00 pass paid that pass; once refunded, the same pass asked again is a new
    attempt (`charge:…:a2`, or a new step key) and is held for its own yes, not paid on the old one."""
    rules = (ApprovalAbove(tool=CHARGE.name, limit_cents=2_000),)
    agent = BusinessDeskAgent(rules=rules) if scheme == KeyScheme.BUSINESS else DeskAgent(rules=rules)
    run = DeskRun(agent)
    run.state = replace(run.state, started=msgspec.structs.replace(run.state.started, key_scheme=scheme))
    paid = _paid_then_refunded(run)
    again = run.ask(CHARGE.name, {"reservation_id": "rsv_1"})
    assert isinstance(again, ApprovalRequested), again
    assert again.input_hash == paid.input_hash
    run.add(
        ApprovalDecided(
            run_id=again.run_id,
            at=run.now,
            approval_id=again.approval_id,
            decision=ApprovalStatus.APPROVED.value,
            decided_by="guest:guest-1",
            input_hash=again.input_hash,
        )
    )
    (repaid,) = run.decide()  # its own yes pays the new attempt, once
    assert isinstance(repaid, ActionRequested) and repaid.key != paid.key
    if scheme == KeyScheme.BUSINESS:
        assert repaid.key == paid.key + ":a2"
