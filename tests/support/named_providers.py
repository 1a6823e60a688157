"""A deployment whose writes go to named providers (docs/providers.md), none to the default one: holds at `hotels`,
charges at `billing`, notes at `crm` (which offers no lookup and no listing). `crashsafe audit` loads it by name
(`CRASHSAFE_REGISTRY=tests.support.named_providers:registry`), as it loads an adopter's."""

from __future__ import annotations

import dataclasses

from bench.workloads import StepsAgent
from crashsafe.domain.registry import HttpOperation, HttpRequest, Registration, Registry, Tool
from crashsafe.services.agents.booking.booking_tools import (
    CREATE_BOOKING,
    CREATE_PAYMENT,
    REFUND_PAYMENT,
    RELEASE_BOOKING,
)
from tests.support.python_providers import NOTE

REGISTRY = "tests.support.named_providers:registry"


def at(tool: Tool, provider: str) -> Tool:
    """`tool` as it is, its operation sent to `provider`."""
    assert isinstance(tool.operation, HttpOperation)
    return dataclasses.replace(tool, operation=dataclasses.replace(tool.operation, provider=provider))


SEND_NOTE = Tool(
    NOTE,
    HttpOperation(
        request=lambda args: HttpRequest("POST", "/notes", json=args),
        lookup_path=None,
        ref_field=None,
        provider="crm",
    ),
)
TOOLS = (
    at(CREATE_BOOKING, "hotels"),
    at(RELEASE_BOOKING, "hotels"),
    at(CREATE_PAYMENT, "billing"),
    at(REFUND_PAYMENT, "billing"),
    SEND_NOTE,
)


def registry() -> Registry:
    return Registry.of(Registration(agent=StepsAgent(steps=1), tools=TOOLS))
