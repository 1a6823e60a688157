"""StayHub's support agent: refunds of the guest's own payments, registered with its tools."""

from __future__ import annotations

from crashsafe.domain.registry import Registration
from crashsafe.services.agents.booking.booking_tools import REFUND_PAYMENT
from crashsafe.services.agents.support.support_agent import SupportAgent
from crashsafe.services.agents.support.support_tools import FIND_PAYMENTS


def registration() -> Registration:
    return Registration(agent=SupportAgent(), tools=(FIND_PAYMENTS, REFUND_PAYMENT))


__all__ = ["SupportAgent", "registration"]
