"""StayHub's booking agent: its rules, its tools and its audit rules, registered as one."""

from __future__ import annotations

from services.agents.booking.agent import BookingAgent
from services.agents.booking.audit import money_rules
from services.agents.booking.tools import TOOLS
from services.agents.memory import REMEMBER_PREFERENCE
from services.registry import Registration


def registration() -> Registration:
    return Registration(agent=BookingAgent(), tools=(*TOOLS, REMEMBER_PREFERENCE), audit_rules=(money_rules,))


__all__ = ["BookingAgent", "registration"]
