"""Issue 17, item 2, through the real stack (gateway, runtime, executors as processes, the sandbox): a partition
whose store moves to an empty one (a StatefulSet pod on a new volume) still knows who made a business key's
effect. A guest pays for a room, opens a new conversation for the same stay and says no to paying again: the
new run hears the hold as the first run's, never releases it, and the provider is not asked for it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from contracts.tool_messages import Evidence, first_made_by
from services.platform.natsd import NatsServer
from services.platform.settings import Settings
from tests.support.stack import StackClient, open_stack
from tests.support.waiting import unique

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
    stack: StackClient, tmp_path: Path
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
    assert list((tmp_path / "new-volume").glob("*-booking-p*.sqlite3")), (
        "the new volume's stores were not used"
    )
