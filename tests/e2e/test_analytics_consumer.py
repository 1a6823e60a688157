"""The analytics example against a live stack: its bookings and revenue equal the sandbox's ledger, a killed and
restarted consumer and a second run on the same durable count nothing twice, and its credentials read only."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from crashsafe.contracts.errors import NotPermitted
from crashsafe.contracts.nats_permissions import Role
from crashsafe.contracts.subjects import EventClass, Namespace, StreamKind
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import NatsAccess
from tests.support.paths import ROOT
from tests.support.stack import StackClient, operator_access
from tests.support.waiting import eventually, unique

HOLD = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}'
PAY = 'obey: create_payment {"booking_id": "$booking_id"}'
BOOK_AND_PAY = f"obey: create_booking {HOLD}\n{PAY}"
DURABLE = "analytics_e2e"


def _command(client: StackClient, state: Path, *extra: str) -> list[str]:
    creds = client.stack.creds_for(Role.ANALYTICS.value)
    assert creds is not None, "the test stack runs with NATS users on"
    return [
        sys.executable,
        "-m",
        "crashsafe.examples.analytics",
        "--url",
        client.stack.nats_url,
        "--creds",
        str(creds),
        "--namespace",
        client.stack.namespace,
        "--durable",
        DURABLE,
        "--state",
        str(state),
        "--json",
        *extra,
    ]


async def _run(client: StackClient, state: Path) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *_command(client, state), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    # A hang guard, not a speed check: after the follower's SIGKILL its unacknowledged deliveries come back only
    # when their ack wait (30 s) runs out, and a drain waits for them; on a loaded machine that took over 60 s.
    out, err = await asyncio.wait_for(process.communicate(), timeout=150)
    return process.returncode or 0, out.decode(), err.decode()


async def _consume(client: StackClient, state: Path) -> list[dict[str, Any]]:
    """One run of the consumer to the end of the stream: its JSON lines (the hours, then the total)."""
    returncode, out, err = await _run(client, state)
    assert returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _ledger_figures(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What the providers' own books say: holds, releases, charges, refunds, and money per currency."""
    kinds = [e["kind"] for e in entries]
    revenue: dict[str, int] = {}
    for e in entries:
        sign = {"charge": 1, "refund": -1}.get(e["kind"], 0)
        if sign:
            revenue[e["currency"]] = revenue.get(e["currency"], 0) + sign * e["amount_cents"]
    return {
        "bookings": kinds.count("booking"),
        "released": kinds.count("booking_release"),
        "payments": kinds.count("charge"),
        "refunds": kinds.count("refund"),
        "revenue_cents": dict(sorted(revenue.items())),
    }


def _consumer_figures(total: dict[str, Any]) -> dict[str, Any]:
    return {k: total[k] for k in ("bookings", "released", "payments", "refunds", "revenue_cents")}


async def _settled(client: StackClient, run_id: str) -> None:
    """The run ended and nothing of it is still open (its last receipt is journaled)."""

    async def done() -> bool:
        summary = await client.summary(run_id)
        return bool(summary and summary["status"] != "running" and not summary["pending_actions"])

    await eventually(done, what=f"run {run_id} to end with nothing pending", timeout_s=90)


