"""The benchmark's workloads: plan agents of N sequential no-op tool steps, no model (the steps5 yardstick).

Registered by the benchmark (and the tests that use the yardstick), never by the product:
`CRASHSAFE_REGISTRY=bench.workloads:registry`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.run_events import ToolCall
from crashsafe.contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from crashsafe.domain.agent import AgentBase, ScriptedStep
from crashsafe.domain.registry import LocalOperation, Registration, Registry, Tool
from crashsafe.domain.run_state import RunState
from crashsafe.services.agents import booking

NOOP_CONTRACT = ToolContract(
    name="noop",
    family="noop",
    effect=Effect.WRITE,
    timeout_s=5.0,
    retry=RetryRule.KEYED,
    max_attempts=1,
    key_rule=KeyRule.RUN_STEP,
    description="Does nothing, durably: intent, no-op effect, receipt.",
)


async def _noop(args: dict[str, Any], key: str) -> dict[str, Any]:
    if args.get("sleep_ms"):
        await asyncio.sleep(int(args["sleep_ms"]) / 1000)
    return {"done": True, **args}


# A no-op leaves nothing behind: nothing to ask by key, nothing to audit; calling it again is the same as once.
NOOP = Tool(NOOP_CONTRACT, LocalOperation(_noop), audited=False)


class StepsAgent(AgentBase):
    instructions = ""

    def __init__(self, steps: int, step_ms: int = 0) -> None:
        self.steps = steps
        self.step_ms = step_ms
        self.name = f"steps{steps}" + (f"x{step_ms}ms" if step_ms else "")
        self.tools = {NOOP.name: NOOP.contract}
        self.compensation_tools: dict[str, ToolContract] = {}
        self.config = AgentConfig(agent=self.name)

    def script(self, state: RunState) -> ScriptedStep | None:
        done = len(state.completed)
        if done < self.steps:
            args = '{"i":%d,"sleep_ms":%d}' % (done + 1, self.step_ms)
            return ScriptedStep(calls=(ToolCall(call_id=f"plan-{done + 1}", name="noop", arguments=args),))
        return ScriptedStep(reply=f"{self.steps} steps done")

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        return {"i": int(args.get("i", 0)), "sleep_ms": int(args.get("sleep_ms", 0))}


# What `Stack(registry=…)` and CRASHSAFE_REGISTRY name to run these workloads.
REGISTRY = "bench.workloads:registry"


def registry() -> Registry:
    """The product's booking agent and the benchmark's plan agents (`steps5`, and `steps5x100ms` for recovery)."""
    steps = [StepsAgent(steps=5), StepsAgent(steps=5, step_ms=100)]
    return Registry.of(booking.registration(), *(Registration(agent=a, tools=(NOOP,)) for a in steps))
