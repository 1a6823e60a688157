"""Agents whose own code misbehaves, for the tests that nothing an agent returns wedges a run or the runtime.

Each one plans a no-op step from code (no model), then misbehaves in one way: it asks again to undo what is undone,
raises in a hook, or answers a hook with the wrong type. `NEVER_RETURN`'s hooks hold the event loop without awaiting
(a sleep, an endless loop), and `swallows_the_limit` also swallows what the hook limit raises into it.
Run by a real runtime with `CRASHSAFE_REGISTRY=tests.support.misbehaving:registry`.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from bench.workloads import NOOP, NOOP_CONTRACT, _noop
from crashsafe.contracts.catalog import AgentConfig
from crashsafe.contracts.errors import ErrorInfo
from crashsafe.contracts.keys import CompensationKind
from crashsafe.contracts.run_events import ToolCall
from crashsafe.contracts.tools import ToolContract
from crashsafe.domain.agent import AgentBase, Compensation, ScriptedStep
from crashsafe.domain.registry import LocalOperation, Registration, Registry, Tool
from crashsafe.domain.run_state import RunState

UNDO = Tool(
    msgspec.structs.replace(NOOP_CONTRACT, name="undo_noop", description="Undoes a no-op, durably."),
    LocalOperation(_noop),
    audited=False,
    compensation_only=True,
)
REGISTRY = "tests.support.misbehaving:registry"


class OneStep(AgentBase):
    """A plan of one no-op step, then a reply: the well-behaved base each misbehaving agent changes one hook of."""

    instructions = ""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tools = {NOOP.name: NOOP.contract}
        self.compensation_tools = {UNDO.name: UNDO.contract}
        self.config = AgentConfig(agent=name)

    def script(self, state: RunState) -> ScriptedStep | None:
        if not any(r.tool == NOOP.name for r, _ in state.completed):
            return ScriptedStep(calls=(ToolCall(call_id="plan-1", name=NOOP.name, arguments='{"i":1}'),))
        return ScriptedStep(reply="done")

    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        return dict(args)


class UndoesAgain(OneStep):
    """Undoes its no-op once it is done, and keeps asking to undo it after the undo was carried out (the wedge)."""

    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        done = [r for r, d in state.completed if r.tool == NOOP.name and d.status == "succeeded"]
        return tuple(
            Compensation(tool=UNDO.name, args={"i": 1}, undoes=r.key, kind=CompensationKind.RELEASE)
            for r in done
        )


class RaisesInPrepare(OneStep):
    def prepare(
        self, state: RunState, tool: ToolContract, args: dict[str, Any]
    ) -> dict[str, Any] | ErrorInfo:
        raise KeyError("guest_id")


class PreparesAList(OneStep):
    def prepare(self, state: RunState, tool: ToolContract, args: dict[str, Any]) -> Any:
        return [args]


class PreparesNotJson(OneStep):
    def prepare(self, state: RunState, tool: ToolContract, args: dict[str, Any]) -> Any:
        return {"when": object()}


class RaisesInCompensations(OneStep):
    def compensations(self, state: RunState, ending: bool) -> tuple[Compensation, ...]:
        raise RuntimeError("no undo for you")


class CompensatesWithStrings(OneStep):
    def compensations(self, state: RunState, ending: bool) -> Any:
        return ("release everything",)


class RaisesInScript(OneStep):
    def script(self, state: RunState) -> ScriptedStep | None:
        return ScriptedStep(calls=()) if state.completed else 1 / 0  # type: ignore[return-value]


class ScriptsADict(OneStep):
    def script(self, state: RunState) -> Any:
        return {"calls": [{"name": "noop"}]}


class ScriptsStrings(OneStep):
    def script(self, state: RunState) -> Any:
        return ScriptedStep(calls=("noop",))  # type: ignore[arg-type]


class TypesWithAString(OneStep):
    """Names its tool's argument struct by a string, not the Struct type (an easy slip without mypy)."""

    argument_types = {NOOP.name: "NoopArgs"}  # type: ignore[dict-item]


class BlocksTheLoop(OneStep):
    """Holds the event loop: code that never awaits (a synchronous call that hangs)."""

    def script(self, state: RunState) -> ScriptedStep | None:
        time.sleep(3600)
        return None


class LoopsForever(OneStep):
    """Never returns from a hook: an endless loop that never awaits (issue 31, item 10)."""

    def script(self, state: RunState) -> ScriptedStep | None:
        spins = 0
        while True:
            spins += 1


class SwallowsTheLimit(OneStep):
    """Holds the loop and swallows whatever is raised into it, the hook limit's `HookOverran` included: only the
    watchdog can end this one (as it would code stuck inside C, out of a signal's reach)."""

    def script(self, state: RunState) -> ScriptedStep | None:
        while True:
            try:
                time.sleep(3600)
            except BaseException:  # noqa: BLE001, S110 -- the misbehaviour under test
                pass


# What each misbehaving agent gets wrong, as the hand-off's detail names it (the hook).
MISBEHAVING: dict[str, tuple[type[OneStep], str]] = {
    "undoes_again": (UndoesAgain, "compensations"),
    "raises_in_prepare": (RaisesInPrepare, "prepare"),
    "prepares_a_list": (PreparesAList, "prepare"),
    "prepares_not_json": (PreparesNotJson, "prepare"),
    "raises_in_compensations": (RaisesInCompensations, "compensations"),
    "compensates_with_strings": (CompensatesWithStrings, "compensations"),
    "raises_in_script": (RaisesInScript, "script"),
    "scripts_a_dict": (ScriptsADict, "script"),
    "scripts_strings": (ScriptsStrings, "script"),
    "types_with_a_string": (TypesWithAString, "argument_types"),
}
# Agents whose hook never returns: stopped only by the runtime's hook limit (CRASHSAFE_HOOK_LIMIT_S).
NEVER_RETURN: dict[str, tuple[type[OneStep], str]] = {
    "blocks_the_loop": (BlocksTheLoop, "script"),
    "loops_forever": (LoopsForever, "script"),
}


def registry() -> Registry:
    agents = [kind(name) for name, (kind, _) in (MISBEHAVING | NEVER_RETURN).items()]
    agents += [OneStep("well_behaved"), SwallowsTheLimit("swallows_the_limit")]
    return Registry.of(*(Registration(agent=a, tools=(NOOP, UNDO)) for a in agents))
