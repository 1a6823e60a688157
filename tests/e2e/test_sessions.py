"""Session lanes through the whole stack: messages of one guest session are journaled once each, in one run at a time;
a message while the session's run is active joins it as its next turn; a guest's "yes" reaches the run that asked;
a runtime killed just after journaling a turn handles the turn once."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from crashsafe.contracts.keys import run_id_for
from crashsafe.contracts.policy import Approver
from crashsafe.contracts.run_events import TurnReceived
from crashsafe.domain.call_plan import approval_id_for
from crashsafe.services.platform.jetstream import Broker
from crashsafe.services.records.run_journal import RunJournal
from crashsafe.services.records.session_lane_records import SessionRecords
from tests.support.holds import held_search
from tests.support.runs import started as started_event
from tests.support.stack import StackClient, guest_event, supervised
from tests.support.waiting import eventually, unique
from tests.support.world import BOOKING_TEXT


async def _journals(client: StackClient, run_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for run_id in run_ids:
        response = await client.gateway.get(f"/v1/runs/{run_id}/events")
        if response.status_code == 200:
            out[run_id] = response.json()["events"]
    return out


def _messages(journals: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every guest message the session's runs took: the one each run started with, and each turn."""
    return [
        e["event_id"]
        for events in journals.values()
        for e in events
        if e["type"] in ("run.started", "run.turn_received")
    ]


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["at"])


