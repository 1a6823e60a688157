"""The registry (domain/registry.py): which agents a deployment runs and the one definition of each tool.

Built here inside each test, not at import: what a test module builds at import time no mutant can reach."""

from __future__ import annotations

import dataclasses

import pytest

from bench.workloads import NOOP, StepsAgent
from crashsafe.contracts.errors import UnknownAgent
from crashsafe.contracts.projections import AUDIT_TRAIL_TOOL
from crashsafe.domain.agent import ProjectionCall
from crashsafe.domain.fold import fold_run
from crashsafe.domain.projection_plan import plan
from crashsafe.domain.registry import (
    Registration,
    Registry,
    compensation_contracts,
    load,
    model_contracts,
)
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents import booking, stayhub
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.services.agents.booking.booking_audit import money_rules
from crashsafe.services.agents.booking.booking_tools import CREATE_PAYMENT, TOOLS
from tests.support.runs import T0, started

BOOKING_TOOLS = {
    "search_hotels",
    "create_booking",
    "create_payment",
    "send_confirmation_email",
    "update_crm",
    "release_booking",
    "refund_payment",
}
# Delivered by the projector after the run, never offered to the model.
PROJECTIONS = {"send_confirmation_email", "update_crm"}
# What booking registers: its own tools and the guest memory tool (services/agents/remember_preference.py).
REGISTERED = BOOKING_TOOLS | {"remember_preference"}


def steps5() -> Registration:
    return Registration(agent=StepsAgent(5), tools=(NOOP,))


def test_a_registry_holds_every_agent_and_tool_and_the_first_agent_is_the_default() -> None:
    registry = Registry.of(booking.registration(), steps5())

    assert set(registry.agents) == {"booking", "steps5"}
    assert isinstance(registry.agents["booking"], BookingAgent)
    assert registry.agents["steps5"].name == "steps5"
    assert set(registry.tools) == REGISTERED | {"noop"}
    assert registry.tools["create_payment"] is CREATE_PAYMENT
    assert registry.contracts["create_payment"] == CREATE_PAYMENT.contract
    assert set(registry.contracts) == set(registry.tools)
    assert registry.audit_rules == (money_rules,)
    assert registry.families == frozenset({"booking", "payment", "notify", "memory", "noop"})
    assert registry.default_agent == "booking"
    assert Registry.of(steps5(), booking.registration()).default_agent == "steps5"


def test_a_tool_two_agents_share_is_one_tool_and_a_shared_audit_rule_runs_once() -> None:
    again = dataclasses.replace(booking.registration(), agent=StepsAgent(1))
    registry = Registry.of(booking.registration(), again)

    assert set(registry.agents) == {"booking", "steps1"}
    assert set(registry.tools) == REGISTERED
    assert registry.audit_rules == (money_rules,)


def test_a_registry_refuses_no_agent_an_agent_twice_and_a_tool_defined_twice_differently() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Registry.of()
    with pytest.raises(ValueError, match="'booking'"):
        Registry.of(booking.registration(), booking.registration())
    other_payment = dataclasses.replace(CREATE_PAYMENT, audited=False)
    with pytest.raises(ValueError, match="'create_payment'"):
        Registry.of(booking.registration(), Registration(agent=StepsAgent(1), tools=(other_payment,)))


def test_an_agent_the_deployment_does_not_run_is_unknown_with_the_ones_it_does() -> None:
    registry = Registry.of(booking.registration(), steps5())

    assert isinstance(registry.agent("booking"), BookingAgent)
    with pytest.raises(UnknownAgent) as unknown:
        registry.agent("concierge")
    assert unknown.value.details() == {"agent": "concierge", "known": ["booking", "steps5"]}


def test_an_executor_serves_one_family_of_tools() -> None:
    registry = stayhub()

    assert set(registry.tools_of("payment")) == {"create_payment", "refund_payment", "find_payments"}
    assert set(registry.tools_of("booking")) == {"search_hotels", "create_booking", "release_booking"}
    assert registry.tools_of("noop") == {}


def test_the_model_never_sees_a_compensation_or_projection_tool() -> None:
    assert set(model_contracts(TOOLS)) == BOOKING_TOOLS - {"release_booking", "refund_payment"} - PROJECTIONS
    assert {t.contract.name for t in TOOLS if t.projection is not None} == PROJECTIONS
    assert set(compensation_contracts(TOOLS)) == {"release_booking", "refund_payment"}
    assert model_contracts(TOOLS)["create_payment"] == CREATE_PAYMENT.contract


def test_a_tool_names_the_arguments_its_call_cannot_be_made_without() -> None:
    args = {"booking_id": "bk_1", "guest_id": "", "amount_cents": 24000}

    assert CREATE_PAYMENT.missing(args) == ["guest_id", "currency"]
    assert CREATE_PAYMENT.missing(args | {"guest_id": "g", "currency": "EUR"}) == []


def test_a_deployment_is_loaded_by_module_and_function() -> None:
    assert set(load("crashsafe.services.agents:stayhub").agents) == {"booking", "support", "synthetic"}
    assert set(load("bench.workloads:registry").agents) >= {"booking", "steps5"}
    for spec in (
        "crashsafe.services.agents",
        ":stayhub",
        "crashsafe.services.agents:",
        "crashsafe.services.agents:nobody",
        "crashsafe.contracts.keys:RUN_ID",
    ):
        with pytest.raises(ValueError, match="registry"):
            load(spec)


def test_an_agent_written_before_a_protocol_member_existed_is_refused_when_the_registry_is_built() -> None:
    """A plain class (not AgentBase) from before `policies` and `approval_question`: refused at start, naming what
    it lacks, instead of every one of its runs handing off at its first tool call."""

    class Older:
        name = "older"
        instructions = ""
        tools: dict[str, object] = {}
        compensation_tools: dict[str, object] = {}
        config = BookingAgent.config
        argument_types: dict[str, object] = {}
        argument_limits = BookingAgent.argument_limits

        def prepare(self, state: object, tool: object, args: object) -> object: ...
        def compensations(self, state: object, ending: bool) -> tuple[()]: ...
        def script(self, state: object) -> None: ...
        def projections(self, state: object) -> tuple[()]: ...

    with pytest.raises(ValueError, match="lacks policies, projection_tools, approval_question of the Agent"):
        Registry.of(Registration(agent=Older(), tools=()))  # type: ignore[arg-type]


class _ProjectsUndeclared(BookingAgent):
    """Asks for an email and a CRM record, declaring only the CRM record among its projection tools."""

    projection_tools = frozenset({"update_crm"})

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        args = {"booking_id": "bk_1", "guest_id": state.guest_id}
        return (ProjectionCall("send_confirmation_email", args), ProjectionCall("update_crm", args))


def test_a_projection_the_agent_did_not_declare_is_not_planned() -> None:
    """The projector reads no journal of an agent that declares no projection tools, so the declaration must be
    what the planner honours everywhere (the reconciler and re-plans too), never only a hint."""
    state = fold_run(None, started())
    tasks = plan(state, 1, _ProjectsUndeclared(), stayhub().projections, T0)
    assert [t.tool for t in tasks if t.tool != AUDIT_TRAIL_TOOL] == ["update_crm"]


def test_an_agent_naming_a_projection_tool_the_registry_lacks_is_refused_when_it_is_built() -> None:
    class Misdeclared(BookingAgent):
        projection_tools = frozenset({"send_postcard"})

    with pytest.raises(ValueError, match="names send_postcard among its projection tools"):
        Registry.of(Registration(agent=Misdeclared(), tools=TOOLS))
