"""The agents this product ships: adapters around the runtime's contracts, registered by a deployment."""

from __future__ import annotations

from services.agents import booking
from services.registry import Registry


def stayhub() -> Registry:
    """The reference deployment (`CRASHSAFE_REGISTRY=services.agents:stayhub`, the default): the booking agent."""
    return Registry.of(booking.registration())
