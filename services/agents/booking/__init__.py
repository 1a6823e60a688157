"""StayHub's booking agent: its rules, its tools and its audit rules, registered as one."""

from __future__ import annotations

from crashsafe.domain.registry import Registration
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.services.agents.booking.booking_audit import money_rules
from crashsafe.services.agents.booking.booking_tools import TOOLS
from crashsafe.services.agents.remember_preference import REMEMBER_PREFERENCE


def registration() -> Registration:
    return Registration(agent=BookingAgent(), tools=(*TOOLS, REMEMBER_PREFERENCE), audit_rules=(money_rules,))


__all__ = ["BookingAgent", "registration"]
