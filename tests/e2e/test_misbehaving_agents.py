"""Nothing an agent's code returns wedges a run or the runtime (issue 17, item 4): a real stack running agents that
ask again to undo what is undone, raise in a hook, or answer one with the wrong type. Each run is handed off with
reason `agent_fault` naming the hook, the runtime's /healthz answers all along, nothing is dead-lettered; and a
runtime whose event loop is held by code that never awaits fails /healthz and exits, to be restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

import httpx

from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.probes import EXIT_STALLED
from tests.support.broker import dead_letters
from tests.support.misbehaving import MISBEHAVING, REGISTRY
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
    client = await start_stack(executors=("noop",), reconciler=False, projector=False, registry=REGISTRY)
    ops = client.stack.ops_url("runtime")
    assert ops is not None
    with Liveness(ops) as liveness:
        runs = {agent: (await client.start_run(agent=agent))[0] for agent in [*MISBEHAVING, "well_behaved"]}
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
        hook = MISBEHAVING[agent][1]
        assert f"agent {agent}'s {hook} " in handed["detail"], (agent, handed["detail"])
    # The one that undid its step and asked to undo it again: the undo ran once, then the hand-off.
    undo = [e for e in await client.events(runs["undoes_again"]) if e["type"] == "run.action_requested"]
    assert [e["tool"] for e in undo] == ["noop", "undo_noop"]
    assert len(liveness.answers) >= 5 and liveness.failures == [], liveness.answers
    assert client.stack.dead() == []
    assert await dead_letters(broker, namespace) == []


async def test_a_runtime_whose_event_loop_stops_turning_fails_liveness_and_exits_to_be_restarted(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(
        executors=("noop",),
        reconciler=False,
        projector=False,
        registry=REGISTRY,
        env={"CRASHSAFE_LOOP_STALL_S": "3"},
    )
    stack = client.stack
    ops = stack.ops_url("runtime")
    assert ops is not None
    async with httpx.AsyncClient(timeout=1.0) as http:
        assert (await http.get(f"{ops}/healthz")).status_code == 200
    process = stack.services["runtime"].process
    assert process is not None
    with Liveness(ops) as liveness:
        await client.submit(agent="blocks_the_loop")
        started = time.monotonic()
        # The loop is held (the agent's code sleeps without awaiting): the probe gets no answer, then the process
        # ends itself with the watchdog's code.
        await eventually(lambda: process.poll() is not None, what="the wedged runtime to exit", timeout_s=60)
        exited_after = time.monotonic() - started
    assert process.returncode == EXIT_STALLED, process.returncode
    assert exited_after < 30, exited_after
    assert any(a != 200 for a in liveness.answers), liveness.answers
    log = (stack.logs_dir / "runtime.log").read_text()
    assert "event loop has not turned" in log and "time.sleep(3600)" in log, log[-2000:]
    # The supervisor (as Kubernetes would) starts it again: a fresh process answers /healthz.
    async with supervised(stack):
        await eventually(
            lambda: stack.services["runtime"].process is not process,
            what="the runtime restarted",
            timeout_s=30,
        )
        restarted = stack.services["runtime"].process
        assert restarted is not None and restarted.pid != process.pid


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
