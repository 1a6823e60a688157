"""An agent registered with projection tools it does not declare is refused when the registry is built (issue 32,
item 8): an agent ported from before `projection_tools` (which declares none) stopped sending its emails and CRM
records, and nothing said so."""

from __future__ import annotations

import pytest

from crashsafe.contracts.errors import ProjectionToolsUndeclared
from crashsafe.domain.registry import Registration, Registry
from crashsafe.services.agents import stayhub
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.services.agents.booking.booking_tools import TOOLS

pytestmark = pytest.mark.unit


class PortedBooking(BookingAgent):
    """The booking agent as written before agents declared their projection tools: its `projections` still asks
    for the email and the CRM record, and it declares none (the default)."""

    name = "ported_booking"
    projection_tools: frozenset[str] = frozenset()


class HalfDeclared(BookingAgent):
    name = "half_declared"
    projection_tools = frozenset({"update_crm"})


def test_an_agent_that_declares_none_of_its_projection_tools_is_refused_naming_them() -> None:
    with pytest.raises(ProjectionToolsUndeclared) as refused:
        Registry.of(Registration(agent=PortedBooking(), tools=TOOLS))
    assert (refused.value.agent, refused.value.tools) == (
        "ported_booking",
        ["send_confirmation_email", "update_crm"],
    )
    assert "projection_tools = frozenset({'send_confirmation_email', 'update_crm'})" in refused.value.message
    assert refused.value.info().code == "invalid_registry"
    # The registry's other refusals are ValueErrors, which `crashsafe serve` and `replay` report in one line.
    assert isinstance(refused.value, ValueError)


def test_one_left_out_is_refused_too() -> None:
    with pytest.raises(ProjectionToolsUndeclared, match="'half_declared'.* send_confirmation_email, which"):
        Registry.of(Registration(agent=HalfDeclared(), tools=TOOLS))


def test_an_agent_that_declares_what_it_is_registered_with_is_built() -> None:
    """StayHub's booking agent declares both; an agent registered without projection tools declares none."""
    registry = stayhub()
    assert {"send_confirmation_email", "update_crm"} <= registry.projections.keys()
    no_projections = tuple(t for t in TOOLS if t.projection is None)
    assert Registry.of(Registration(agent=PortedBooking(), tools=no_projections)).agents.keys() == {
        "ported_booking"
    }
