"""A coworking desk-booking agent as an adopter writes one, outside the product, on `crashsafe.sdk` alone:
`crashsafe up --registry crashsafe.examples.cowork:registry` (README.md in this folder)."""

from __future__ import annotations

from crashsafe.examples.cowork.desk_agent import CoworkAgent
from crashsafe.examples.cowork.desk_tools import TOOLS
from crashsafe.sdk import Registration, Registry


def registry() -> Registry:
    """The deployment: one agent, its tools (two families, `desks` and `passes`: one executor each)."""
    return Registry.of(Registration(agent=CoworkAgent(), tools=TOOLS))
