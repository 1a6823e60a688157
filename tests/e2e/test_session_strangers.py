"""Two guests racing one session id (issue 17, item 6), against a real gateway and runtime: the second guest's
message sent before the first's journal exists is refused before any 202 (`409 session_of_another_guest`), and
every message answered 202 ends as a journaled run or turn; nothing is dead-lettered."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx

from contracts.subjects import Namespace
from services.platform.jetstream import Broker
from tests.support.broker import dead_letters
from tests.support.misbehaving import REGISTRY
from tests.support.stack import StackClient, guest_event
from tests.support.waiting import unique

SESSIONS = 6


async def _post(client: StackClient, event_id: str, guest: str, session: str) -> httpx.Response:
    body = guest_event(event_id, guest_id=guest, session_id=session, text="hello")
    return await client.gateway.post("/v1/events", json=body, params={"agent": "well_behaved"})


async def test_two_guests_racing_one_session_before_any_journal_exists_never_dead_letter_an_accepted_message(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker, namespace: Namespace
) -> None:
    client = await start_stack(executors=("noop",), reconciler=False, projector=False, registry=REGISTRY)
    # No runtime: no journal exists while the guests race (the gateway's check cannot lean on one).
    await asyncio.to_thread(client.stack.kill, "runtime")
    sent: list[tuple[str, str, httpx.Response]] = []  # (event id, guest, answer)
    for n in range(SESSIONS):
        session = unique(f"shared{n}")
        posts = [(unique("ev"), guest) for guest in (unique("ana"), unique("bob"))]
        answers = await asyncio.gather(*(_post(client, e, g, session) for e, g in posts))
        sent += [(e, g, a) for (e, g), a in zip(posts, answers, strict=True)]
        # A later message of each guest, still before any journal: the owner's is a turn, the other's refused.
        for event_id, guest in posts:
            sent.append(
                (f"{event_id}-again", guest, await _post(client, f"{event_id}-again", guest, session))
            )
    statuses = sorted(a.status_code for _, _, a in sent)
    assert statuses == [202] * (2 * SESSIONS) + [409] * (2 * SESSIONS), [a.text for _, _, a in sent]
    for _, _, answer in sent:
        if answer.status_code == 409:
            assert answer.json()["error"]["code"] == "session_of_another_guest", answer.text
    await asyncio.to_thread(client.stack.restart, "runtime")
    # Every 202 ends in a journaled message: a run started by it, or a turn of the run it joined.
    for event_id, guest, answer in sent:
        if answer.status_code != 202:
            continue
        run_id = answer.json()["run_id"]
        summary = await client.wait_terminal(run_id)
        assert summary["status"] == "completed", summary
        events = await client.events(run_id)
        taken = {e.get("event_id") for e in events if e["type"] in ("run.started", "run.turn_received")}
        assert event_id in taken, (event_id, events)
        started = next(e for e in events if e["type"] == "run.started")
        assert started["guest_id"] == guest  # never another guest's run
    assert await dead_letters(broker, namespace) == []
