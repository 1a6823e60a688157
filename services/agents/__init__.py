"""The agents this product ships: adapters around the runtime's contracts, registered by a deployment."""

from __future__ import annotations

from crashsafe.domain.registry import Registry
from crashsafe.services.agents import booking, support, synthetic_agent
from crashsafe.services.agents.audit_trail import RECORD_AUDIT


def stayhub() -> Registry:
    """The reference deployment (`CRASHSAFE_REGISTRY=crashsafe.services.agents:stayhub`, the default): the booking agent
    (the default for an event that names none), the support agent and the synthetic turn's read-only agent; every
    run's events go to the audit trail."""
    return Registry.of(
        booking.registration(),
        support.registration(),
        synthetic_agent.registration(),
        extra_tools=(RECORD_AUDIT,),
    )
