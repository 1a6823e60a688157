"""StayHub's support agent: refunds of the guest's own payments, registered with its tools."""

from __future__ import annotations

from services.agents.booking.tools import REFUND_PAYMENT
from services.agents.support.agent import SupportAgent
from services.agents.support.tools import FIND_PAYMENTS
from services.registry import Registration


def registration() -> Registration:
    return Registration(agent=SupportAgent(), tools=(FIND_PAYMENTS, REFUND_PAYMENT))


__all__ = ["SupportAgent", "registration"]
