"""Kill a real process with SIGKILL at every named seam: one booking, one charge, run ended, resume in the journal."""

from __future__ import annotations

import asyncio

import pytest

from crashsafe.demo import service_for_seam
from crashsafe.stack import Stack
from tests.flows import journal, ledger, submit, wait_terminal

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


def _payment_receipt(events: list[dict]) -> dict:
    steps = {
        e["step_no"]: e
        for e in events
        if e["type"] == "run.action_requested" and e["tool"] == "create_payment"
    }
    receipts = [e for e in events if e["type"] == "run.action_completed" and e["step_no"] in steps]
    assert len(receipts) == 1, receipts
    return receipts[0]


@pytest.mark.parametrize("seam", sorted(SEAMS))
async def test_kill_at_seam(make_stack, seam: str) -> None:
    victim = service_for_seam(seam)
    stack: Stack = make_stack(crash={victim: seam}, env=FAST)
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    try:
        run_id = await submit(stack, guest="guest-seam")
        summary = await wait_terminal(stack, run_id)
    finally:
        stop.set()
        await supervisor

    assert summary["status"] == "completed", summary
    assert stack.services[victim].restarts == 1, f"{victim} should have died at {seam} exactly once"
    counts = (await ledger(stack, "guest-seam"))["counts"]
    assert counts["booking"] == 1 and counts["charge"] == 1, counts
    assert counts["booking_release"] == 0 and counts["refund"] == 0, counts

    events = await journal(stack, run_id)
    steps = [
        e["step_no"]
        for e in events
        if e["type"] in ("run.model_answered", "run.action_requested", "run.tool_rejected")
    ]
    assert steps == list(range(1, len(steps) + 1)), f"step numbers must be contiguous and unique: {steps}"
    evidence = SEAMS[seam]
    receipt = _payment_receipt(events)
    trail = [(e["asked"], e["answer"]) for e in receipt.get("evidence", [])]
    if evidence == "payment_recovered_by_lookup":
        assert receipt["via"] == "provider_lookup" and ("provider.lookup", "found") in trail, receipt
    elif evidence == "payment_retried_after_lookup":
        assert trail[:2] == [("provider.lookup", "absent"), ("provider.call", "ok")], trail
    elif evidence == "payment_receipt_republished":
        assert ("store.receipt", "republished") in trail or receipt["deliveries"] > 1, receipt
    elif evidence == "run_resumed":
        assert any(e["type"] == "run.resumed" for e in events), [e["type"] for e in events]
    elif evidence == "one_start":
        assert [e["type"] for e in events].count("run.started") == 1


async def test_reconciler_killed_mid_resolution(make_stack) -> None:
    """The reconciler dies while asking an executor to resolve an overdue key; its restart asks again."""
    stack: Stack = make_stack(crash={"reconciler": "reconciler.mid_resolution"}, env=FAST)
    stack.kill("executor-notify")  # the email step will sit unanswered past its 3 s timeout
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    try:
        stack.services["executor-notify"].stopped = True  # keep it down until the reconciler has died once
        run_id = await submit(stack, guest="guest-rec")
        for _ in range(600):
            if stack.services["reconciler"].restarts >= 1:
                break
            await asyncio.sleep(0.1)
        assert stack.services["reconciler"].restarts >= 1, "the reconciler never reached its seam"
        # Its next life finds the same overdue key, asks again and nudges the run: evidence in the journal.
        for _ in range(300):
            if any(
                e["type"] == "run.nudged" and e["by"].startswith("reconciler")
                for e in await journal(stack, run_id)
            ):
                break
            await asyncio.sleep(0.1)
        stack.restart("executor-notify")
        summary = await wait_terminal(stack, run_id)
    finally:
        stop.set()
        await supervisor
    assert summary["status"] == "completed", summary
    counts = (await ledger(stack, "guest-rec"))["counts"]
    assert counts["booking"] == 1 and counts["charge"] == 1 and counts["email"] == 1, counts
    events = await journal(stack, run_id)
    assert any(e["type"] == "run.nudged" and e["by"].startswith("reconciler") for e in events), [
        e["type"] for e in events
    ]
