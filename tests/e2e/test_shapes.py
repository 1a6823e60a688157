"""The shapes production runs, as a test dimension (issue 31, "a configuration matrix, not one shape"): the
properties that must hold in every shape, said once and run across a matrix of partitions, replicas and agents.

In every shape: every accepted run ends (completed, or handed off naming its agent's fault), within a bound that
does not grow with the shape; nothing is dead-lettered; each step is requested and its receipt journaled exactly
once; and every service process the stack started is still up (no crash loop). The breaks of issue 31 each hid in
a shape the suite did not run: more than 8 partitions, a hook that blocks, replicas. CI runs the small matrix;
`just shapes` (CRASHSAFE_SHAPES=full) runs the whole one: partitions 4, 16 and 64, one or three replicas of the
runtime and the executor, and agents well behaved, raising, answering nonsense, blocking and looping."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from tests.support.broker import dead_letters
from tests.support.misbehaving import MISBEHAVING, NEVER_RETURN, REGISTRY
from tests.support.stack import StackClient

WELL = "well_behaved"
RAISING = ("raises_in_prepare", "raises_in_script", "raises_in_compensations")
NONSENSE = ("prepares_a_list", "scripts_a_dict", "undoes_again")
NEVER = tuple(sorted(NEVER_RETURN))


@dataclass(frozen=True)
class Shape:
    partitions: int
    replicas: int
    agents: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.partitions}p-{self.replicas}r-{len(self.agents)}agents"


SMALL = [
    Shape(4, 1, (WELL, *RAISING, *NEVER)),
    Shape(64, 2, (WELL, *NONSENSE, *NEVER)),
]
FULL = [
    Shape(partitions, replicas, agents)
    for partitions, replicas, agents in itertools.product(
        (4, 16, 64), (1, 3), ((WELL,), (WELL, *RAISING, *NONSENSE), (WELL, *NEVER))
    )
]
SHAPES = FULL if os.environ.get("CRASHSAFE_SHAPES") == "full" else SMALL
RUNS_PER_AGENT = 6
# A noop run ends in about 0.1 s alone; a never-returning hook costs the hook limit (0.3 s here) once per run.
ENDS_WITHIN_S = 30.0


@pytest.mark.parametrize("shape", SHAPES, ids=str)
async def test_in_every_shape_every_run_ends_once_and_nothing_is_lost(
    start_stack: Callable[..., Awaitable[StackClient]],
    broker: Broker,
    namespace: Namespace,
    shape: Shape,
) -> None:
    client = await start_stack(
        executors=("noop",),
        runtimes=shape.replicas,
        scale={"executor-noop": shape.replicas},
        reconciler=False,
        projector=False,
        registry=REGISTRY,
        env={"CRASHSAFE_ACTION_PARTITIONS": str(shape.partitions), "CRASHSAFE_HOOK_LIMIT_S": "0.3"},
    )
    started = time.monotonic()
    runs: dict[str, str] = {}
    for agent in shape.agents:
        for _ in range(RUNS_PER_AGENT):
            run_id, _ = await client.start_run(agent=agent)
            runs[run_id] = agent
    ends = await asyncio.gather(*(client.wait_terminal(run_id, timeout_s=ENDS_WITHIN_S) for run_id in runs))
    took = time.monotonic() - started
    faulty = MISBEHAVING | NEVER_RETURN
    for (run_id, agent), end in zip(runs.items(), ends, strict=True):
        if agent == WELL:
            assert end["status"] == "completed", (shape, agent, end)
        else:
            assert (end["status"], end["handoff_reason"]) == ("handed_off", "agent_fault"), (
                shape,
                agent,
                end,
            )
            (handed,) = [e for e in await client.events(run_id) if e["type"] == "run.handed_off"]
            assert f"agent {agent}'s {faulty[agent][1]} " in handed["detail"], (shape, handed["detail"])
        events = await client.events(run_id)
        requested = Counter(e["key"] for e in events if e["type"] == "run.action_requested")
        completed = Counter(e["key"] for e in events if e["type"] == "run.action_completed")
        assert all(n == 1 for n in requested.values()), (shape, agent, requested)
        assert all(n == 1 for n in completed.values()), (shape, agent, completed)
        assert set(completed) <= set(requested), (shape, agent, completed, requested)
    assert await dead_letters(broker, namespace) == [], shape
    assert client.stack.dead() == [], shape
    print(f"{shape}: {len(runs)} runs ended in {took:.1f} s")
