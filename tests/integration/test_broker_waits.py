"""A wait for a PubAck or a direct get's answer ends on time, typed, however the server stays silent, and an
idle connection keeps no sweeper awake (the waits are swept, not timed one by one)."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.msg import Msg

from crashsafe.contracts.errors import BrokerUnavailable
from crashsafe.contracts.subjects import Namespace
from crashsafe.services.platform.jetstream import Broker
from tests.support.waiting import eventually


async def test_a_publish_nobody_acknowledges_fails_as_unavailable_on_time(
    broker: Broker, namespace: Namespace
) -> None:
    heard: list[Msg] = []

    async def silent(msg: Msg) -> None:
        heard.append(msg)  # a responder that never answers: no 503 from the server, no PubAck either

    subject = f"{namespace.name}.silent"
    sub = await broker.nc.subscribe(subject, cb=silent)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="did not acknowledge"):
            await asyncio.wait_for(broker.publish(subject, b"{}", timeout_s=0.3), 5)  # never a hang
        waited = time.monotonic() - started
        assert 0.3 <= waited < 1.5, waited
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(broker.ask(subject, b"", timeout_s=0.2), 5)
        assert 0.2 <= time.monotonic() - started < 1.5
        assert len(heard) == 2
    finally:
        await sub.unsubscribe()
    # Nothing waits any more: the sweeper ends, and the next wait starts it again.
    await eventually(lambda: broker._sweeper is None, what="the sweeper to end", timeout_s=5.0)
    assert not broker._deadlines and not broker._acks


async def test_a_read_of_a_stream_that_does_not_exist_fails_as_unavailable_at_once(broker: Broker) -> None:
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="did not answer a read"):
        await broker.last_on_subject("NO_SUCH_STREAM_X", "no.such.subject")
    assert time.monotonic() - started < 2.0  # the server's "no responders", not the 10 s wait


async def test_many_waits_at_once_each_get_their_own_answer(broker: Broker, namespace: Namespace) -> None:
    async def echo(msg: Msg) -> None:
        await broker.nc.publish(msg.reply, msg.data)

    subject = f"{namespace.name}.echo"
    sub = await broker.nc.subscribe(subject, cb=echo)
    try:
        answers = await asyncio.gather(*(broker.ask(subject, str(i).encode()) for i in range(200)))
        assert [a.data for a in answers] == [str(i).encode() for i in range(200)]
    finally:
        await sub.unsubscribe()


async def test_a_wait_under_way_when_the_broker_closes_still_ends_on_time(
    nats_server: object, namespace: Namespace
) -> None:
    """close() stops the sweeper; a publish already waiting for its PubAck must still fail on time, typed,
    never wait for ever (a service's shutdown, or whatever awaits that task, would hang)."""
    from crashsafe.contracts.nats_permissions import Role
    from tests.support.nats_users import access

    url = nats_server.url  # type: ignore[attr-defined]
    mine = await Broker.connect(url, "tests-close", access=access(url, Role.OPERATOR))
    listener = await Broker.connect(url, "tests-silent", access=access(url, Role.OPERATOR))
    subject = f"{namespace.name}.silent"

    async def silent(msg: Msg) -> None:
        return None  # never answers

    sub = await listener.nc.subscribe(subject, cb=silent)
    try:
        waiting = asyncio.create_task(mine.publish(subject, b"{}", timeout_s=0.3))
        await asyncio.sleep(0.05)
        await mine.close()
        with pytest.raises(BrokerUnavailable):
            await asyncio.wait_for(waiting, 5)
    finally:
        await sub.unsubscribe()
        await listener.close()


async def test_a_stored_message_with_a_status_header_of_its_own_is_read_as_a_message(
    broker: Broker, namespace: Namespace
) -> None:
    """Only the server's answers carry a status; a message someone stored with a `Status` header is still read."""
    stream = f"{namespace.name}_statuses".upper()
    await broker.js.add_stream(name=stream, subjects=[f"{namespace.name}.statuses.>"], allow_direct=True)
    try:
        subject = f"{namespace.name}.statuses.a"
        await broker.publish(subject, b"kept", headers={"Status": "200"})
        stored = await broker.last_on_subject(stream, subject)
        assert stored is not None and stored.data == b"kept" and stored.headers.get("Status") == "200"
        assert [m.data for m in await broker.read_subject(stream, subject)] == [b"kept"]
        assert await broker.last_on_subject(stream, f"{namespace.name}.statuses.none") is None
    finally:
        await broker.js.delete_stream(stream)
