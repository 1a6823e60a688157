"""Nothing an agent's code does wedges a run or the runtime (issue 17, item 4; issue 31, items 2 and 10): a real
stack running agents that ask again to undo what is undone, raise in a hook, answer one with the wrong type, or never
return from one. Each run is handed off with reason `agent_fault` naming the hook, the runtime's /healthz answers all
along, nothing is dead-lettered; and code out of the hook limit's reach costs one restart and its own run only."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

import httpx

from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.probes import EXIT_STALLED
from tests.support.broker import dead_letters
from tests.support.misbehaving import MISBEHAVING, NEVER_RETURN, REGISTRY
from tests.support.stack import StackClient, supervised
from tests.support.waiting import eventually


class Liveness:
    """Asks a service's /healthz every 0.2 s with Kubernetes' default 1 s timeout; keeps what each answer was."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[int | str] = []
        self._task: asyncio.Task[None] | None = None

    async def _probe(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as http:
            while True:
                try:
                    self.answers.append((await http.get(f"{self.url}/healthz")).status_code)
                except httpx.HTTPError as exc:
                    self.answers.append(type(exc).__name__)
                await asyncio.sleep(0.2)

    def __enter__(self) -> Liveness:
        self._task = asyncio.get_running_loop().create_task(self._probe())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    @property
    def failures(self) -> list[int | str]:
        return [a for a in self.answers if a != 200]


async def test_every_misbehaving_agent_hands_its_run_off_and_the_runtime_stays_live(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker, namespace: Namespace
) -> None:
    # Issue 31, items 2 and 10: a hook that sleeps or loops forever is stopped by the hook limit, its run handed
    # off like any other fault, and the runtime answers /healthz throughout (the limit is short here: Kubernetes'
    # probe waits 1 s). Before: the loop stalled until the watchdog ended the process, for every tenant.
    client = await start_stack(
        executors=("noop",),
        reconciler=False,
        projector=False,
        registry=REGISTRY,
        env={"CRASHSAFE_HOOK_LIMIT_S": "0.3"},
    )
    ops = client.stack.ops_url("runtime")
    assert ops is not None
    faulty = MISBEHAVING | NEVER_RETURN
    with Liveness(ops) as liveness:
        runs = {agent: (await client.start_run(agent=agent))[0] for agent in [*faulty, "well_behaved"]}
        summaries = {agent: await client.wait_terminal(run_id) for agent, run_id in runs.items()}
        await asyncio.sleep(1.0)  # the runtime stays live after them too (before the fix: wedged for good)
    assert summaries.pop("well_behaved")["status"] == "completed"
    for agent, summary in summaries.items():
        assert (summary["status"], summary["handoff_reason"]) == ("handed_off", "agent_fault"), (
            agent,
            summary,
        )
        events = await client.events(runs[agent])
        (handed,) = [e for e in events if e["type"] == "run.handed_off"]
        hook = faulty[agent][1]
        assert f"agent {agent}'s {hook} " in handed["detail"], (agent, handed["detail"])
    # The one that undid its step and asked to undo it again: the undo ran once, then the hand-off.
    undo = [e for e in await client.events(runs["undoes_again"]) if e["type"] == "run.action_requested"]
    assert [e["tool"] for e in undo] == ["noop", "undo_noop"]
    assert len(liveness.answers) >= 5 and liveness.failures == [], liveness.answers
    assert client.stack.dead() == []
    assert await dead_letters(broker, namespace) == []


async def test_a_hook_out_of_the_limits_reach_costs_one_restart_and_its_own_run_only(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker, namespace: Namespace
) -> None:
    """Issue 31, item 2: an agent whose hook holds the loop and swallows what the hook limit raises into it (as code
    stuck inside C would). The watchdog fails liveness and ends the process (exit 70), marking the run it was
    deciding; the restarted runtime hands that run off without running its agent again, so the runtime goes down
    once, not once per delivery, and every other guest's run in hand at the stall ends, none dead-lettered.
    Before: 8 exits in 60 s, others' runs p50 15.5 s, and another guest's message dead-lettered after 21
    deliveries."""
    client = await start_stack(
        executors=("noop",),
        reconciler=False,
        projector=False,
        registry=REGISTRY,
        env={"CRASHSAFE_LOOP_STALL_S": "3", "CRASHSAFE_HOOK_LIMIT_S": "0.5"},
    )
    stack = client.stack
    ops = stack.ops_url("runtime")
    assert ops is not None
    first = stack.services["runtime"].process
    assert first is not None
    async with supervised(stack):
        with Liveness(ops) as liveness:
            poison, _ = await client.start_run(agent="swallows_the_limit")
            others = [(await client.start_run(agent="well_behaved"))[0] for _ in range(12)]
            await eventually(
                lambda: first.poll() is not None, what="the wedged runtime to exit", timeout_s=60
            )
            ends = [await client.wait_terminal(run_id, timeout_s=60) for run_id in others]
            handed = await client.wait_terminal(poison, timeout_s=60)
            await asyncio.sleep(2.0)  # the restarted runtime stays up: the poison run is not driven again
        restarted = stack.services["runtime"].process
    assert first.returncode == EXIT_STALLED, first.returncode
    assert any(a != 200 for a in liveness.answers), liveness.answers
    assert restarted is not None and restarted.pid != first.pid and restarted.poll() is None
    log = (stack.logs_dir / "runtime.log").read_text()
    assert log.count("event loop has not turned") == 1, log[-3000:]
    assert "time.sleep(3600)" in log and f"run {poison} marked as stalled" in log, log[-3000:]
    assert [e["status"] for e in ends] == ["completed"] * len(others), ends
    assert (handed["status"], handed["handoff_reason"]) == ("handed_off", "agent_fault"), handed
    (event,) = [e for e in await client.events(poison) if e["type"] == "run.handed_off"]
    assert "held runtime" in event["detail"] and "watchdog ended the process" in event["detail"], event
    assert await dead_letters(broker, namespace) == []


async def test_a_runtime_paused_whole_is_not_taken_for_a_stalled_loop_when_it_resumes(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    """SIGSTOP stops the watchdog's thread with the loop: resumed, the process lives on (only time the watchdog saw
    pass counts), and runs go through it."""
    client = await start_stack(
        executors=("noop",),
        reconciler=False,
        projector=False,
        registry=REGISTRY,
        env={"CRASHSAFE_LOOP_STALL_S": "2"},
    )
    stack = client.stack
    ops = stack.ops_url("runtime")
    process = stack.services["runtime"].process
    assert ops is not None and process is not None
    os.kill(process.pid, signal.SIGSTOP)
    await asyncio.sleep(5)  # over twice the stall limit
    os.kill(process.pid, signal.SIGCONT)
    await asyncio.sleep(3)
    assert process.poll() is None, process.returncode
    async with httpx.AsyncClient(timeout=1.0) as http:
        assert (await http.get(f"{ops}/healthz")).status_code == 200
    run_id, _ = await client.start_run(agent="well_behaved")
    assert (await client.wait_terminal(run_id))["status"] == "completed"
