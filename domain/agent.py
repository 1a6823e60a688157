"""What the runtime needs from an agent: its tool contracts and pure rules for turning calls into actions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import msgspec

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import AgentFault, ErrorInfo
from crashsafe.contracts.keys import CompensationKind
from crashsafe.contracts.run_events import ArgumentLimits, ToolCall
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.policy_verdicts import Hold, PolicyRule, default_question
from crashsafe.domain.run_state import RunState


@dataclass(frozen=True, slots=True)
class ScriptedStep:
    """A decision from code instead of a model: tool calls to make now, or the final reply."""

    calls: tuple[ToolCall, ...] = ()
    reply: str | None = None


@dataclass(frozen=True, slots=True)
class Compensation:
    """Undo an effect: keyed from the action it undoes, so deciding it twice names the same effect."""

    tool: str
    args: dict[str, Any]
    undoes: str  # the idempotency key of the action being undone
    kind: CompensationKind


@dataclass(frozen=True, slots=True)
class ProjectionCall:
    """A projection a run's journal calls for (a paid order's confirmation email): a projection tool and its
    arguments, decided by code from the journal alone. Keyed by the tool's business identity, like an action."""

    tool: str
    args: dict[str, Any]


class Agent(Protocol):
    """An agent: its tools and its rules, as code the runtime calls while it decides a run's next move.

    Purity: `prepare`, `compensations`, `script` and `projections` are called again whenever the run is replayed
    (a worker picking it up after a crash, `crashsafe replay`, the corpus check), and must decide the same every
    time. They read only the folded run (`RunState`) and their arguments: no I/O, no clock, no randomness, no
    module state. Nothing passes them the time: "today" is `state.turn_at` (when the guest's message being
    handled was journaled), never `datetime.now()`. A provider's answer they need comes from a tool (a read),
    whose result the journal keeps. Subclass `AgentBase` to write only what differs from the defaults."""

    name: str
    instructions: str
    tools: dict[str, ToolContract]  # what the model may call
    compensation_tools: dict[str, ToolContract]  # what only the runtime may call, to undo effects
    # The built-in configuration (rules, budget, routes): the catalog's default for this agent.
    config: AgentConfig
    # How large and how deeply nested one call's arguments may be (`ArgumentLimits()`: 16 KiB, 32 deep).
    argument_limits: ArgumentLimits

    @property
    def argument_types(self) -> Mapping[str, type[msgspec.Struct]]:
        """A tool's arguments as a msgspec Struct, by tool name: a call that does not fit is a typed rejection
        before `prepare` runs (a tool with no entry is checked by the argument limits alone). Read-only, so a
        class attribute holding a `dict` of the agent's own Structs satisfies it."""
        ...

    # The agent's own rule types, checked after the catalog's built-in rules (`PolicyRule`; empty: none).
    policies: tuple[PolicyRule, ...]

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        """Validate a call's arguments and add what only the server may decide (guest id, amounts)."""
        ...

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        """Effects to undo now; `ending` is true when the run is about to complete or hand off."""
        ...

    def script(self, state: RunState) -> ScriptedStep | None:
        """The next step for agents driven by a fixed plan in code; None means: ask the model."""
        ...

    # The projection tools `projections` may name (a call naming another is not planned). Empty: the agent
    # projects nothing, and the projector reads none of its runs' journals to find out.
    projection_tools: frozenset[str]

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        """What the run's journal calls for beyond its own steps (planned when it ends; pure, from the journal)."""
        ...

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        """What the approver is asked about a held action (`policy_verdicts.default_question`: the rule's own
        wording, else a neutral one). Pure."""
        ...


class AgentBase:
    """The defaults of the Agent protocol, so an agent's author writes only name, instructions, tools, config and
    `prepare`: no argument structs, the default argument limits, no rules of its own, no compensation tools, no
    compensations, no script (the model decides), no projections, the rule's own approval question (else a
    neutral one). Plain class attributes and methods: override any of them."""

    name: str
    instructions: str = ""
    tools: dict[str, ToolContract]
    config: AgentConfig
    # Read only, never changed: one shared empty dict is safe.
    compensation_tools: dict[str, ToolContract] = {}
    argument_types: Mapping[str, type[msgspec.Struct]] = MappingProxyType({})
    argument_limits: ArgumentLimits = ArgumentLimits()
    policies: tuple[PolicyRule, ...] = ()
    projection_tools: frozenset[str] = frozenset()

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        """The arguments as the model gave them (after `argument_types` checked them): override to add what only
        the server may decide (an amount, the guest's id) or to refuse a call with an ErrorInfo."""
        return dict(args)

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        return ()

    def script(self, state: RunState) -> ScriptedStep | None:
        return None

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        return ()

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        return default_question(state, tool, args, hold)


def hook_raised(agent: Agent, hook: str, exc: Exception) -> AgentFault:
    return AgentFault(agent=agent.name, hook=hook, problem=f"raised {type(exc).__name__}: {str(exc)[:300]}")


def hook_misanswered(agent: Agent, hook: str, answer: object, expected: str) -> AgentFault:
    return AgentFault(
        agent=agent.name, hook=hook, problem=f"returned {type(answer).__name__}, not {expected}"
    )
