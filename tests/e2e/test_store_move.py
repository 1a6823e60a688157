"""Issue 17, item 2, through the real stack (gateway, runtime, executors as processes, the sandbox): a partition
whose store moves to an empty one (a StatefulSet pod on a new volume) still knows who made a business key's
effect. A guest pays for a room, opens a new conversation for the same stay and says no to paying again: the
new run hears the hold as the first run's, never releases it, and the provider is not asked for it again.
Item 7 with payment executor replicas as processes: a call a killed replica left in the provider's hands is
waited out by the replica that takes its partitions over with an empty store."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.keys import business_key
from crashsafe.contracts.subjects import Namespace
from crashsafe.contracts.tool_messages import Evidence, first_made_by
from crashsafe.domain.registry import load
from crashsafe.natsd import NatsServer
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.platform.settings import Settings
from tests.support import inprocess
from tests.support.payment_replicas import Payments, Replica, owners, payment_world
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import eventually, unique
from tests.support.world import Sandbox

HOLD = '{"hotel_id": "lis-1", "check_in": "2031-12-01", "check_out": "2031-12-03"}'
PAY = 'obey: create_payment {"booking_id": "$booking_id"}'


@pytest.fixture
async def stack(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[StackClient]:
    async with open_stack(tmp_path / "stack", nats_url=nats_server.url) as client:
        yield client


def _of(events: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    steps = {e["step_no"] for e in events if e["type"] == "run.action_requested" and e["tool"] == tool}
    return [e for e in events if e["type"] == "run.action_completed" and e["step_no"] in steps]


def _maker(completed: dict[str, Any]) -> str | None:
    return first_made_by(msgspec.convert(completed["evidence"], list[Evidence]))


async def test_a_paid_booking_is_never_released_by_a_later_run_after_its_partition_moved_to_an_empty_store(
    stack: StackClient, broker: Broker, tmp_path: Path
) -> None:
    guest = unique("guest")
    first = await stack.submit(f"obey: create_booking {HOLD}\n{PAY}", guest_id=guest)
    assert (await stack.wait_terminal(first))["status"] == "completed"
    (held,) = _of(await stack.events(first), "create_booking")
    booking_id = held["result"]["booking_id"]
    assert (await stack.counts(guest))["charge"] == 1

    # The booking executor dies (SIGKILL) and comes back with its own, empty data directory: its partitions are
    # taken over by a store that never saw the hold's key.
    executor = stack.stack.services["executor-booking"]
    executor.env["CRASHSAFE_DATA_DIR"] = str(tmp_path / "new-volume")
    await asyncio.to_thread(stack.stack.restart, "executor-booking")

    # The guest comes back later (not a wait for anything: past the takeover's clock-skew allowance, a key the
    # new store never saw counts as asked after the takeover), opens a new conversation for the same stay and
    # declines to pay again (the script ends without paying).
    await asyncio.sleep(Settings.clock_skew_s + 1.0)
    again = await stack.submit(f"obey: create_booking {HOLD}", guest_id=guest)
    assert (await stack.wait_terminal(again))["status"] == "completed"
    events = await stack.events(again)
    (asked,) = _of(events, "create_booking")
    assert asked["key"] == held["key"] and asked["result"]["booking_id"] == booking_id
    released = [e for e in events if e["type"] == "run.action_requested" and e["tool"] == "release_booking"]
    assert released == [], f"the second run released a booking the first run paid for ({asked['via']})"
    assert _maker(asked) == first  # the hold is the first run's
    assert asked["via"] == "replay", asked  # answered from what the first store knew, not a provider call

    ledger = await stack.ledger(guest)
    assert (ledger["counts"]["booking"], ledger["counts"]["charge"]) == (1, 1)
    assert ledger["counts"]["booking_release"] == 0
    # The provider was not asked for the key again: once its retention passed, it could not have said it knew it.
    assert ledger["replays"].get("booking", 0) == 0
    # `crashsafe audit`'s check: every effect at the provider is one some run asked for and still stands for.
    settings = inprocess.settings_for(stack.stack.nats_url, stack.ns, sandbox_url=stack.stack.sandbox_url)
    findings, _ = await inprocess.audit(broker, settings)
    assert [(f.kind, f.key) for f in findings] == []
    assert list((tmp_path / "new-volume").glob("*-booking-p*.sqlite3")), (
        "the new volume's stores were not used"
    )


@pytest.fixture
async def payment_replicas(
    nats_server: NatsServer, broker: Broker, namespace: Namespace, tmp_path: Path
) -> AsyncIterator[tuple[Sandbox, Payments, Callable[..., Any]]]:
    async with payment_world(nats_server, broker, namespace, tmp_path) as made:
        yield made


async def test_a_call_in_the_providers_hands_is_waited_out_after_a_takeover_by_an_empty_store(
    payment_replicas: tuple[Sandbox, Payments, Callable[..., Any]], broker: Broker, namespace: Namespace
) -> None:
    """Issue 17, item 7: z sends a charge the provider takes 15 s to commit and is SIGKILLed; b, with its own
    empty data directory, takes the partitions over and its lookup says absent. The time z's call was sent and
    its attempt are facts beside the stores, so b calls again only once the tool's in-flight window from z's
    call has passed (never over it, 409 `idempotency_key_in_use`), and counts on from z's attempt."""
    sandbox, payments, start = payment_replicas
    z = await start("z")
    await eventually(
        lambda: _when(owners(broker, namespace), lambda h: set(h.values()) == {z.worker_id} and len(h) == 4),
        what="z to hold every partition",
        timeout_s=30,
    )
    made = await payments.request(unique("guest"))
    # The charge's business key, as the runtime names it: shared by every run that pays this booking.
    request = msgspec.structs.replace(
        made, key=business_key("charge", "t1", {"booking_id": made.args["booking_id"]})
    )
    await sandbox.arm("payments", commit_delay_ms=15000)
    await payments.publish(request)
    await eventually(lambda: _in_flight(sandbox, request.key), what="z's call in the provider's hands")
    z.proc.kill()
    await z.proc.wait()
    sent_at = _created_at(z, request.key)

    b = await start("b")
    await eventually(
        lambda: _when(owners(broker, namespace), lambda h: set(h.values()) == {b.worker_id} and len(h) == 4),
        what="b to hold every partition",
        timeout_s=30,
    )
    (outcome,) = await eventually(lambda: payments.of(request.key), what="b's outcome", timeout_s=60)
    assert outcome.status == "succeeded", outcome
    assert not [e for e in outcome.evidence if "in progress" in e.detail], "b called over z's call"
    calls = [e.at.timestamp() for e in outcome.evidence if e.asked == "provider.call"]
    window = load(Settings.registry).tools["create_payment"].contract.in_flight_window_s
    assert calls and calls[0] - sent_at >= window, f"b called {calls[0] - sent_at:.1f}s after z's call"
    assert outcome.attempts == 2  # z's attempt, then b's
    assert (await sandbox.ledger())["counts"]["charge"] == 1


def _created_at(replica: Replica, key: str) -> float:
    for path in replica.data_dir.glob("*.sqlite3"):
        with contextlib.closing(sqlite3.connect(path)) as db:
            row = db.execute("SELECT created_at FROM actions WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return float(row[0])
    raise AssertionError(f"{key} has no intent in {replica.data_dir}")


async def _in_flight(sandbox: Sandbox, key: str) -> bool:
    return key in await sandbox.in_flight()


async def _when(value: Any, ok: Callable[[Any], bool]) -> Any:
    got = await value
    return got if ok(got) else None
