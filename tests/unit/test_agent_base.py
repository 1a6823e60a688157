"""`AgentBase` gives an agent every default but what it must say; a member that is missing or of the wrong type is an
`AgentFault` naming it, not an exception out of the core; `RunState.turn_at` is the journal's time of the turn."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from crashsafe.contracts.run_events import RunHandedOff, ToolRejected, TurnReceived
from crashsafe.domain.fold import fold_run
from crashsafe.sdk import AgentBase, AgentConfig, ArgumentLimits, ErrorInfo, RunState, ToolContract
from crashsafe.testing import ask, play, reply
from tests.support.misbehaving import NOOP, OneStep
from tests.support.runs import Run, call, receipt, started


class Echo(AgentBase):
    """Only what an agent must say: its name, its tools, its configuration (and `prepare` from the base)."""

    name = "echo"
    tools = {NOOP.name: NOOP.contract}
    config = AgentConfig(agent="echo")


def test_an_agent_of_only_its_name_tools_and_config_runs_to_its_reply() -> None:
    played = play(Echo(), "go", model=[ask("noop", i=1), reply("done")], tools={"noop": {"done": True}})
    assert played.status == "completed" and played.reply == "done"
    assert played.requested == [("noop", {"i": 1})]
    agent = Echo()
    assert (agent.compensation_tools, dict(agent.argument_types)) == ({}, {})
    assert agent.argument_limits == ArgumentLimits()
    assert agent.script(played.state) is None and agent.projections(played.state) == ()
    assert agent.compensations(played.state, ending=True) == ()


class NoArgumentTypes(OneStep):
    """An agent written without the base, and without one member (an older agent, or a typo mypy would catch)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "argument_types":
            raise AttributeError(name)
        return super().__getattribute__(name)


class LimitsAsDict(OneStep):
    argument_limits = {"max_bytes": 10}  # type: ignore[assignment]


class NoopArgs(msgspec.Struct, forbid_unknown_fields=True):
    i: int


def _handed(agent: OneStep) -> RunHandedOff:
    played = play(agent, "go", model=[], tools={"noop": {"done": True}})
    (handed,) = played.of(RunHandedOff)
    return handed


def test_a_missing_or_mistyped_member_hands_the_run_off_naming_it() -> None:
    handed = _handed(NoArgumentTypes("no_types"))
    assert (
        handed.reason == "agent_fault"
        and "agent no_types's argument_types raised AttributeError" in handed.detail
    )
    handed = _handed(LimitsAsDict("dict_limits"))
    assert "agent dict_limits's argument_limits returned dict, not an ArgumentLimits" in handed.detail


def test_declared_argument_types_check_the_call_before_prepare() -> None:
    class TypedEcho(Echo):
        argument_types = {NOOP.name: NoopArgs}

        def prepare(
            self, state: RunState, tool: ToolContract, args: dict[str, Any]
        ) -> dict[str, Any] | ErrorInfo:
            assert isinstance(args["i"], int), "prepare saw a call its struct refuses"
            return dict(args)

    model = [ask("noop", i="one"), ask("noop", i=1), reply("ok")]
    played = play(TypedEcho(), "go", model=model, tools={"noop": {"done": True}})
    (refused,) = played.of(ToolRejected)
    assert refused.error.code == "invalid_tool_arguments" and "i" in refused.error.message
    assert played.requested == [("noop", {"i": 1})] and played.status == "completed"


def test_turn_at_is_the_journaled_time_of_the_turn_the_model_reads() -> None:
    run = Run(started())
    assert run.state.turn_at == run.state.started.at
    run.answer(call("search_hotels", {"city": "Lisbon", "check_in": "2031-01-02", "check_out": "2031-01-03"}))
    (requested,) = run.decide()
    later = run.state.started.at + timedelta(hours=3)
    turn = TurnReceived(run_id=run.state.run_id, at=later, event_id="evt-2", text="and breakfast?")
    waiting = fold_run(run.state, turn)
    assert waiting.turn_at == run.state.started.at, "mid-step, the turn waits in the inbox: not read yet"
    read = fold_run(waiting, receipt(requested, later + timedelta(seconds=1)))  # type: ignore[arg-type]
    assert read.turn_at == later