@pytest.mark.parametrize("paused_s", [0.0, 2.5], ids=["steady", "runtime-paused-past-the-ack-wait"])
async def test_concurrent_messages_of_one_session_are_taken_once_each_by_one_run_at_a_time(
    start_stack: Callable[..., Awaitable[StackClient]], paused_s: float
) -> None:
    """Paused: the runtime is stopped (SIGSTOP, as a long GC pause or a starved VM would) with the messages in
    hand, past the ack wait, so each comes again while its first delivery is queued behind the session's others,
    and the session's run may end between the two."""
    client = await start_stack()
    session, guest = unique("s"), unique("g")
    bodies = [
        guest_event(
            unique("m"), guest_id=guest, session_id=session, text=BOOKING_TEXT if i == 0 else f"also {i}"
        )
        for i in range(8)
    ]
    responses = await asyncio.gather(*(client.gateway.post("/v1/events", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [202] * 8, [r.text for r in responses]
    if paused_s:
        runtime = client.stack.services["runtime"].process
        assert runtime is not None
        runtime.send_signal(signal.SIGSTOP)
        await asyncio.sleep(paused_s)
        runtime.send_signal(signal.SIGCONT)
    answers = [r.json() for r in responses]
    owners = {a["run_id"] for a in answers if not a.get("turn")}
    joined = {a["run_id"] for a in answers if a.get("turn")}
    assert len(owners) >= 1 and joined <= owners | joined
    candidates = {run_id_for(client.tenant, b["event_id"]) for b in bodies}

    async def settled() -> dict[str, list[dict[str, Any]]] | None:
        journals = await _journals(client, candidates)
        ended = all(
            any(e["type"] in ("run.completed", "run.handed_off") for e in ev) for ev in journals.values()
        )
        # Every message somewhere and every run ended; how many times each was taken is asserted below, so a
        # message taken twice fails there, naming it, rather than leaving this wait to time out.
        return journals if set(_messages(journals)) == {b["event_id"] for b in bodies} and ended else None

    journals = await eventually(
        settled, what="all 8 messages journaled and the session's runs ended", timeout_s=120
    )
    taken = _messages(journals)
    twice = sorted({m for m in taken if taken.count(m) > 1})
    assert not twice and len(taken) == 8, f"each message exactly once; taken more than once: {twice}"
    # A message answered as a turn of run A is in A's journal, or its own run's (A had ended first, the session was
    # free), or in another message's run that took the session over: only once A had ended (or never started: its
    # gateway claimed the session and another message took it over before A's own arrived). Never moved away from
    # a run still active.
    for body, answer in zip(bodies, answers, strict=True):
        holder = next(r for r, ev in journals.items() if body["event_id"] in _messages({r: ev}))
        if answer.get("turn") and holder not in (
            answer["run_id"],
            run_id_for(client.tenant, body["event_id"]),
        ):
            taken_at = next(_at(e) for e in journals[holder] if e.get("event_id") == body["event_id"])
            hinted = journals.get(answer["run_id"], [])
            ends = [_at(e) for e in hinted if e["type"] in ("run.completed", "run.handed_off")]
            assert not hinted or ends[0] <= taken_at, (body["event_id"], answer["run_id"], holder)
        # A retry answers with the run that holds it: its own, or the one that took it as a turn.
        again = await client.gateway.post("/v1/events", json=body)
        assert again.status_code == 202 and again.json()["duplicate"] is True
        assert again.json()["run_id"] == holder, (body["event_id"], answer, again.json())
    # One run owns the session at a time: each run of the session starts after the one before it ended.
    spans = sorted(
        (ev[0]["at"], next(e["at"] for e in ev if e["type"] in ("run.completed", "run.handed_off")))
        for ev in journals.values()
    )
    for (_, ended), (begun, _) in zip(spans, spans[1:], strict=False):
        assert begun >= ended


async def test_a_retried_turn_is_answered_with_the_run_that_took_it_not_the_one_first_named(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    """The gateway answers a turn with the session's run as it sees it; the runtime decides when it takes the
    message, and the lane may have changed hands by then (the first run ended, another message's run owns it).
    A retry answers where the message is now, as its turn mark and that run's journal say."""
    client = await start_stack()
    runtime = client.stack.services["runtime"].process
    assert runtime is not None
    sessions, journal = SessionRecords(broker, client.ns), RunJournal(broker, client.ns)
    session, guest = unique("s"), unique("g")

    async def started(key: str) -> str:
        """A run of the session's guest, journaled as the runtime starts one (nothing drives it: the runtime is
        stopped for the whole test)."""
        run_id = run_id_for(client.tenant, key)
        first_event = msgspec.structs.replace(
            started_event(at=datetime.now(UTC)),
            run_id=run_id,
            session_id=session,
            guest_id=guest,
            event_id=key,
            idempotency_key=key,
            tenant=client.tenant,
        )
        await journal.append(first_event, 0)
        return run_id

    runtime.send_signal(signal.SIGSTOP)
    try:
        first = await started(unique("first"))
        assert await sessions.claim(client.tenant, session, first, guest) == first
        body = guest_event(unique("m"), guest_id=guest, session_id=session, text="also a quiet room")
        answer = (await client.gateway.post("/v1/events", json=body)).json()
        assert (answer["run_id"], answer["turn"], answer["duplicate"]) == (first, True, False)
        again = (await client.gateway.post("/v1/events", json=body)).json()
        assert (again["run_id"], again["duplicate"]) == (first, True)  # not taken yet: as the first answer
        # As the runtime leaves it when the first run ended before it took the message, and the session's next
        # run took it as its turn (marked first, then journaled).
        second = await started(unique("second"))
        await sessions.change(
            client.tenant, session, lambda lane: msgspec.structs.replace(lane, run_id=second)
        )
        message_run = run_id_for(client.tenant, body["event_id"])
        await sessions.mark_turn(client.tenant, message_run, second)
        seq = (await journal.read(second))[1]
        await journal.append(
            TurnReceived(run_id=second, at=datetime.now(UTC), event_id=body["event_id"], text=body["text"]),
            seq,
        )
        again = (await client.gateway.post("/v1/events", json=body)).json()
        assert again == {"run_id": second, "duplicate": True, "turn": True, "event_run_id": message_run}
    finally:
        runtime.send_signal(signal.SIGCONT)


async def _guest_hold(client: StackClient, broker: Broker) -> tuple[str, str, str]:
    """A run of the stack's tenant whose hotel search waits for the guest's own confirmation: (run, session, guest)."""
    session, guest = unique("s"), unique("g")
    claimed = SessionRecords(broker, client.ns)
    run_id, _ = await held_search(
        client,
        broker,
        approver=Approver.GUEST.value,
        ttl_s=3600.0,
        question="Shall I search?",
        session=session,
        guest=guest,
        claim=lambda run: claimed.claim(client.tenant, session, run),
    )
    return run_id, session, guest


async def test_the_guests_yes_reaches_the_run_that_asked_across_a_runtime_killed_after_the_turn(
    start_stack: Callable[..., Awaitable[StackClient]], broker: Broker
) -> None:
    client = await start_stack(crash={"runtime": "runtime.after_turn_journaled"})
    run_id, session, guest = await _guest_hold(client, broker)

    async def recorded() -> bool:
        response = await client.gateway.get(f"/v1/approvals/{approval_id_for(run_id, 2)}")
        return response.status_code == 200 and response.json()["status"] == "pending"

    await eventually(recorded, what="the approval's record")
    async with supervised(client.stack):
        yes = guest_event(unique("yes"), guest_id=guest, session_id=session, text="yes")
        response = await client.gateway.post("/v1/events", json=yes)
        assert response.status_code == 202 and response.json() == {
            "run_id": run_id,
            "duplicate": False,
            "turn": True,
            "event_run_id": run_id_for(client.tenant, yes["event_id"]),
        }
        ended = await client.wait_terminal(run_id, timeout_s=120)
    assert client.stack.services["runtime"].restarts >= 1, "the runtime died after journaling the turn"
    events = await client.events(run_id)
    assert [e["event_id"] for e in events if e["type"] == "run.turn_received"] == [yes["event_id"]]
    (decided,) = [e for e in events if e["type"] == "run.approval_decided"]
    assert decided["decision"] == "approved" and decided["turn_event_id"] == yes["event_id"]
    assert ended["outcome"] == "completed"
    assert [e["tool"] for e in events if e["type"] == "run.action_requested"][0] == "search_hotels"
    # The "yes" started no run of its own.
    assert await client.summary(run_id_for(client.tenant, yes["event_id"])) is None
