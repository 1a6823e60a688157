"""Agents the runtime can run, by name: adapters around the runtime's contracts."""

from __future__ import annotations

from contracts.tools import ToolContract
from services.agents.booking import BookingAgent
from services.agents.steps import StepsAgent
from services.runtime.core.agent import Agent

AGENTS: dict[str, Agent] = {
    "booking": BookingAgent(),
    "steps5": StepsAgent(steps=5),
    "steps5x100ms": StepsAgent(steps=5, step_ms=100),  # the recovery-time workload: steps that take 100 ms
}


# Every tool any agent can ask for, by name: what an executor enforces.
TOOL_CONTRACTS: dict[str, ToolContract] = {
    name: tool
    for agent in AGENTS.values()
    for name, tool in {**agent.tools, **agent.compensation_tools}.items()
}


def agent_named(name: str) -> Agent:
    try:
        return AGENTS[name]
    except KeyError:
        raise KeyError(f"unknown agent {name!r}; known: {sorted(AGENTS)}") from None
