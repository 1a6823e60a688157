"""SIGKILL the stack's own nats-server mid-run: its supervisor restarts it on the same port and file store, and
no accepted run is lost, no effect doubled; a run submitted afterwards completes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.support.stack import open_stack, supervised
from tests.support.waiting import eventually
from tests.support.world import effects_per_run


async def test_nats_server_killed_mid_run_is_restarted_by_the_supervisor(tmp_path: Path) -> None:
    # nats_url=None: the stack's own embedded nats-server, which this test may kill.
    async with open_stack(tmp_path / "stack", nats_url=None, env={"CRASHSAFE_ACK_WAIT_S": "1"}) as client:
        stack = client.stack
        assert stack.nats is not None
        url, first = stack.nats_url, stack.nats.process
        async with supervised(stack):
            guests = [f"guest-{i}" for i in range(6)] + ["guest-after"]
            run_ids = await asyncio.gather(*(client.submit(guest_id=g) for g in guests[:6]))

            # Let the runs get going, then take the broker down hard while they are mid-flight.
            async def first_run_under_way() -> bool:
                try:
                    return len(await client.events(run_ids[0])) >= 3
                except httpx.HTTPStatusError:  # not journaled yet
                    return False

            await eventually(first_run_under_way, what="the first run to get going", every_s=0.02)
            stack.nats.kill()  # nothing here starts it again: the supervisor must
            await eventually(
                lambda: stack.nats is not None and stack.nats.process is not first and stack.nats_url == url,
                what="the supervisor to restart nats-server on its port",
                timeout_s=30,
            )
            assert stack.nats_supervision.restarts == 1
            run_ids.append(await client.submit(guest_id="guest-after"))
            summaries = await asyncio.gather(
                *(client.wait_terminal(run_id, timeout_s=120) for run_id in run_ids)
            )
            effects = effects_per_run(
                (await client.ledger())["entries"], dict(zip(guests, run_ids, strict=True))
            )

    assert [s["status"] for s in summaries] == ["completed"] * len(run_ids), summaries
    for run_id in run_ids:
        assert effects[run_id].get("booking") == 1 and effects[run_id].get("charge") == 1, (
            run_id,
            effects[run_id],
        )
