"""The projection boundary on the whole stack of real processes, through the gateway's HTTP (seed 002): the
confirmation email and the CRM record are delivered off the run's critical path, once each, whatever happens to
the receiver or the projector.

(a) the email provider down for "25 minutes" (x the projection time scale): every run completes and is paid once
    while the emails wait; once the provider is back each paid booking has exactly one email and one CRM record;
(b) the projector SIGKILLed after the provider accepted a delivery, before its receipt: the product restarts it,
    the task is delivered again under the same key, the receiver deduplicates it: one email;
(c) the tasks lost (the projector down, the PROJECTIONS stream purged by an operator): the reconciler re-plans
    them from the journals and each is delivered once;
(d) one of two projector replicas SIGSTOPped past its ack wait: the other delivers; resumed, no duplicate.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from crashsafe.contracts.projections import ProjectionRecord, ProjectionStatus, record_decoder
from crashsafe.contracts.streams import projections_spec
from crashsafe.contracts.subjects import StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.stack import Stack
from tests.support.stack import StackClient, cli_env, crashsafe, operator_access, supervised
from tests.support.waiting import eventually, unique

SCALE = 0.01
# The seed's outage, in the stack's time: 25 minutes x the projection time scale (15 s at 0.01).
OUTAGE_S = 25 * 60 * SCALE
FAST = {"CRASHSAFE_ACK_WAIT_S": "1", "CRASHSAFE_PROJECTION_TIME_SCALE": str(SCALE)}
PROJECTED = ("email", "crm_update")  # the ledger's kinds for the two booking projections
# More than the sandbox ever answers in a run of these tests: the provider is down until the switch is cleared.
DOWN = 1_000_000


async def _operator(client: StackClient) -> Broker:
    stack = client.stack
    return await Broker.connect(stack.nats_url, "tests-projections", access=operator_access(stack))


async def _receipts(broker: Broker, client: StackClient) -> list[ProjectionRecord]:
    entries = await broker.kv_scan(projections_spec(client.ns), "projection.>")
    return [record_decoder.decode(e.value) for e in entries]


async def _book(client: StackClient, guests: int) -> dict[str, str]:
    """Several guests book at once; guest id -> run id."""
    ids = [unique("g") for _ in range(guests)]
    runs = await asyncio.gather(*(client.submit(guest_id=g) for g in ids))
    return dict(zip(ids, runs, strict=True))


async def _each_completed_and_paid_once(client: StackClient, runs: dict[str, str]) -> None:
    summaries = await asyncio.gather(*(client.wait_terminal(r) for r in runs.values()))
    assert all(s["status"] == "completed" for s in summaries), summaries
    for guest in runs:
        counts = await client.counts(guest)
        assert (counts["booking"], counts["charge"]) == (1, 1), (guest, counts)
        assert (counts["booking_release"], counts["refund"]) == (0, 0), (guest, counts)


async def _projected_once(client: StackClient, runs: dict[str, str], timeout_s: float = 90.0) -> None:
    """Each paid booking ends with exactly one email and one CRM record (never two, however they got there)."""

    async def delivered() -> bool:
        for guest in runs:
            counts = await client.counts(guest)
            assert all(counts[k] <= 1 for k in PROJECTED), (guest, counts)  # never a second one
            if any(counts[k] != 1 for k in PROJECTED):
                return False
        return True

    await eventually(delivered, what="one email and one CRM record per paid booking", timeout_s=timeout_s)


async def _all_delivered(broker: Broker, client: StackClient, runs: dict[str, str]) -> list[ProjectionRecord]:
    """Every projection receipt of these runs delivered (none pending, none dead), once they all have one."""
    wanted = set(runs.values())

    async def settled() -> list[ProjectionRecord] | None:
        mine = [r for r in await _receipts(broker, client) if r.run_id in wanted]
        tools = {(r.run_id, r.tool) for r in mine}
        complete = all((run, t) in tools for run in wanted for t in ("send_confirmation_email", "update_crm"))
        assert not [r for r in mine if r.status == ProjectionStatus.DEAD], mine
        done = complete and all(r.status == ProjectionStatus.DELIVERED for r in mine)
        return mine if done else None

    return await eventually(settled, what="every projection receipt delivered", timeout_s=90)


async def _quiet(broker: Broker, client: StackClient, tools: tuple[str, ...]) -> None:
    """Every projection consumer has nothing pending and nothing claimed (the replicas are done with it)."""
    stream = client.ns.stream(StreamKind.PROJECTIONS)

    async def idle() -> bool:
        for tool in tools:
            info = await broker.js.consumer_info(stream, client.ns.projection_consumer(tool))
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    await eventually(idle, what="the projection consumers to drain", timeout_s=90)


def _log_lines(stack: Stack, name: str) -> list[dict[str, Any]]:
    path = stack.logs_dir / f"{name}.log"
    lines = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return lines


async def test_a_25_minute_email_outage_completes_every_run_and_then_sends_each_email_once(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(env=FAST)
    broker = await _operator(client)
    try:
        async with supervised(client.stack):
            await client.arm("emails", fail_5xx=DOWN)
            down_at = asyncio.get_running_loop().time()
            runs = await _book(client, guests=4)
            # The reply does not wait for the email: every run ends, paid once, while the provider is down.
            await _each_completed_and_paid_once(client, runs)
            for guest in runs:
                assert (await client.counts(guest))["email"] == 0
            # The emails are being tried meanwhile (the projector's policy), none given up.
            await eventually(
                lambda: _tried_while_down(broker, client, runs),
                what="every email tried at least once during the outage",
                timeout_s=60,
            )
            # The rest of the outage: the scenario's time, not a synchronisation.
            left = OUTAGE_S - (asyncio.get_running_loop().time() - down_at)
            await asyncio.sleep(max(0.0, left))
            assert all(r.status != ProjectionStatus.DEAD for r in await _receipts(broker, client))
            await client.clear_faults()
            await _projected_once(client, runs)
            receipts = await _all_delivered(broker, client, runs)
        emails = [r for r in receipts if r.tool == "send_confirmation_email"]
        assert len(emails) == len(runs) and all(r.attempts > 1 for r in emails), emails
        # What an operator sees: `crashsafe projections list`, in its own process, as the operator user.
        run_id = next(iter(runs.values()))
        listed = await crashsafe("projections", "list", "--run", run_id, env=cli_env(client.stack))
        assert listed.returncode == 0, listed.stderr
        mine = [line for line in listed.stdout.splitlines() if f"run {run_id}" in line]
        assert any("send_confirmation_email" in line and "delivered" in line for line in mine), listed.stdout
        assert not [line for line in mine if " dead " in line or " pending " in line], listed.stdout
        dead = await crashsafe("projections", "list", "--status", "dead", env=cli_env(client.stack))
        assert dead.stdout.strip() == "no projections with that status", dead.stdout
        for guest in runs:  # still one of each, and still one charge
            counts = await client.counts(guest)
            assert (counts["charge"], counts["email"], counts["crm_update"]) == (1, 1, 1), counts
    finally:
        await broker.close()


async def _tried_while_down(broker: Broker, client: StackClient, runs: dict[str, str]) -> bool:
    wanted = set(runs.values())
    emails = [
        r
        for r in await _receipts(broker, client)
        if r.run_id in wanted and r.tool == "send_confirmation_email"
    ]
    return len(emails) == len(wanted) and all(
        r.status == ProjectionStatus.PENDING and r.attempts >= 1 for r in emails
    )


async def test_the_projector_killed_after_the_provider_call_is_restarted_and_the_email_sent_once(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(crash={"projector": "projector.after_provider_call"}, env=FAST)
    stack = client.stack
    broker = await _operator(client)
    try:
        async with supervised(stack):
            runs = await _book(client, guests=1)
            await _each_completed_and_paid_once(client, runs)
            await eventually(
                lambda: stack.services["projector"].restarts >= 1,
                what="the projector to die at projector.after_provider_call and be restarted",
                timeout_s=60,
            )
            await _projected_once(client, runs)
            await _all_delivered(broker, client, runs)
        assert stack.services["projector"].restarts == 1
        (guest,) = runs
        counts = await client.counts(guest)
        # The delivery the kill interrupted was made again under the same key: the receiver holds one of each.
        assert (counts["charge"], counts["email"], counts["crm_update"]) == (1, 1, 1), counts
        crashed = [
            line for line in _stderr(stack, "projector") if "crashpoint projector.after_provider_call" in line
        ]
        assert len(crashed) == 1, crashed
    finally:
        await broker.close()


def _stderr(stack: Stack, name: str) -> list[str]:
    path = stack.logs_dir / f"{name}.log"
    return path.read_text().splitlines() if path.exists() else []


async def test_lost_projection_tasks_are_put_back_by_the_reconciler_and_delivered_once(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack(env=FAST)
    stack = client.stack
    broker = await _operator(client)
    try:
        async with supervised(stack):
            # Both receivers down: the tasks are planned and pending in the projector when it goes.
            await client.arm("emails", fail_5xx=DOWN)
            await client.arm("crm", fail_5xx=DOWN)
            runs = await _book(client, guests=3)
            await _each_completed_and_paid_once(client, runs)
            await eventually(
                lambda: _planned(broker, client, runs),
                what="the projector to have planned every run's email and CRM record",
                timeout_s=60,
            )
            stack.services["projector"].stopped = True  # an operator takes it down ...
            stack.kill("projector")
            # ... and, cleaning up, purges the projection tasks: nothing in NATS holds them any more.
            await broker.js.purge_stream(client.ns.stream(StreamKind.PROJECTIONS))
            await client.clear_faults()
            await asyncio.to_thread(stack.restart, "projector")  # spawn clears `stopped`
            await _projected_once(client, runs, timeout_s=120)
            await _all_delivered(broker, client, runs)
            put_back = {
                line.get("run_id")
                for line in _log_lines(stack, "reconciler")
                if line.get("msg") == "projections published again"
            }
        assert set(runs.values()) <= put_back, put_back
        for guest in runs:
            counts = await client.counts(guest)
            assert (counts["email"], counts["crm_update"]) == (1, 1), counts
    finally:
        await broker.close()


async def _planned(broker: Broker, client: StackClient, runs: dict[str, str]) -> bool:
    """Each run's email and CRM record tried at least once (so its task was planned and pulled)."""
    tried = {
        (r.run_id, r.tool)
        for r in await _receipts(broker, client)
        if r.attempts >= 1 and r.status == ProjectionStatus.PENDING
    }
    return all(
        (run, tool) in tried for run in runs.values() for tool in ("send_confirmation_email", "update_crm")
    )


