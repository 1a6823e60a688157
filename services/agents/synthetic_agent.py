"""The synthetic turn's agent: one hotel search and its answer, for the operators' end-to-end probe.

Its model may ask for `search_hotels` only, so a synthetic run can write nothing anywhere: the runtime rejects
any other call of its model (`unknown_tool`) before anything is journaled or signed. Its built-in route is the
`fixed` one (services/runtime/fixed_model.py): no paid model call per probe unless the catalog gives it another."""

from __future__ import annotations

from typing import Any

from crashsafe.contracts.catalog import AgentConfig, ModelApi, ModelRoute
from crashsafe.contracts.errors import ErrorCode, ErrorInfo
from crashsafe.contracts.run_events import Budget
from crashsafe.contracts.synthetic_turn import DEFAULT_BUDGET_S, FIXED_MODEL, SYNTHETIC_AGENT
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import AgentBase, Compensation, ProjectionCall, ScriptedStep
from crashsafe.domain.policy_verdicts import Hold, PolicyRule, default_question
from crashsafe.domain.registry import Registration, model_contracts
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents.booking.booking_agent import BookingAgent
from crashsafe.services.agents.booking.booking_arguments import SearchHotelsArgs
from crashsafe.services.agents.booking.booking_tools import SEARCH_HOTELS

INSTRUCTIONS = (
    "You run StayHub's synthetic check. Search hotels for the city and dates in the message with search_hotels, "
    "then say how many hotels were found. Never ask for anything else."
)

FIXED_ROUTE = ModelRoute(name="fixed", model=FIXED_MODEL, api=ModelApi.FIXED.value)


class SyntheticAgent(AgentBase):
    name = SYNTHETIC_AGENT
    instructions = INSTRUCTIONS
    tools = model_contracts((SEARCH_HOTELS,))
    compensation_tools: dict[str, ToolContract] = {}
    argument_types = {SEARCH_HOTELS.name: SearchHotelsArgs}
    # Small budgets: a search and its answer are two steps; the deadline is the probe's own budget.
    config = AgentConfig(
        agent=SYNTHETIC_AGENT,
        routes=[FIXED_ROUTE],
        budget=Budget(max_steps=4, max_tokens=20_000, deadline_s=DEFAULT_BUDGET_S),
    )

    policies: tuple[PolicyRule, ...] = ()

    def approval_question(self, state: RunState, tool: ToolContract, args: dict[str, Any], hold: Hold) -> str:
        return default_question(state, tool, args, hold)

    def script(self, state: RunState) -> ScriptedStep | None:
        return None  # the model port decides (the fixed route, by default)

    def projections(self, state: RunState) -> tuple[ProjectionCall, ...]:
        return ()  # nothing to email or record: a probe leaves no trace outside its journal

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        return ()  # a search has nothing to undo

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        if tool.name != SEARCH_HOTELS.name:
            return ErrorInfo(
                code=ErrorCode.INVALID_TOOL_ARGUMENTS.value, message=f"no argument rules for {tool.name}"
            )
        return _BOOKING.prepare(state, tool, args)  # the booking agent's own checks of a search


_BOOKING = BookingAgent()


def registration() -> Registration:
    return Registration(agent=SyntheticAgent(), tools=(SEARCH_HOTELS,))
