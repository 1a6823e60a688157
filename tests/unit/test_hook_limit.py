"""The hook limit (issue 31, items 2 and 10): an agent's hook that sleeps or loops is stopped where it stands and
becomes its run's `agent_fault`, naming the hook and the line; a Python operation's client that holds the loop
between two awaits is stopped and its answer is unknown; SIGALRM is left alone when it is not ours."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from crashsafe.contracts.errors import AgentFault
from crashsafe.contracts.run_events import RunHandedOff
from crashsafe.contracts.tool_messages import Answer
from crashsafe.domain.decide import Append, agent_failed, next_move
from crashsafe.domain.registry import ProviderAnswer
from crashsafe.services.platform.hook_limit import HookLimit, HookOverran
from crashsafe.services.providers import python_calls
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


# A Python operation's client between two awaits (the executor's limit) ----------------------------------------


@pytest.mark.timeout(0)
async def test_awaits_are_never_limited_only_the_code_between_them(limit: HookLimit) -> None:
    async def slow_provider() -> str:
        for _ in range(3):
            await asyncio.sleep(0.2)  # 0.6 s in all, past the 0.3 s limit: waiting is not holding the loop
        return "answered"

    assert await limit.sliced(slow_provider()) == "answered"


@pytest.mark.timeout(0)
async def test_a_client_that_holds_the_loop_is_stopped_and_its_answer_is_unknown(limit: HookLimit) -> None:
    async def hangs() -> ProviderAnswer:
        await asyncio.sleep(0)
        time.sleep(60)  # a synchronous SDK call that hangs
        return ProviderAnswer(Answer.OK, {})

    others = asyncio.create_task(asyncio.sleep(0.05, result="the loop turned"))
    started = time.monotonic()
    answer = await python_calls.asked("charge's call", hangs, python_calls.CALL_ANSWERS, 30.0, limit)
    assert time.monotonic() - started < 2.0
    assert (
        answer.kind == Answer.UNKNOWN and "charge's call held the event loop: ran past 0.3 s" in answer.detail
    )
    assert "in hangs" in answer.detail, answer.detail
    assert await others == "the loop turned"


@pytest.mark.timeout(0)
async def test_a_cancellation_reaches_the_client_it_was_for(limit: HookLimit) -> None:
    reached: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            reached.append("cancelled")
            raise

    task = asyncio.create_task(limit.sliced(waits()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reached == ["cancelled"]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
