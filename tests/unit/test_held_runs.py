"""What a runtime worker keeps of a run once its handlers leave: an ended run goes, one handed off with requests
still out stays (its published requests are remembered), and no lock outlives its last handler."""

from __future__ import annotations

import asyncio

from crashsafe.contracts.run_events import ActionRequested, RunHandedOff
from crashsafe.services.runtime.held_runs import HeldRun, HeldRuns, sent
from tests.support.runs import RUN, SEARCH, Run, started


def _mid_step() -> tuple[Run, ActionRequested]:
    run = Run(started(text="Book a room in Lisbon"))
    run.answer(SEARCH, tokens=(100, 20))
    (requested,) = run.decide()
    assert isinstance(requested, ActionRequested)
    return run, requested


def _handed_off(run: Run) -> None:
    run.add(RunHandedOff(run_id=RUN, at=run.tick(), reason="deadline", reply="A colleague will take over."))


async def test_a_run_that_ended_with_nothing_out_is_let_go_when_its_last_handler_leaves() -> None:
    held = HeldRuns()
    run, requested = _mid_step()
    held.remember(HeldRun(state=run.state, seq=3, published={sent(requested)}))
    ends, second_leaves = asyncio.Event(), asyncio.Event()

    async def ending() -> None:
        async with held.lock(RUN):
            await ends.wait()
            run.complete(2)
            _handed_off(run)
            held.remember(HeldRun(state=run.state, seq=6))

    async def waiting() -> None:
        async with held.lock(RUN):
            await second_leaves.wait()

    first = asyncio.create_task(ending())
    second = asyncio.create_task(waiting())
    await asyncio.sleep(0)
    assert held.locks == 1
    ends.set()
    await first
    # The first handler left and the second holds the lock now: the ended run stays until it leaves too.
    assert RUN in held and held.locks == 1
    second_leaves.set()
    await second
    assert RUN not in held and held.locks == 0 and len(held) == 0


async def test_a_run_handed_off_with_a_request_out_stays_held_with_what_it_published() -> None:
    held = HeldRuns()
    run, requested = _mid_step()
    _handed_off(run)
    assert run.state.terminal and run.state.pending == (requested,)
    held.remember(HeldRun(state=run.state, seq=4, published={sent(requested)}))

    async with held.lock(RUN):
        pass

    # A late receipt finds the run as it left it: the request is known as published, not read cold and sent again.
    kept = held.get(RUN)
    assert kept is not None and kept.published == {sent(requested)}
    assert held.locks == 0


async def test_a_running_run_stays_held_and_its_lock_goes_with_its_last_handler() -> None:
    held = HeldRuns()
    run, requested = _mid_step()
    held.remember(HeldRun(state=run.state, seq=3, published={sent(requested)}))
    for _ in range(3):
        async with held.lock(RUN):
            assert held.locks == 1
    assert RUN in held and held.locks == 0


async def test_handlers_of_one_run_take_its_lock_one_at_a_time_in_the_order_they_asked() -> None:
    held = HeldRuns()
    order: list[int] = []
    inside = 0

    async def handler(n: int) -> None:
        nonlocal inside
        async with held.lock(RUN):
            inside += 1
            assert inside == 1
            await asyncio.sleep(0)
            order.append(n)
            inside -= 1

    await asyncio.gather(*(handler(n) for n in range(5)))
    assert order == [0, 1, 2, 3, 4] and held.locks == 0
