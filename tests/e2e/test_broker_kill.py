"""SIGKILL the nats-server itself mid-run and restart it on its file store: no accepted run lost, no double effect."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.support.stack import open_stack, supervised
from tests.support.waiting import eventually
from tests.support.world import effects_per_run


async def test_nats_server_killed_mid_run(tmp_path: Path) -> None:
    # nats_url=None: the stack's own embedded nats-server, which this test may kill.
    async with open_stack(tmp_path / "stack", nats_url=None, env={"CRASHSAFE_ACK_WAIT_S": "1"}) as client:
        stack = client.stack
        async with supervised(stack):
            run_ids = await asyncio.gather(*(client.submit(guest_id=f"guest-{i}") for i in range(6)))

            # Let the runs get going, then take the broker down hard while they are mid-flight.
            async def first_run_under_way() -> bool:
                try:
                    return len(await client.events(run_ids[0])) >= 3
                except httpx.HTTPStatusError:  # not journaled yet
                    return False

            await eventually(first_run_under_way, what="the first run to get going", every_s=0.02)
            assert stack.nats is not None
            stack.nats.kill()
            await asyncio.sleep(0.5)  # the outage itself: half a second with no broker at all
            await asyncio.to_thread(stack.nats.start)
            summaries = await asyncio.gather(
                *(client.wait_terminal(run_id, timeout_s=120) for run_id in run_ids)
            )
            effects = effects_per_run((await client.ledger())["entries"])

    assert [s["status"] for s in summaries] == ["completed"] * len(run_ids), summaries
    for run_id in run_ids:
        assert effects[run_id].get("booking") == 1 and effects[run_id].get("charge") == 1, (
            run_id,
            effects[run_id],
        )