async def test_the_consumers_figures_equal_the_ledger_and_survive_a_kill_and_a_second_run(
    start_stack: Callable[..., Awaitable[StackClient]], tmp_path: Path
) -> None:
    client = await start_stack()
    state = tmp_path / "figures.json"
    # A consumer following live events from before the first booking; killed with SIGKILL half-way.
    follower = await asyncio.create_subprocess_exec(
        *_command(client, state, "--follow"),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    ns = Namespace(client.stack.namespace)
    operator = await Broker.connect(
        client.stack.nats_url, "tests-inject", access=operator_access(client.stack)
    )

    async def attached() -> bool:
        try:
            await operator.js.consumer_info(ns.stream(StreamKind.RUNS), DURABLE)
        except nats.js.errors.NotFoundError:
            return False
        return True

    try:
        await eventually(attached, what="the follower to create its durable")
        # The follower is killed as soon as it has saved its first figures: the first run's events are still
        # being journaled (and delivered to it), the other runs not even asked for.
        first = await client.submit(BOOK_AND_PAY, guest_id=unique("guest"))
        await eventually(lambda: state.exists(), what="the follower to save its first figures")
    finally:
        if follower.returncode is None:
            follower.send_signal(signal.SIGKILL)
        await follower.wait()
    submitted = [client.submit(BOOK_AND_PAY, guest_id=unique("guest")) for _ in range(2)]
    # The same hold asked twice in one run: two receipts in the journal, one hold in the ledger.
    submitted.append(client.submit(f"obey: create_booking {HOLD}\n{BOOK_AND_PAY}", guest_id=unique("guest")))
    *others, twice = await asyncio.gather(*submitted)
    paid = [first, *others]
    killed_at = json.loads(state.read_text())["figures"]
    for run_id in [*paid, twice]:
        await _settled(client, run_id)

    # A declined charge (its hold released by the runtime's compensation), and a refund by the support agent.
    await client.arm("payments", decline=1)
    declined = await client.submit(BOOK_AND_PAY, guest_id=unique("guest"))
    await _settled(client, declined)
    first_payment = next(
        e
        for e in await client.events(paid[0])
        if e["type"] == "run.action_completed" and "payment_id" in e.get("result", {})
    )
    refund = (
        "obey: find_payments {}\n"
        f'obey: refund_payment {{"payment_id": "{first_payment["result"]["payment_id"]}", "amount_cents": 500}}'
    )
    guest_of_first = (await client.events(paid[0]))[0]["guest_id"]
    support = await client.submit(refund, guest_id=guest_of_first, agent="support")
    await _settled(client, support)

    # A hostile journal: an event type no version knows, and bytes that are no event at all.
    try:
        await operator.publish(
            ns.run_event("hostile", EventClass.STEP),
            b'{"type":"run.from_the_future","run_id":"hostile","at":"2031-01-01T00:00:00Z"}',
        )
        await operator.publish(ns.run_event("hostile", EventClass.STEP), b"\x00 not an event")
    finally:
        await operator.close()

    entries = (await client.ledger())["entries"]
    books = _ledger_figures(entries)
    assert (books["bookings"], books["released"], books["payments"], books["refunds"]) == (5, 1, 4, 1), books

    first = await _consume(client, state)
    total = first[-1]
    assert total["hour"] == "total"
    assert _consumer_figures(total) == books
    assert total["declined"] == 1
    # Every hour the consumer reports is the hour of a receipt in the journal.
    journaled_hours = set()
    for run_id in [*paid, twice, declined, support]:
        for e in await client.events(run_id):
            if e["type"] == "run.action_completed":
                journaled_hours.add(e["at"][:13] + ":00Z")
    assert {row["hour"] for row in first[:-1]} <= journaled_hours

    # The follower had folded at most the first run's hold and charge; the restart counted the rest, and what
    # the follower had folded, once.
    assert len(killed_at["settled"]) <= 2, killed_at["settled"]

    # The same durable again: nothing new, nothing counted twice.
    again = await _consume(client, state)
    assert again == first
    # The durable without its state file is refused: its figures would start from the middle of the stream.
    returncode, out, err = await _run(client, tmp_path / "elsewhere.json")
    assert returncode != 0 and "has acknowledged events" in err and not out, (returncode, out, err)


async def test_the_analytics_credentials_cannot_publish_or_purge(
    start_stack: Callable[..., Awaitable[StackClient]],
) -> None:
    client = await start_stack()
    run_id = await client.submit(BOOK_AND_PAY, guest_id=unique("guest"))
    await _settled(client, run_id)
    ns = Namespace(client.stack.namespace)
    runs = ns.stream(StreamKind.RUNS)
    creds = client.stack.creds_for(Role.ANALYTICS.value)
    analytics = await Broker.connect(client.stack.nats_url, "analytics", access=NatsAccess(creds=creds))
    operator = await Broker.connect(
        client.stack.nats_url, "tests-count", access=operator_access(client.stack)
    )
    try:
        before = (await operator.js.stream_info(runs)).state.messages
        assert before > 0
        # It reads: the stream's info and a direct get of the run's journal.
        assert (await analytics.js.stream_info(runs)).state.messages == before
        assert await analytics.last_on_subject(runs, ns.run_events(run_id)) is not None
        with pytest.raises(NotPermitted):
            await analytics.publish(
                ns.run_event(run_id, EventClass.STEP), b'{"type":"run.completed"}', timeout_s=5
            )
        with pytest.raises(NotPermitted):
            await analytics.publish(ns.inbound("r-forged"), b"{}", timeout_s=5)
        js = analytics.nc.jetstream(timeout=1)
        with pytest.raises(nats.errors.TimeoutError):  # refused: the API never sees the request
            await js.purge_stream(runs)
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(runs)
        with pytest.raises(nats.errors.TimeoutError):  # nor may it remove another's consumer
            await js.delete_consumer(runs, "projector_planner")
        assert (await operator.js.stream_info(runs)).state.messages == before
    finally:
        await analytics.close()
        await operator.close()
