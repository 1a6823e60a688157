"""SIGKILL the nats-server itself mid-run and restart it on its file store: no accepted run lost, no double effect."""

from __future__ import annotations

import asyncio

from crashsafe.stack import Stack
from tests.flows import effects_per_run, journal, ledger, submit, wait_terminal


async def test_nats_server_killed_mid_run(tmp_path) -> None:
    stack = Stack(
        tmp_path / "stack", env={"CRASHSAFE_ACK_WAIT_S": "1"}
    ).start()  # embedded nats-server we may kill
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    try:
        run_ids = await asyncio.gather(*(submit(stack, guest=f"guest-{i}") for i in range(6)))
        # Let the runs get going, then take the broker down hard while they are mid-flight.
        for _ in range(200):
            events = await journal(stack, run_ids[0])
            if len(events) >= 3:
                break
            await asyncio.sleep(0.02)
        assert stack.nats is not None
        stack.nats.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(stack.nats.start)
        summaries = await asyncio.gather(
            *(wait_terminal(stack, run_id, deadline_s=120) for run_id in run_ids)
        )
        effects = effects_per_run((await ledger(stack))["entries"])
    finally:
        stop.set()
        await supervisor
        stack.stop()

    assert [s["status"] for s in summaries] == ["completed"] * len(run_ids), summaries
    for run_id in run_ids:
        assert effects[run_id].get("booking") == 1 and effects[run_id].get("charge") == 1, (
            run_id,
            effects[run_id],
        )