async def test_a_paused_projector_replica_is_covered_by_the_other_and_resumed_sends_nothing_twice(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    """projector-0 is paused (SIGSTOP) in the middle of delivering every email (the receiver slow to commit), so
    it holds their claims; past its ack wait projector-1 gets them and delivers; resumed, projector-0 finishes
    its calls, finds the receipts delivered and sends nothing twice."""
    client = await start_stack(env=FAST, scale={"projector": 2})
    stack = client.stack
    broker = await _operator(client)
    first, second = stack.services["projector-0"], stack.services["projector-1"]
    assert first.process is not None and second.process is not None
    try:
        async with supervised(stack):
            # projector-1 paused first, until its outstanding pull requests expire: only projector-0 pulls.
            os.kill(second.process.pid, signal.SIGSTOP)
            try:
                await eventually(
                    lambda: _only_one_asking(broker, client),
                    what="projector-1's pull requests to expire",
                    timeout_s=30,
                )
                await client.arm("emails", commit_delay_ms=2000)
                runs = await _book(client, guests=3)
                await _each_completed_and_paid_once(client, runs)
                await eventually(
                    lambda: _emails_in_flight(client, len(runs)),
                    what="projector-0 to be delivering every email",
                    timeout_s=60,
                )
                # Paused mid-delivery: its claims are no longer renewed; projector-1 takes over past the ack wait.
                os.kill(first.process.pid, signal.SIGSTOP)
                os.kill(second.process.pid, signal.SIGCONT)
                await _projected_once(client, runs, timeout_s=120)
                receipts = await _all_delivered(broker, client, runs)
            finally:
                os.kill(first.process.pid, signal.SIGCONT)
                os.kill(second.process.pid, signal.SIGCONT)
            # Resumed, projector-0's calls come back and its receipts lose to the delivered ones.
            await _quiet(broker, client, ("send_confirmation_email", "update_crm"))
            assert first.process.poll() is None and second.process.poll() is None
        # Each email was delivered on a second delivery of its task (projector-1's, after projector-0's claim).
        emails = [r for r in receipts if r.tool == "send_confirmation_email"]
        assert len(emails) == len(runs) and all(r.attempts >= 2 for r in emails), emails
        after = {r.key: r for r in await _receipts(broker, client)}
        assert all(
            after[r.key].status == ProjectionStatus.DELIVERED for r in emails
        )  # resumed: still delivered
        for guest in runs:
            counts = await client.counts(guest)
            assert (counts["email"], counts["crm_update"]) == (1, 1), counts
        assert first.restarts == 0 and second.restarts == 0
    finally:
        await broker.close()


async def _only_one_asking(broker: Broker, client: StackClient) -> bool:
    """Every projector consumer has exactly one outstanding pull request (one replica's)."""
    ns = client.ns
    infos = [await broker.js.consumer_info(ns.stream(StreamKind.RUNS), ns.projector_planner_consumer)]
    for tool in ("send_confirmation_email", "update_crm"):
        infos.append(
            await broker.js.consumer_info(ns.stream(StreamKind.PROJECTIONS), ns.projection_consumer(tool))
        )
    return all(info.num_waiting == 1 for info in infos)


async def _emails_in_flight(client: StackClient, n: int) -> bool:
    return len([k for k in await client.sandbox.in_flight() if k.startswith("email:")]) >= n
