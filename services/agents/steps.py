"""A deterministic workflow agent: N sequential no-op tool steps from a plan in code, no model (the steps5 yardstick)."""

from __future__ import annotations

from typing import Any

from contracts.errors import ErrorInfo
from contracts.run_events import ToolCall
from contracts.tools import Effect, KeyRule, RetryRule, ToolContract
from services.runtime.core.agent import Compensation, ScriptedStep
from services.runtime.core.state import RunState

NOOP = ToolContract(
    name="noop",
    family="noop",
    effect=Effect.WRITE,
    timeout_s=5.0,
    retry=RetryRule.KEYED,
    max_attempts=1,
    key_rule=KeyRule.RUN_STEP,
    description="Does nothing, durably: intent, no-op effect, receipt.",
)


class StepsAgent:
    instructions = ""

    def __init__(self, steps: int, step_ms: int = 0) -> None:
        self.steps = steps
        self.step_ms = step_ms
        self.name = f"steps{steps}" + (f"x{step_ms}ms" if step_ms else "")
        self.tools = {NOOP.name: NOOP}
        self.compensation_tools: dict[str, ToolContract] = {}

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        return ()

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
