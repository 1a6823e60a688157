"""Kill a real process with SIGKILL at every named seam: one booking, one charge, run ended, resume in the journal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from crashsafe.demo import service_for_seam
from tests.support.journals import decision_steps, step, trail
from tests.support.stack import StackClient, supervised
from tests.support.waiting import eventually
from tests.support.world import projected

FAST = {"CRASHSAFE_ACK_WAIT_S": "1"}

# seam -> what in the journal proves the run resumed past the kill.
SEAMS = {
    "executor.after_intent": "payment_retried_after_lookup",
    "executor.after_provider_ack": "payment_recovered_by_lookup",
    "executor.after_receipt": "payment_receipt_republished",
    "executor.after_outcome_published": "payment_once",
    "runtime.after_model_answer": "run_resumed",
    "runtime.after_action_journaled": "run_resumed",
    "runtime.after_outcome_received": "run_resumed",
    "gateway.after_publish": "one_start",
}


@pytest.mark.parametrize("seam", sorted(SEAMS))
async def test_kill_at_seam(start_stack: Callable[..., Awaitable[StackClient]], seam: str) -> None:
    victim = service_for_seam(seam)
    client = await start_stack(crash={victim: seam}, env=FAST)
    stack = client.stack
    async with supervised(stack):
        run_id = await client.submit(guest_id="guest-seam")
        summary = await client.wait_terminal(run_id)
        # A kill after the outcome is published can race the run's end: the supervisor may restart it just after.
        await eventually(
            lambda: stack.services[victim].restarts >= 1,
            what=f"{victim} to be restarted after {seam}",
            timeout_s=30,
        )

    assert summary["status"] == "completed", summary
    assert stack.services[victim].restarts == 1, f"{victim} should have died at {seam} exactly once"
    counts = await client.counts("guest-seam")
    assert counts["booking"] == 1 and counts["charge"] == 1, counts
    assert counts["booking_release"] == 0 and counts["refund"] == 0, counts

    events = await client.events(run_id)
    steps = decision_steps(events)
    assert steps == list(range(1, len(steps) + 1)), f"step numbers must be contiguous and unique: {steps}"
    evidence = SEAMS[seam]
    _, receipt = step(events, "create_payment")  # one payment requested, completed once
    assert receipt is not None, "the payment was never completed"
    payment_trail = trail(receipt)
    if evidence == "payment_recovered_by_lookup":
        assert receipt["via"] == "provider_lookup" and ("provider.lookup", "found") in payment_trail, receipt
    elif evidence == "payment_retried_after_lookup":
        assert payment_trail[:2] == [("provider.lookup", "absent"), ("provider.call", "ok")], payment_trail
    elif evidence == "payment_receipt_republished":
        assert ("store.receipt", "republished") in payment_trail or receipt["deliveries"] > 1, receipt
    elif evidence == "run_resumed":
        assert any(e["type"] == "run.resumed" for e in events), [e["type"] for e in events]
    elif evidence == "one_start":
        assert [e["type"] for e in events].count("run.started") == 1


def _reconciler_nudged(events: list[dict[str, Any]]) -> bool:
    return any(e["type"] == "run.nudged" and e["by"].startswith("reconciler") for e in events)


async def test_reconciler_killed_mid_resolution(start_stack: Callable[..., Awaitable[StackClient]]) -> None:
    """The reconciler dies while asking an executor to resolve an overdue key; its restart asks again."""
    client = await start_stack(crash={"reconciler": "reconciler.mid_resolution"}, env=FAST)
    stack = client.stack
    stack.kill("executor-payment")  # the payment step will sit unanswered past its 10 s timeout
    async with supervised(stack):
        stack.services["executor-payment"].stopped = True  # keep it down until the reconciler has died once
        run_id = await client.submit(guest_id="guest-rec")
        await eventually(
            lambda: stack.services["reconciler"].restarts >= 1,
            what="the reconciler to reach its seam and die",
        )
        # Its next life finds the same overdue key, asks again and nudges the run: evidence in the journal.
        await eventually(
            lambda: _reconciler_nudged_now(client, run_id),
            what="the restarted reconciler to nudge the run",
            timeout_s=30,
        )
        stack.restart("executor-payment")
        summary = await client.wait_terminal(run_id)
        # The confirmation email and CRM record follow the paid run (the projector, off its critical path).
        counts = await projected(lambda: client.counts("guest-rec"))
    assert summary["status"] == "completed", summary
    assert counts["booking"] == 1 and counts["charge"] == 1 and counts["email"] == 1, counts
    events = await client.events(run_id)
    assert _reconciler_nudged(events), [e["type"] for e in events]


async def _reconciler_nudged_now(client: StackClient, run_id: str) -> bool:
    return _reconciler_nudged(await client.events(run_id))
