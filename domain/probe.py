"""A registry's own synthetic probe: a read-only, budgeted conversation with one of its agents. Pure.

The synthetic turn (contracts/synthetic_turn.py) crosses every seam a write does with reads only, as the tenant
`synthetic` talking to the agent `synthetic`. StayHub registers an agent of that name; any other registry declares
a `Probe` (`Registry.of(..., probe=Probe(...))`): which of its agents to borrow, and the read calls to make. The
registry then runs, as `synthetic`, a view of that agent offering only those tools (each validated a read:
`ProbeWrites` otherwise), so whatever its model asks, the runtime refuses any other call before anything is
journaled or signed. Its model is the `fixed` route, which makes the calls the probe's message lists
(`probe_text`): no paid model call per probe unless the catalog routes `synthetic` to one."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from types import MappingProxyType
from typing import Any

import msgspec

from crashsafe.contracts.catalog import AgentConfig, ModelApi, ModelRoute
from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.errors.registry_faults import ProbeWrites
from crashsafe.contracts.run_events import ArgumentLimits, Budget
from crashsafe.contracts.synthetic_turn import (
    DEFAULT_BUDGET_S,
    FIXED_MODEL,
    SYNTHETIC_AGENT,
    SYNTHETIC_PROBE_PREFIX,
)
from crashsafe.contracts.tools import Effect, ToolContract
from crashsafe.domain.agent import Agent, AgentBase
from crashsafe.domain.run_state import RunState

FIXED_ROUTE = ModelRoute(name="fixed", model=FIXED_MODEL, api=ModelApi.FIXED.value)


@dataclass(frozen=True, slots=True)
class ProbeCall:
    """One read the probe asks for: the tool, and its arguments (or a function of the day the probe runs, for a
    date that must stay in the future)."""

    tool: str
    arguments: Mapping[str, Any] | Callable[[date], Mapping[str, Any]] = field(default_factory=dict)

    def arguments_on(self, today: date) -> dict[str, Any]:
        given = self.arguments(today) if callable(self.arguments) else self.arguments
        return dict(given)


@dataclass(frozen=True, slots=True)
class Probe:
    """A registry's synthetic turn: `agent` (a registered one) is asked `calls`, reads only, in order; its run
    is held to `budget_s` (its deadline) and to the steps the calls need."""

    agent: str
    calls: tuple[ProbeCall, ...]
    budget_s: float = DEFAULT_BUDGET_S

    @property
    def tools(self) -> frozenset[str]:
        return frozenset(call.tool for call in self.calls)

    def text(self, today: date) -> str:
        """The guest message of a turn run on `today`: the calls, as the fixed route reads them back."""
        listed = [{"tool": c.tool, "arguments": c.arguments_on(today)} for c in self.calls]
        return f"{SYNTHETIC_PROBE_PREFIX} {json.dumps(listed, sort_keys=True, separators=(',', ':'))}"


def probe_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls a probe's message lists (`Probe.text`), or None for a message that is not one."""
    said = text.strip()
    if not said.startswith(SYNTHETIC_PROBE_PREFIX):
        return None
    try:
        calls = json.loads(said.removeprefix(SYNTHETIC_PROBE_PREFIX))
    except ValueError:
        return None
    if not isinstance(calls, list) or not calls:
        return None
    read: list[tuple[str, dict[str, Any]]] = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
            return None
        arguments = call.get("arguments", {})
        read.append((call["tool"], arguments if isinstance(arguments, dict) else {}))
    return read


class ProbeAgent(AgentBase):
    """The agent `synthetic` of a registry that declares a probe: the probed agent's read tools, argument types,
    limits and `prepare`, and nothing else (no rules of its own to hold a read, no compensations, no
    projections: a probe leaves no trace outside its journal)."""

    name = SYNTHETIC_AGENT

    def __init__(self, probe: Probe, probed: Agent) -> None:
        self.probe = probe
        self.probed = probed
        self.tools = {name: probed.tools[name] for name in sorted(probe.tools)}
        self.instructions = (
            f"You run the synthetic check of {probed.name}. The message lists tool calls as JSON after"
            f" '{SYNTHETIC_PROBE_PREFIX}': make exactly those, in order, with those arguments, then say in one line"
            " what they answered. Never ask for anything else."
        )
        # Two steps a call (its ask and its answer) and one for the reply: a probe never runs long.
        self.config = AgentConfig(
            agent=SYNTHETIC_AGENT,
            routes=[FIXED_ROUTE],
            budget=Budget(max_steps=2 * len(probe.calls) + 2, max_tokens=20_000, deadline_s=probe.budget_s),
        )
        self.argument_limits: ArgumentLimits = probed.argument_limits
        types = probed.argument_types
        self.argument_types: Mapping[str, type[msgspec.Struct]] = MappingProxyType(
            {name: types[name] for name in self.tools if name in types}
        )

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        if tool.name not in self.tools:
            return ErrorInfo(code=ErrorCode.UNKNOWN_TOOL.value, message=f"a probe asks for no {tool.name}")
        return self.probed.prepare(state, tool, args)


def probe_agent(probe: Probe, agents: Mapping[str, Agent]) -> ProbeAgent:
    """The registry's `synthetic` agent for `probe`, checked: a registered agent, tools it offers its model,
    each a read (`ProbeWrites` names any that is not)."""
    if SYNTHETIC_AGENT in agents:
        raise ValueError(
            f"a registry that declares a probe registers no agent named {SYNTHETIC_AGENT!r} itself"
        )
    probed = agents.get(probe.agent)
    if probed is None:
        raise ValueError(f"the probe names agent {probe.agent!r}, which the registry does not register")
    if not probe.calls:
        raise ValueError("a probe makes at least one call")
    unknown = sorted(probe.tools - set(probed.tools))
    if unknown:
        raise ValueError(
            f"the probe names {', '.join(unknown)}, which agent {probe.agent!r} offers its model no such tool"
        )
    writes = sorted(name for name in probe.tools if probed.tools[name].effect is not Effect.READ)
    if writes:
        raise ProbeWrites(agent=probe.agent, tools=writes)
    if probe.budget_s <= 0:
        raise ValueError("a probe's budget_s must be above 0")
    return ProbeAgent(probe, probed)
