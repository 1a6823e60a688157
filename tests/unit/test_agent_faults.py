"""`next_move` over agents whose own code misbehaves: every misbehaviour is a hand-off with reason `agent_fault`
naming the hook, never an exception out of the core nor a move that journals nothing (which spun the runtime)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from crashsafe.contracts.run_events import ActionRequested, RunHandedOff, ToolCall
from crashsafe.domain.decide import Append, AwaitActions, Idle, next_move
from crashsafe.domain.run_state import RunState
from tests.support.misbehaving import MISBEHAVING, OneStep, UndoesAgain
from tests.support.runs import Run, receipt, started


def _run(agent: OneStep) -> Run:
    return Run(started(agent=agent.name))


def _step(run: Run, agent: OneStep) -> Any:
    return next_move(run.state, agent, run.tick())  # type: ignore[arg-type]


def _drive(run: Run, agent: OneStep, moves: int = 20) -> RunState:
    """Drive the run as the runtime does, every action succeeding at once, until it ends or waits with nothing."""
    for _ in range(moves):
        move = _step(run, agent)
        if isinstance(move, Append):
            assert move.events, "a move that journals nothing"
            run.add(*move.events)
        elif isinstance(move, AwaitActions):
            for request in move.pending:
                run.add(receipt(request, run.tick(), "succeeded", {"done": True}))
        else:
            assert isinstance(move, Idle), move
            return run.state
    raise AssertionError(f"no end after {moves} moves: {run.state.status}")


@pytest.mark.parametrize("name", sorted(MISBEHAVING))
def test_each_misbehaving_agent_is_handed_off_with_its_hook_named(name: str) -> None:
    kind, hook = MISBEHAVING[name]
    agent = kind(name)
    run = _run(agent)
    state = _drive(run, agent)
    assert state.status == "handed_off"
    (handed,) = [e for e in run.events if isinstance(e, RunHandedOff)]
    assert handed.reason == "agent_fault"
    assert f"agent {name}'s {hook} " in handed.detail, handed.detail
    assert handed.reply  # the guest is told something defined


def test_a_compensation_already_carried_out_is_a_fault_not_an_empty_move() -> None:
    agent = UndoesAgain("undoes_again")
    run = _run(agent)
    state = _drive(run, agent)
    requested = [e.tool for e in run.events if isinstance(e, ActionRequested)]
    assert requested == ["noop", "undo_noop"]  # undone once
    (handed,) = [e for e in run.events if isinstance(e, RunHandedOff)]
    assert "undo_noop" not in handed.detail and ":release, already carried out" in handed.detail
    assert state.terminal
    # Ended, it still asks: the ended run only waits on nothing, it is not handed off twice.
    assert isinstance(_step(run, agent), Idle)


def test_a_well_behaved_agent_is_untouched() -> None:
    agent = OneStep("well_behaved")
    run = _run(agent)
    assert _drive(run, agent).status == "completed"


def test_an_ended_run_whose_agent_faults_waits_on_what_it_left_pending() -> None:
    class RaisesWhenEnding(OneStep):
        def compensations(self, state: RunState, ending: bool) -> Any:
            if ending:
                raise RuntimeError("no undo at the end")
            return ()

    agent = RaisesWhenEnding("raises_when_ending")
    run = _run(agent)
    (noop,) = _step(run, agent).events
    assert isinstance(noop, ActionRequested)
    run.add(noop)
    run.tick(float(timedelta(hours=1).total_seconds()))
    move = _step(run, agent)  # past the deadline with the no-op pending: asks compensations, which raise
    assert isinstance(move, Append) and isinstance(move.events[0], RunHandedOff)
    run.add(*move.events)
    assert isinstance(_step(run, agent), AwaitActions)


def test_an_ended_run_whose_agent_faults_says_so_in_its_move() -> None:
    """Ended, the run journals nothing more for a fault: the move carries it, so the shell reports it (before, a
    compensation the agent failed to plan after the hand-off, a late failed payment's release, went unsaid)."""

    class RaisesWhenEnding(OneStep):
        def compensations(self, state: RunState, ending: bool) -> Any:
            if ending:
                raise RuntimeError("no undo at the end")
            return ()

    agent = RaisesWhenEnding("raises_when_ending")
    run = _run(agent)
    (noop,) = _step(run, agent).events
    run.add(noop)
    run.tick(float(timedelta(hours=1).total_seconds()))
    run.add(*_step(run, agent).events)  # handed off (agent_fault)
    waiting = _step(run, agent)
    assert isinstance(waiting, AwaitActions)
    assert "raises_when_ending's compensations raised RuntimeError: no undo at the end" in waiting.fault
    run.add(receipt(noop, run.tick(), "succeeded", {"done": True}))
    idle = _step(run, agent)
    assert isinstance(idle, Idle) and "compensations raised RuntimeError" in idle.fault
    well = OneStep("well_behaved")
    done = _run(well)
    _drive(done, well)
    assert _step(done, well) == Idle()  # no fault, nothing said


def test_a_script_answering_tool_calls_of_the_wrong_kind_names_what_it_returned() -> None:
    class ScriptsNoneArguments(OneStep):
        def script(self, state: RunState) -> Any:
            from crashsafe.domain.agent import ScriptedStep

            return ScriptedStep(calls=[ToolCall(call_id="c", name="noop", arguments="{}")])  # type: ignore[arg-type]

    agent = ScriptsNoneArguments("lists")
    run = _run(agent)
    move = _step(run, agent)
    assert isinstance(move, Append)
    (handed,) = move.events
    assert isinstance(handed, RunHandedOff) and "returned ScriptedStep" in handed.detail
