"""The hook limit (issue 31, items 2 and 10): an agent's hook that sleeps or loops is stopped where it stands and
becomes its run's `agent_fault`, naming the hook and the line; SIGALRM is left alone when it is not ours."""

from __future__ import annotations

import signal
import time

import pytest

from crashsafe.contracts.errors import AgentFault
from crashsafe.contracts.run_events import RunHandedOff
from crashsafe.domain.decide import Append, agent_failed, next_move
from crashsafe.services.runtime.hook_limit import HookLimit, HookOverran
from tests.support.misbehaving import NEVER_RETURN, OneStep
from tests.unit.test_agent_faults import _run

pytestmark = pytest.mark.unit


@pytest.fixture
def limit() -> HookLimit:
    # pytest-timeout's own SIGALRM is off for these tests (timeout 0), so the limit may take the signal.
    hooks = HookLimit(0.3)
    assert hooks.install(), "the tests run on the main thread, with SIGALRM free"
    yield hooks
    hooks.uninstall()


@pytest.mark.timeout(0)
@pytest.mark.parametrize("name", sorted(NEVER_RETURN))
def test_a_hook_that_never_returns_is_stopped_and_named(limit: HookLimit, name: str) -> None:
    kind, hook = NEVER_RETURN[name]
    agent = kind(name)
    run = _run(agent)
    started = time.monotonic()
    with pytest.raises(HookOverran) as stopped:
        limit.run(next_move, run.state, agent, run.tick())
    assert 0.3 <= time.monotonic() - started < 2.0
    assert stopped.value.hook_of(agent) == hook
    assert stopped.value.where.startswith("tests.support.misbehaving:") and stopped.value.where.endswith(hook)
    fault = AgentFault(agent=name, hook=stopped.value.hook_of(agent), problem=str(stopped.value))
    move = agent_failed(run.state, agent, fault, run.tick())
    assert isinstance(move, Append)
    (handed,) = move.events
    assert isinstance(handed, RunHandedOff) and handed.reason == "agent_fault"
    assert f"agent {name}'s script ran past 0.3 s without returning" in handed.detail, handed.detail


@pytest.mark.timeout(0)
def test_a_hook_that_swallows_the_exception_is_stopped_again(limit: HookLimit) -> None:
    swallowed: list[str] = []

    def stubborn() -> None:
        for _ in range(3):
            try:
                time.sleep(60)
            except HookOverran:
                swallowed.append("once more")
        time.sleep(60)

    with pytest.raises(HookOverran):
        limit.run(stubborn)
    assert len(swallowed) == 3


@pytest.mark.timeout(0)
def test_a_hook_that_returns_in_time_leaves_no_timer_behind(limit: HookLimit) -> None:
    agent = OneStep("well_behaved")
    run = _run(agent)
    now = run.tick()
    assert limit.run(next_move, run.state, agent, now) == next_move(run.state, agent, now)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    time.sleep(0.5)  # past the limit: no alarm arrives late


def test_the_signal_is_left_to_whoever_owns_it() -> None:
    # Under pytest-timeout (this test keeps its timeout), SIGALRM is the plugin's: the limit stays off, and a hook
    # runs unbounded rather than taking the signal from it.
    hooks = HookLimit(0.1)
    assert not hooks.install()
    assert hooks.run(lambda: time.sleep(0.3) or "ran whole") == "ran whole"
    assert not HookLimit(0).install()  # 0: off
