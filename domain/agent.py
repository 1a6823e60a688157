"""What the runtime needs from an agent: its tool contracts and pure rules for turning calls into actions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import AgentFault, ErrorInfo
from crashsafe.contracts.keys import CompensationKind
from crashsafe.contracts.run_events import ToolCall
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.policy_verdicts import Hold, PolicyRule
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
    name: str
    instructions: str
    tools: dict[str, ToolContract]  # what the model may call
    compensation_tools: dict[str, ToolContract]  # what only the runtime may call, to undo effects
    # The built-in configuration (rules, budget, routes): the catalog's default for this agent.
    config: AgentConfig
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

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        """What the run's journal calls for beyond its own steps (planned when it ends; pure, from the journal)."""
        ...

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        """What the approver is asked about a held action (`policy_verdicts.default_question`: the rule's own
        wording, else a neutral one). Pure."""
        ...


def hook_raised(agent: Agent, hook: str, exc: Exception) -> AgentFault:
    return AgentFault(agent=agent.name, hook=hook, problem=f"raised {type(exc).__name__}: {str(exc)[:300]}")


def hook_misanswered(agent: Agent, hook: str, answer: object, expected: str) -> AgentFault:
    return AgentFault(
        agent=agent.name, hook=hook, problem=f"returned {type(answer).__name__}, not {expected}"
    )
