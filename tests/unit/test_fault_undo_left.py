"""An ended run whose agent faults names what it left for a person to undo, and only then is the fault an error
(issue 32, item 4): the runtime logged "what it should still undo is not planned; a person must check" at ERROR
for every such fault, with nothing left to undo too."""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from bench.workloads import NOOP_CONTRACT
from crashsafe.contracts.errors import AgentFault
from crashsafe.contracts.keys import CompensationKind
from crashsafe.contracts.run_events import ActionRequested, RunStatus
from crashsafe.domain.agent import Compensation
from crashsafe.domain.compensation_plan import left_to_undo, plan_compensations
from crashsafe.domain.decide import Idle, agent_failed
from crashsafe.domain.run_state import RunState
from crashsafe.services.runtime.drive_loop import DriveLoop
from tests.support.misbehaving import UNDO, OneStep
from tests.support.runs import Run, receipt
from tests.unit.test_agent_faults import _drive, _run, _step

pytestmark = pytest.mark.unit

# The no-op as an effect with an undo (a hold and its release), beside the plain no-op, which has none.
UNDOABLE = msgspec.structs.replace(NOOP_CONTRACT, compensation=UNDO.name)


class FaultsAtTheEnd(OneStep):
    """Its `compensations` raises once the run ends: the fault an ended run can only report."""

    def __init__(self, name: str, undoable: bool) -> None:
        super().__init__(name)
        if undoable:
            self.tools = {UNDOABLE.name: UNDOABLE}

    def compensations(self, state: RunState, ending: bool) -> Any:
        if ending:
            raise RuntimeError("no undo at the end")
        return ()


def _handed_off_after_its_effect(agent: FaultsAtTheEnd) -> tuple[Run, ActionRequested]:
    """The no-op is asked, the deadline passes (the fault hands the run off), then the no-op's receipt comes."""
    run = _run(agent)
    (noop,) = _step(run, agent).events
    run.add(noop)
    run.tick(float(timedelta(hours=1).total_seconds()))
    run.add(*_step(run, agent).events)
    assert run.state.status == RunStatus.HANDED_OFF
    run.add(receipt(noop, run.tick(), "succeeded", {"done": True}))
    return run, noop


def test_a_fault_that_left_nothing_to_undo_names_nothing() -> None:
    agent = FaultsAtTheEnd("faults_nothing_to_undo", undoable=False)
    run, _ = _handed_off_after_its_effect(agent)
    move = _step(run, agent)
    assert isinstance(move, Idle) and "compensations raised RuntimeError" in move.fault
    assert move.undo_left == ()


def test_a_fault_that_left_an_effect_with_an_undo_names_its_key() -> None:
    agent = FaultsAtTheEnd("faults_with_a_hold", undoable=True)
    run, noop = _handed_off_after_its_effect(agent)
    move = _step(run, agent)
    assert isinstance(move, Idle) and move.fault and move.undo_left == (noop.key,)


@pytest.mark.parametrize(("status", "left"), [("succeeded", False), ("failed", True)])
def test_an_effect_whose_undo_succeeded_is_not_left_and_one_whose_undo_failed_is(
    status: str, left: bool
) -> None:
    agent = FaultsAtTheEnd("undone_before", undoable=True)
    run, noop = _handed_off_after_its_effect(agent)
    undo = Compensation(tool=UNDO.name, args={"i": 1}, undoes=noop.key, kind=CompensationKind.RELEASE)
    assert left_to_undo(run.state, agent.tools) == (noop.key,)
    (release,) = plan_compensations(run.state, agent, (undo,), run.tick())
    assert isinstance(release, ActionRequested)
    run.add(release)
    assert left_to_undo(run.state, agent.tools) == ()  # on its way
    run.add(receipt(release, run.tick(), status))
    assert left_to_undo(run.state, agent.tools) == ((noop.key,) if left else ())


def test_a_completed_run_leaves_nothing_to_undo() -> None:
    """A completed run keeps its effects (what the guest asked for): a fault after it (a stall) names none."""
    agent = OneStep("completes")
    agent.tools = {UNDOABLE.name: UNDOABLE}
    run = _run(agent)
    state = _drive(run, agent)
    assert state.status == RunStatus.COMPLETED
    fault = AgentFault(agent=agent.name, hook="code", problem="held the loop")
    assert agent_failed(state, agent, fault, run.tick()) == Idle(fault=fault.message)


def test_the_runtime_says_it_as_an_error_only_when_something_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shell = SimpleNamespace(logger=logging.getLogger("test.fault_undo_left"))
    agent = FaultsAtTheEnd("faults_nothing_to_undo", undoable=False)
    state = _handed_off_after_its_effect(agent)[0].state
    with caplog.at_level(logging.INFO, logger=shell.logger.name):
        DriveLoop._report_fault(shell, state, "agent x's compensations raised", ())  # type: ignore[arg-type]
        DriveLoop._report_fault(shell, state, "agent x's compensations raised", ("hold:1",))  # type: ignore[arg-type]
        DriveLoop._report_fault(shell, state, "", ())  # type: ignore[arg-type]
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (logging.WARNING, "agent fault in an ended run; it left nothing to undo"),
        (
            logging.ERROR,
            "agent fault in an ended run: what it should still undo is not planned; a person must check",
        ),
    ]
    assert caplog.records[1].fields["undo_left"] == "hold:1"  # type: ignore[attr-defined]
